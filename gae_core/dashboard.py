"""What the dashboard pages need from the library, without Streamlit: the config form's field
specs and validation, run status text, progress and ETA, and the runs table.

Pages stay thin: they draw widgets from :func:`form_fields`, call :func:`build_config` and
show what it returns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gae_core.config import ConfigError, TrainConfig
from gae_core.store import RunRecord

#: Charts of the live training view, in order (store metric keys).
LIVE_METRICS = (
    "charts/episodic_return",
    "charts/episodic_length",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/explained_variance",
    "perf/steps_per_second",
)

#: Fields shown first in the form; the rest go under "Advanced".
MAIN_FIELDS = ("env_id", "total_steps", "gamma", "lambda_", "seed", "num_envs", "rollout_steps")


@dataclass(frozen=True)
class FieldSpec:
    """One form widget: derived from the TrainConfig field's default and metadata."""

    name: str
    kind: str  # "choice", "bool", "int", "float", "int_list"
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def label(self) -> str:
        return {"lambda_": "λ (lambda)", "gamma": "γ (gamma)", "env_id": "environment"}.get(
            self.name, self.name.replace("_", " ")
        )


def form_fields() -> list[FieldSpec]:
    """One :class:`FieldSpec` per ``TrainConfig`` field, main fields first."""
    specs = []
    for f in dataclasses.fields(TrainConfig):
        default, meta = f.default, f.metadata
        if meta.get("choices"):
            kind = "choice"
        elif isinstance(default, bool):
            kind = "bool"
        elif isinstance(default, int):
            kind = "int"
        elif isinstance(default, float):
            kind = "float"
        elif isinstance(default, tuple):
            kind = "int_list"
        else:  # pragma: no cover - a new field type needs a widget
            raise TypeError(f"no form widget for field {f.name} ({type(default).__name__})")
        specs.append(
            FieldSpec(
                name=f.name,
                kind=kind,
                default=default,
                help=meta.get("help", ""),
                min=meta.get("min"),
                max=meta.get("max"),
                choices=tuple(meta["choices"]) if meta.get("choices") else None,
            )
        )
    order = {name: i for i, name in enumerate(MAIN_FIELDS)}
    return sorted(specs, key=lambda s: order.get(s.name, len(order)))


def parse_int_list(text: str, name: str = "hidden_sizes") -> tuple[int, ...]:
    """``"64, 64"`` → ``(64, 64)``; a clear ConfigError otherwise."""
    parts = [p.strip() for p in str(text).replace(";", ",").split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"{name} must be comma-separated positive integers such as '64, 64', got {text!r}"
        ) from None


def build_config(values: dict[str, Any]) -> tuple[TrainConfig | None, list[str], list[str]]:
    """Validate form values: ``(config or None, errors, warnings)``.

    Errors make the config unusable (the Start button stays disabled); warnings explain
    combinations that are valid but probably not what the user wants.
    """
    values = dict(values)
    try:
        if isinstance(values.get("hidden_sizes"), str):
            values["hidden_sizes"] = parse_int_list(values["hidden_sizes"])
        config = TrainConfig(**values)
    except ConfigError as error:
        return None, [str(error)], []
    except TypeError as error:  # unknown field from a stale form
        return None, [str(error)], []
    return config, [], config_warnings(config)


def config_warnings(config: TrainConfig) -> list[str]:
    warnings = []
    if config.batch_size > config.total_steps:
        warnings.append(
            f"total_steps ({config.total_steps:,}) is smaller than one update "
            f"(num_envs × rollout_steps = {config.batch_size:,}): the run will do one update."
        )
    if config.checkpoint_every and config.checkpoint_every > config.total_steps:
        warnings.append(
            f"checkpoint_every ({config.checkpoint_every:,}) exceeds total_steps: only the final "
            "checkpoint will be saved, so the explorer will have one checkpoint to compare."
        )
    if config.record_episodes == 0:
        warnings.append("record_episodes is 0: no trajectories for the advantage explorer.")
    if config.gamma == 1.0 and config.lambda_ == 1.0:
        warnings.append(
            "γ = λ = 1: undiscounted Monte Carlo advantages, the highest-variance setting."
        )
    return warnings


# ----------------------------------------------------------------------------- run state


