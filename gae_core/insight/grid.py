"""Two-axis studies (λ × γ, or any two config fields): per cell of the grid, one score's IQM
and mean across seeds with bootstrap intervals, the best cell, and the cells whose interval
overlaps the best one's ("not distinguishable" from it at this number of seeds). This is the data
of the GAE paper's γ × λ figure (Schulman et al., 2016, fig. 2); the compare page draws it as a
heat map (:func:`gae_core.insight.compare_figures.grid_figure`) and ``summary`` prints it.

A cell's replicate is a seed, as in :mod:`gae_core.insight.compare`: a seed's runs in one cell
(a third, pooled axis) count once, as their mean.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gae_core.insight import stats
from gae_core.insight.compare import (
    CURVE_POINTS,
    REPLICATE,
    ListValue,
    run_scores,
    seed_scores,
)
from gae_core.outcome import SOLVED_WINDOW

#: The grid's scores: what each is, and whether higher is better.
SCORES: dict[str, tuple[str, bool]] = {
    "final_return": (f"final return (mean of the last {SOLVED_WINDOW} episodes)", True),
    "auc": ("AUC (average return over training: how fast it learned)", True),
    "steps_to_threshold": (
        "env steps to the env's threshold (a run that never reached it counts at the study's "
        "last episode, the longest run's end: a run stopped early cannot look fast; the "
        "solved share says how often that happened)",
        False,
    ),
}
#: The column a two-axis study groups by: one :class:`Cell` per (x, y).
CELL = "cell"
#: What the markers on the grid mean, on the page, in the CSV's columns and in ``summary``.
MARKS = {
    "best": "★ best cell (highest IQM; lowest for steps; ties share it)",
    "not_distinguishable": "≈ its interval overlaps the best cell's: not distinguishable from "
    "it at this number of seeds",
}


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    """One cell of a two-axis grid: the values of its two fields."""

    x: Any
    y: Any


def study_axes(grid: Mapping[str, Any]) -> tuple[str, str | None]:
    """What a sweep's statistics group by: λ when it is a grid axis, else the first axis other
    than the seed (seeds are what each group's statistics are taken over), else λ (one group);
    and the second axis of a two-axis study (the next non-seed axis), or None."""
    axes = [axis for axis in grid if axis != "seed"]
    first = "lambda_" if "lambda_" in grid else (axes[0] if axes else "lambda_")
    return first, next((axis for axis in axes if axis != first), None)


def check_axes(x: str, y: str) -> None:
    """ValueError naming the field when the two axes are one field or the seed."""
    if x == y:
        raise ValueError(f"second axis must differ from the first ({x}), got {y}")
    if REPLICATE in (x, y):
        raise ValueError("second axis: seeds are what each cell's statistics are taken over")


def cell_table(
    episodes: pd.DataFrame,
    x: str,
    y: str,
    *,
    score: str = "final_return",
    threshold: float | None = None,
    final_window: int = SOLVED_WINDOW,
    points: int = CURVE_POINTS,
    seed: int = stats.BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """One row per cell, in (x, y) order: ``<x>, <y>, score, seeds, runs, iqm, iqm_ci_low,
    iqm_ci_high, mean, mean_ci_low, mean_ci_high`` (across seeds, percentile bootstrap),
    ``solved_fraction`` with a threshold, ``best`` and ``not_distinguishable`` (:data:`MARKS`).

    ``episodes`` is :func:`~gae_core.insight.compare.episodes_frame` with ``also=(y,)``.
    ``score`` is one of :data:`SCORES`; ``steps_to_threshold`` needs a ``threshold``."""
    check_axes(x, y)
    if episodes.empty:
        raise ValueError("episodes is empty: no finished episode to score")
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if score == "steps_to_threshold" and threshold is None:
        raise ValueError("score steps_to_threshold needs the env's reward threshold; it has none")
    frame = episodes.assign(
        **{CELL: [Cell(a, b) for a, b in zip(episodes[x], episodes[y], strict=True)]}
    )
    runs = run_scores(frame, group=CELL, threshold=threshold, final_window=final_window)
    if threshold is not None:  # never solved: censored at the study's end (its last episode)
        runs["steps_to_threshold"] = runs["solved_at_step"].fillna(float(frame["env_step"].max()))
    scores = seed_scores(frame, group=CELL, points=points, runs=runs)
    if score == "steps_to_threshold":
        scores = scores.merge(
            runs.groupby([CELL, REPLICATE], sort=True)[score].mean().reset_index(), how="left"
        )
    table = stats.group_summary(scores, CELL, [score], seed=seed)
    table.columns = [c.removeprefix(f"{score}_") for c in table.columns]
    table.insert(0, x, [c.x for c in table[CELL]])
    table.insert(1, y, [c.y for c in table[CELL]])
    table.insert(2, "score", score)
    table.insert(5, "runs", runs.groupby(CELL, sort=True).size().to_numpy())
    if threshold is not None:
        solved = runs.groupby(CELL, sort=True)["solved_at_step"]
        table["solved_fraction"] = solved.apply(lambda s: float(s.notna().mean())).to_numpy()
    # a cell none of whose runs reached the threshold scores the study's end (censored): a
    # value of the study's length, not of the cell, so it is never best
    ranked = table["solved_fraction"].to_numpy() > 0 if score == "steps_to_threshold" else None
    _mark(table, higher=SCORES[score][1], ranked=ranked)
    return table.drop(columns=CELL)


def _mark(table: pd.DataFrame, *, higher: bool, ranked: np.ndarray | None = None) -> None:
    sign = 1.0 if higher else -1.0
    key = np.column_stack([sign * table["iqm"], sign * table["mean"]])
    finite = np.isfinite(key).all(axis=1)
    if ranked is not None:
        finite &= ranked
    table["best"] = False
    table["not_distinguishable"] = False
    if not finite.any():
        return
    order = np.lexsort((key[finite, 1], key[finite, 0]))
    top = key[finite][order[-1]]
    best = finite & np.isclose(key, top, rtol=0, atol=1e-9).all(axis=1)
    first = int(np.flatnonzero(best)[0])
    low, high = table["iqm_ci_low"].iloc[first], table["iqm_ci_high"].iloc[first]
    overlaps = (table["iqm_ci_low"] <= high) & (table["iqm_ci_high"] >= low)
    table["best"] = best
    # an interval where a cell has two or more scores (one seed, or its other seeds' scores
    # missing: NaN bounds): without one, nothing can be told apart
    with_interval = np.isfinite(table[["iqm_ci_low", "iqm_ci_high"]].to_numpy()).all(axis=1)
    if not with_interval[first]:
        return
    table["not_distinguishable"] = (~best) & finite & with_interval & overlaps.to_numpy()


def cell_records(table: pd.DataFrame, x: str, y: str) -> list[dict[str, Any]]:
    """The grid as JSON-ready entries (``summary --json``'s ``grid.cells``)."""

    def plain(value: Any) -> Any:
        if isinstance(value, bool | np.bool_):
            return bool(value)
        if isinstance(value, float | np.floating):
            return float(value) if math.isfinite(value) else None
        if isinstance(value, np.integer):
            return int(value)
        return list(value.items) if isinstance(value, ListValue) else value

    return [{key: plain(value) for key, value in row.items()} for row in table.to_dict("records")]


def best_cell_sentence(table: pd.DataFrame, x: str, y: str, assignment: Any) -> str:
    """The best cell and how many cells it cannot be told apart from, in words."""
    if not table.empty and table["score"].iloc[0] == "steps_to_threshold":
        if not (table["solved_fraction"] > 0).any():
            return ("No run reached the env's threshold: every cell's score is the study's "
                    "last step (censored), so no cell is best")  # fmt: skip
    if table.empty or not table["best"].any():
        return "No scores yet."
    best = table[table["best"]]
    names = " and ".join(
        f"{assignment(x, r[x])}, {assignment(y, r[y])}" for r in best.to_dict("records")
    )
    first = best.iloc[0]
    if first["iqm_ci_low"] == first["iqm_ci_low"]:  # (NaN: one seed)
        estimate = stats.estimate_text(first["iqm"], first["iqm_ci_low"], first["iqm_ci_high"])
    else:  # not "(IQM 146.3 (one seed: no interval))"
        estimate = f"{first['iqm']:,.{stats.score_places(first['iqm'])}f}; {stats.NO_INTERVAL}"
    text = f"Best: {names} (IQM {estimate})"
    tied = int(table["not_distinguishable"].sum())
    others = len(table) - len(best)
    if table[["iqm_ci_low", "iqm_ci_high"]].isna().to_numpy().any():  # (a cell of one seed)
        return text + (
            "; one seed in a cell gives no interval, so which cells it beats cannot be told: "
            "run more seeds"
        )
    if tied:
        verb = "is" if tied == 1 else "are"
        every = "both other cells are" if others == 2 else f"all {others} other cells are"
        which = every if tied == others > 1 else f"{tied} of the other {others} cells {verb}"
        text += (
            f"; {which} not distinguishable from it (their {stats.CONFIDENCE_TEXT} intervals "
            "overlap)"
        )
    else:
        text += f"; every other cell's interval lies apart from it ({others} cells)"
    if tied < others and (few := stats.too_few_seeds(int(table["seeds"].min()), "cell")):
        text += f" — {few}"  # a cell "apart" on 2 seeds is their range, not their noise
    return text


def axis_values(table: pd.DataFrame, field: str) -> Sequence[Any]:
    """The field's values in the grid, sorted."""
    return sorted(table[field].unique())
