"""A run as a table row: the one set of columns that the Runs page, ``runs --json``,
``train --json``, ``sweep --json`` and every runs CSV share.

Data keeps one spelling per column (``lambda_``, ``env_id``); pages relabel columns for display
with :func:`gae_core.labels.label` only.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd

from gae_core.labels import stored_algo
from gae_core.storage.database import finite_or_none
from gae_core.storage.records import RunRecord

__all__ = ["RUN_COLUMNS", "run_row", "runs_frame"]

#: Columns of :func:`run_row`, in display order.
RUN_COLUMNS = (
    "run_id",
    "name",
    "algo",
    "env_id",
    "lambda_",
    "gamma",
    "seed",
    "status",
    "env_steps",
    "total_steps",
    "episodes",
    "best_return",
    "final_return",
    "reward_threshold",
    "solved",
    "solved_at_step",
    "fell_below_at_step",
    "stayed_solved",
    "started_at",
    "wall_seconds",
    "steps_per_second",
    "sweep_id",
    "error",
)


def _timestamp(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds).isoformat(timespec="seconds")


def run_row(run: RunRecord) -> dict[str, Any]:
    """One JSON-safe row (None for missing or non-finite values) with :data:`RUN_COLUMNS`."""
    summary = run.summary
    wall = run.wall_seconds
    config = run.config
    return {
        "run_id": run.id,
        "name": run.name,
        "algo": stored_algo(config),
        "env_id": config.get("env_id"),
        "lambda_": config.get("lambda_"),
        "gamma": config.get("gamma"),
        "seed": config.get("seed"),
        "status": run.status,
        "env_steps": run.env_steps,
        "total_steps": config.get("total_steps"),
        "episodes": summary.episodes,
        "best_return": finite_or_none(summary.best_return),
        "final_return": finite_or_none(summary.final_return),
        "reward_threshold": finite_or_none(summary.reward_threshold),
        "solved": summary.solved,
        "solved_at_step": summary.solved_at_step,
        "fell_below_at_step": summary.fell_below_at_step,
        "stayed_solved": summary.stayed_solved,
        "started_at": _timestamp(run.started_at),
        "wall_seconds": wall,
        "steps_per_second": (run.env_steps / wall) if wall else None,
        "sweep_id": run.sweep_id,
        "error": run.damaged or run.error,
    }


#: Columns of whole numbers and of numbers that a run may not have (yet): typed, so a column in
#: which no run has a value is empty in a table and a CSV, not a column of "None" objects.
_INTEGERS = ("seed", "env_steps", "total_steps", "episodes", "solved_at_step",
             "fell_below_at_step")  # fmt: skip
_FLOATS = ("lambda_", "gamma", "best_return", "final_return", "reward_threshold",
           "wall_seconds", "steps_per_second")  # fmt: skip


def runs_frame(runs: list[RunRecord]) -> pd.DataFrame:
    """:func:`run_row` of each run as a DataFrame with exactly :data:`RUN_COLUMNS`, numbers
    typed (nullable integers, floats with NaN) whether or not any run has them."""
    frame = pd.DataFrame([run_row(run) for run in runs], columns=list(RUN_COLUMNS))
    for column in _INTEGERS:
        frame[column] = frame[column].astype("Int64")
    for column in _FLOATS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    return frame