def status_text(run: RunRecord) -> str:
    """One line a user reads: the state and, where it applies, solved / error / ETA."""
    summary = run.summary
    if run.status == "finished":
        if summary.solved:
            return f"finished: solved at step {summary.solved_at_step:,}"
        if summary.solved is False:
            return "finished: not solved"
        return "finished"
    if run.status == "failed":
        reason = (run.error or "unknown error").strip().splitlines()
        return f"failed: {reason[-1] if reason else 'unknown error'}"
    if run.status == "interrupted":
        return "interrupted: its process ended before the run did (data up to then is kept)"
    if run.status == "stopped":
        return f"stopped at step {run.env_steps:,}"
    return run.status


def progress(run: RunRecord, now: float | None = None) -> tuple[float, float | None]:
    """``(fraction done, seconds left or None)``; the ETA assumes the rate so far."""
    total = int(run.config.get("total_steps", 0)) or 1
    fraction = min(1.0, run.env_steps / total)
    if run.status != "running" or run.started_at is None or run.env_steps <= 0:
        return fraction, None
    elapsed = (now if now is not None else time.time()) - run.started_at
    rate = run.env_steps / elapsed if elapsed > 0 else 0.0
    return fraction, (total - run.env_steps) / rate if rate > 0 else None


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


RUN_TABLE_COLUMNS = (
    "run_id",
    "name",
    "env",
    "lambda",
    "gamma",
    "seed",
    "status",
    "env_steps",
    "best_return",
    "final_return",
    "solved_at_step",
    "started",
    "duration_s",
    "sweep_id",
)


def runs_table(runs: list[RunRecord]) -> pd.DataFrame:
    """The Runs page table: one row per run with the columns of :data:`RUN_TABLE_COLUMNS`;
    returns are means over the last 100 episodes (best: the best such mean during training)."""
    rows = []
    for run in runs:
        started = (
            dt.datetime.fromtimestamp(run.started_at).strftime("%Y-%m-%d %H:%M:%S")
            if run.started_at
            else None
        )
        rows.append(
            {
                "run_id": run.id,
                "name": run.name,
                "env": run.config.get("env_id"),
                "lambda": run.config.get("lambda_"),
                "gamma": run.config.get("gamma"),
                "seed": run.config.get("seed"),
                "status": run.status,
                "env_steps": run.env_steps,
                "best_return": run.summary.best_return,
                "final_return": run.summary.final_return,
                "solved_at_step": run.summary.solved_at_step,
                "started": started,
                "duration_s": run.wall_seconds,
                "sweep_id": run.sweep_id,
            }
        )
    return pd.DataFrame(rows, columns=list(RUN_TABLE_COLUMNS))


def filter_runs(
    table: pd.DataFrame,
    *,
    statuses: list[str] | None = None,
    envs: list[str] | None = None,
    text: str = "",
) -> pd.DataFrame:
    """Rows whose status and env are among those given (all when None) and whose name or id
    contains ``text`` (case-insensitive)."""
    keep = pd.Series(True, index=table.index)
    if statuses:
        keep &= table["status"].isin(statuses)
    if envs:
        keep &= table["env"].isin(envs)
    if text.strip():
        needle = text.strip().lower()
        keep &= table["name"].str.lower().str.contains(needle, regex=False) | table[
            "run_id"
        ].str.lower().str.contains(needle, regex=False)
    return table[keep]


def parse_float_list(text: str, name: str, low: float = 0.0, high: float = 1.0) -> list[float]:
    """``"0.9, 0.95, 1"`` → ``[0.9, 0.95, 1.0]`` (duplicates dropped, order kept); a ConfigError
    naming ``name`` and the range otherwise."""
    parts = [p.strip() for p in str(text).replace(";", ",").split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(
            f"{name} must be comma-separated numbers in [{low:g}, {high:g}]"
        ) from None
    if not values:
        raise ConfigError(f"{name} needs at least one value in [{low:g}, {high:g}]")
    bad = [v for v in values if not low <= v <= high]
    if bad:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {bad}")
    return list(dict.fromkeys(values))


def episodes_frame(store: Any, run_ids: list[str], group: str) -> pd.DataFrame:
    """Long frame ``<group>, seed, run_id, env_step, return`` of finished episodes of the runs,
    ``group`` being a config field (``lambda_`` for the λ comparison)."""
    parts = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        metrics = store.metrics(run_id, ["charts/episodic_return"])
        if metrics.empty:
            continue
        parts.append(
            pd.DataFrame(
                {
                    group: run.config.get(group),
                    "seed": run.config.get("seed"),
                    "run_id": run_id,
                    "env_step": metrics["env_step"].to_numpy(),
                    "return": metrics["value"].to_numpy(),
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=[group, "seed", "run_id", "env_step", "return"])
    return pd.concat(parts, ignore_index=True)
