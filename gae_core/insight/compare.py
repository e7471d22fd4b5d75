"""The λ comparison's data: each seed's learning curve on a common step grid, the per-group
bands across seeds, AUC, steps to solve and the summary table.

Everything returns pandas DataFrames with self-describing column names (the CSV exports are these
frames, unchanged); :mod:`gae_core.insight.figures` draws them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gae_core import metrics as M
from gae_core.agent.config import BOOKKEEPING_FIELDS, TrainConfig, with_stored_defaults
from gae_core.errors import ConfigError
from gae_core.insight import stats
from gae_core.labels import assignment, format_value, label
from gae_core.outcome import SOLVED_WINDOW, summarize_returns
from gae_core.storage.database import finite_or_none
from gae_core.storage.store import RunStore

#: The common env-step grid every run's curve is put on, and the AUC is taken over.
CURVE_POINTS = 200
#: What one replicate is: a seed. A seed with several runs in a group (a pooled crossed axis,
#: or the same config trained by other code) counts once, as the mean of its runs' curves and
#: scores (:data:`SHARED_SEED`): resampling them one by one would narrow the intervals.
#: Repeats of a run's effective config, seed and code are left out first
#: (:func:`distinct_runs`).
REPLICATE = "seed"
#: Why a seed's runs are one replicate. Every run builds its initial weights from its seed; a
#: run trained alone also seeds its env resets and actions with it (a population's member
#: draws those from its population's streams, :class:`gae_core.agent.trainer.Trainer`).
SHARED_SEED = (
    "runs that share a seed start from the same initial weights (and, trained alone, the same "
    "env and action streams), so they are not independent"
)


def running_mean(returns: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each index (fewer at the start)."""
    returns = np.asarray(returns, dtype=float)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    cumsum = np.concatenate([[0.0], np.cumsum(returns)])
    index = np.arange(1, len(returns) + 1)
    start = np.maximum(index - window, 0)
    return (cumsum[index] - cumsum[start]) / (index - start)


def step_grid(max_steps: Sequence[int], points: int = CURVE_POINTS) -> np.ndarray:
    """Common env-step grid from 0 to the shortest curve's last step (no extrapolation)."""
    if not len(max_steps):
        raise ValueError("need at least one curve")
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    # whole env steps: a CSV of the curves has an integer step column
    return np.unique(np.linspace(0.0, float(min(max_steps)), points).round().astype(np.int64))


def align_curve(
    env_steps: np.ndarray, returns: np.ndarray, grid: np.ndarray, *, window: int = 1
) -> np.ndarray:
    """A seed's curve on the grid: at each grid step, the running mean (over ``window``
    episodes) of the last episode finished at or before it; NaN before the first episode."""
    env_steps = np.asarray(env_steps, dtype=float)
    order = np.argsort(env_steps, kind="stable")
    env_steps = env_steps[order]
    smoothed = running_mean(np.asarray(returns, dtype=float)[order], window)
    index = np.searchsorted(env_steps, grid, side="right") - 1
    out = np.full(len(grid), np.nan)
    seen = index >= 0
    out[seen] = smoothed[index[seen]]
    return out


#: How a band is computed, stated on the chart and in the CSV.
BAND_METHODS = {
    "iqm": f"IQM across seeds, {stats.CONFIDENCE_TEXT} percentile-bootstrap band",
    "mean": f"mean across seeds, {stats.CONFIDENCE_TEXT} percentile-bootstrap band",
}


def aggregate_curves(
    episodes: pd.DataFrame,
    *,
    group: str = "lambda_",
    points: int = CURVE_POINTS,
    window: int = 10,
    statistic: str = "iqm",
    seed: int = stats.BOOTSTRAP_SEED,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per group, the IQM (or mean) episodic return across seeds (:data:`REPLICATE`: a seed
    with several runs is the mean of its runs' curves) with a percentile-bootstrap band
    (:func:`gae_core.insight.stats.curve_band`: it never leaves the range of the seeds).

    Args:
        episodes: long frame with columns ``group``, ``seed``, ``run_id``, ``env_step``,
            ``return``.
        group: the column that names a curve (λ by default).
        points: grid size; the grid ends at the shortest run's last episode step.
        window: episodes in each run's running mean before aggregating.
        statistic: ``"iqm"`` or ``"mean"``.

    Returns:
        ``(bands, aligned)``. ``bands``: ``group, env_step, center, ci_low, ci_high, seeds,
        statistic``. ``aligned``: each seed on the grid, ``group, seed, env_step, return``.
    """
    if statistic not in BAND_METHODS:
        raise ValueError(f"statistic must be one of {sorted(BAND_METHODS)}, got {statistic!r}")
    missing = {group, REPLICATE, "run_id", "env_step", "return"} - set(episodes.columns)
    if missing:
        raise ValueError(f"episodes is missing columns {sorted(missing)}")
    if episodes.empty:
        raise ValueError("episodes is empty: no finished episode to aggregate")
    grid = step_grid([curve_end(episodes)], points)
    aligned_parts, band_parts = [], []
    for key, frame in episodes.groupby(group, sort=True):
        curves = []
        for seed_value, runs in frame.groupby(REPLICATE, sort=True):
            each = [
                align_curve(run["env_step"], run["return"], grid, window=window)
                for _, run in runs.groupby("run_id", sort=True)
            ]
            curves.append(np.mean(each, axis=0))  # NaN until every run of the seed has a value
            aligned_parts.append(
                pd.DataFrame(
                    {
                        group: [key] * len(grid),
                        "seed": seed_value,
                        "env_step": grid,
                        "return": curves[-1],
                    }
                )
            )
        band = stats.curve_band(np.vstack(curves), statistic, seed=seed)
        band.insert(0, "env_step", grid)
        band.insert(0, group, [key] * len(band))
        band["statistic"] = statistic
        band_parts.append(band)
    return pd.concat(band_parts, ignore_index=True), pd.concat(aligned_parts, ignore_index=True)


def area_under_curve(env_steps: np.ndarray, values: np.ndarray) -> float:
    """Trapezoidal area under a curve divided by its step span: the average return over
    training (same units as the return). NaN points are dropped."""
    env_steps, values = np.asarray(env_steps, float), np.asarray(values, float)
    keep = ~np.isnan(values)
    env_steps, values = env_steps[keep], values[keep]
    if len(env_steps) < 2 or env_steps[-1] == env_steps[0]:
        return float(values[0]) if len(values) else math.nan
    return float(np.trapezoid(values, env_steps) / (env_steps[-1] - env_steps[0]))


def steps_to_solve(
    env_steps: np.ndarray, returns: np.ndarray, threshold: float, window: int = SOLVED_WINDOW
) -> float:
    """First env step at which a full window of ``window`` episodes reaches ``threshold``
    (Gym's rule, :mod:`gae_core.outcome`); NaN if never."""
    order = np.argsort(np.asarray(env_steps), kind="stable")
    summary = summarize_returns(
        np.asarray(env_steps)[order], np.asarray(returns, float)[order], threshold, window
    )
    return math.nan if summary.solved_at_step is None else float(summary.solved_at_step)


def median_steps_to_solve(solved_at: np.ndarray) -> float:
    """The step by which half the runs had solved: the lower median of their solved steps, a
    run that never solved (NaN) counting as never, so ``inf`` when fewer than half solved (the
    median of a survival curve, not the median of the runs that solved, which would let a
    group that rarely solves look fast); NaN without runs."""
    ordered = np.sort(np.where(np.isnan(solved_at), math.inf, solved_at))
    return float(ordered[(len(ordered) - 1) // 2]) if len(ordered) else math.nan


def run_scores(
    episodes: pd.DataFrame,
    *,
    group: str = "lambda_",
    threshold: float | None = None,
    final_window: int = SOLVED_WINDOW,
) -> pd.DataFrame:
    """One row per run (``group, seed, run_id``): ``final_return`` (the mean of its last
    ``final_window`` episodes) and, with a ``threshold``, ``solved_at_step`` (NaN if it never
    solved, Gym's full-window rule)."""
    rows = []
    for (key, seed_value, run_id), run in episodes.groupby([group, REPLICATE, "run_id"]):
        run = run.sort_values("env_step", kind="stable")
        # final return and solved step by the one rule (gae_core.outcome), as the run reports
        summary = summarize_returns(run["env_step"], run["return"], threshold, final_window)
        row = {group: key, "seed": seed_value, "run_id": run_id}
        row["final_return"] = summary.final_return
        if threshold is not None:
            solved = summary.solved_at_step
            row["solved_at_step"] = math.nan if solved is None else float(solved)
        rows.append(row)
    return pd.DataFrame(rows)


#: The two scores a comparison ranks its groups by, as its sentences name them: a final return
#: at the env's ceiling (CartPole's 500) ties every group, and then the AUC (how fast it got
#: there) is what separates them.
RANKED_SCORES = {"final_return": "Final return", "auc": "AUC (how fast it learned)"}


def group_scores(episodes: pd.DataFrame, group: str) -> dict[str, dict[Any, np.ndarray]]:
    """Per ranked score, each group's seed scores (:func:`seed_scores`), groups in order."""
    scores = seed_scores(episodes, group=group)
    return {
        score: {key: frame[score].to_numpy() for key, frame in scores.groupby(group, sort=True)}
        for score in RANKED_SCORES
    }


def group_sentences(groups: dict[str, dict[Any, np.ndarray]], group: str) -> dict[str, str]:
    """Per ranked score, the one sentence on which group is best and what it can be told
    apart from (:func:`~gae_core.insight.stats.best_group_sentence`), its groups named by
    their value (``λ = 0.95``)."""
    return {
        score: stats.best_group_sentence(groups[score], lambda key: assignment(group, key))
        for score in RANKED_SCORES
    }


def seed_scores(
    episodes: pd.DataFrame,
    *,
    group: str = "lambda_",
    final_window: int = SOLVED_WINDOW,
    points: int = CURVE_POINTS,
    runs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (group, seed), the replicate the statistics resample
    (:data:`REPLICATE`): ``final_return``, the mean of its runs' (:func:`run_scores`, or
    ``runs`` when given), ``auc``, the area under the seed's unsmoothed curve (the mean of its
    runs' raw curves on the common grid, from its first point) divided by that span: the
    average return over training, and ``runs``, how many runs it has."""
    if runs is None:
        runs = run_scores(episodes, group=group, final_window=final_window)
    per_seed = runs.groupby([group, REPLICATE], sort=True)
    scores = per_seed[["final_return"]].mean()
    scores["runs"] = per_seed.size()
    _, aligned = aggregate_curves(episodes, group=group, points=points, window=1)
    curves = aligned.groupby([group, REPLICATE], sort=True)
    scores["auc"] = curves[["env_step", "return"]].apply(
        lambda c: area_under_curve(c["env_step"], c["return"])
    )
    return scores.reset_index()


def summary_table(
    episodes: pd.DataFrame,
    *,
    group: str = "lambda_",
    threshold: float | None = None,
    final_window: int = SOLVED_WINDOW,
    points: int = CURVE_POINTS,
    seed: int = stats.BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """Per group: ``seeds`` and ``runs``, the IQM and mean across seeds of the final return and
    of the AUC (:func:`seed_scores`) with percentile-bootstrap intervals (``final_return_iqm``,
    ``..._ci_low``, …, ``auc_mean``, …; :func:`gae_core.insight.stats.group_summary`), and with
    a threshold the fraction of runs that solved and :func:`median_steps_to_solve`; ``best``
    marks the highest final-return IQM (ties: mean; every group tied at the top is marked)."""
    runs = run_scores(episodes, group=group, threshold=threshold, final_window=final_window)
    scores = seed_scores(episodes, group=group, points=points, runs=runs)
    table = stats.group_summary(scores, group, ["final_return", "auc"], seed=seed)
    table.insert(2, "runs", runs.groupby(group, sort=True).size().to_numpy())
    if threshold is not None:
        solved = runs.groupby(group, sort=True)["solved_at_step"]
        table["solved_fraction"] = solved.apply(lambda x: float(x.notna().mean())).to_numpy()
        median = solved.apply(lambda x: median_steps_to_solve(x.to_numpy(float)))
        table["median_steps_to_solve"] = median.to_numpy()
    top = table[["final_return_iqm", "final_return_mean"]].to_numpy()
    best = top[np.lexsort((top[:, 1], top[:, 0]))[-1]]
    table["best"] = np.isclose(top, best, rtol=0, atol=1e-9).all(axis=1)
    return table


@dataclasses.dataclass(frozen=True, order=True)
class ListValue:
    """A list-valued config field (``hidden_sizes``) as one group value: pandas keeps it whole
    where it would spread a list or tuple over rows, it orders by its numbers (``16x16`` before
    ``128x128``, where text would not) and it reads as people read it (``str``: ``64x64``,
    :func:`gae_core.labels.format_value`). A plain object, not a ``str`` subclass: pandas turns
    those into plain strings."""

    items: tuple

    def __str__(self) -> str:
        return format_value(list(self.items))


def completed_config(config: dict) -> dict | None:
    """A stored config with every field: the value that gives the behaviour the run had where
    it was stored before a field existed (:meth:`TrainConfig.from_stored`), and the device it
    trained on (``from_stored`` reads ``cuda`` as ``cpu`` on a machine without one, so that the
    run opens; a comparison shows where it ran); None if it cannot be read (a damaged row)."""
    if not config:
        return None
    try:
        return _where_it_ran(TrainConfig.from_stored(config).to_dict(), config)
    except ConfigError:
        return None


def _where_it_ran(read: dict, stored: dict) -> dict:
    return {**read, "device": stored.get("device", read["device"])}


def effective_config(config: dict, keep: Sequence[str] = ()) -> dict | None:
    """:func:`completed_config` with each field that changes nothing given the others
    (:meth:`TrainConfig.idle_fields`: ``critic_lambda`` when the critic follows λ, say) set to
    None, so runs that differ only there compare equal, except the fields in ``keep`` (the
    grouped field keeps the value the figures group by); None if it cannot be read."""
    if not config:
        return None
    try:
        read = TrainConfig.from_stored(config)  # built once: completed, then its idle fields
    except ConfigError:
        return None
    idle = set(read.idle_fields()) - set(keep)
    fields = _where_it_ran(read.to_dict(), config)
    return {k: (None if k in idle else v) for k, v in fields.items()}


def idle_in(runs: Sequence[Any], field: str) -> tuple[int, str | None]:
    """How many of the runs have ``field`` set to no effect (:meth:`TrainConfig.idle_fields`),
    and why (the first run's reason, fields by their labels): grouped by it, they train alike."""
    reasons = [
        TrainConfig.from_stored(c).idle_fields(label).get(field)
        for c in (completed_config(r.config) for r in runs)
        if c is not None
    ]
    reasons = [r for r in reasons if r is not None]
    return len(reasons), (reasons[0] if reasons else None)


def distinct_runs(runs: Sequence[Any], group: str) -> tuple[list[Any], dict[str, str]]:
    """``(kept, repeats)`` of stored runs (:class:`~gae_core.storage.records.RunRecord`\\ s): runs
    whose configs agree on every field that changes learning, the seed included
    (:func:`effective_config`; :data:`~gae_core.agent.config.BOOKKEEPING_FIELDS` aside), and
    that were created by the same code (version, commit, uncommitted changes) are one run
    trained twice: the one that reached the most env steps is kept (then the latest created),
    and ``repeats`` maps each other's id to its id. Averaged in with it as its seed's runs, a
    repeat stopped early would drag the seed's final return toward an unfinished one. Runs
    whose config cannot be read are kept (the methods name them)."""
    best: dict[str, Any] = {}
    identity: dict[str, str] = {}
    for run in runs:
        config = effective_config(run.config, keep=(group,))
        if config is None:
            key = f"unreadable {run.id}"
        else:
            code = run.code or {}
            made_by = [code.get(k) for k in ("version", "commit", "local_changes")]
            fields = sorted((k, v) for k, v in config.items() if k not in BOOKKEEPING_FIELDS)
            key = repr((fields, made_by))
        identity[run.id] = key
        held = best.get(key)
        if held is None or (run.env_steps, run.created_at) > (held.env_steps, held.created_at):
            best[key] = run
    kept = [run for run in runs if best[identity[run.id]] is run]
    repeats = {r.id: best[identity[r.id]].id for r in runs if best[identity[r.id]] is not r}
    return kept, repeats


def curve_end(episodes: pd.DataFrame) -> int:
    """The env step the common grid ends at (:func:`step_grid`): the shortest run's last
    finished episode, in an ``episodes`` frame with ``run_id`` and ``env_step``."""
    if episodes.empty:
        raise ValueError("episodes is empty: no finished episode to end a grid at")
    return int(episodes.groupby("run_id")["env_step"].max().min())


def episodes_frame(
    store: RunStore, run_ids: Sequence[str], group: str, also: Sequence[str] = ()
) -> pd.DataFrame:
    """Long frame ``<group>, <also…>, seed, run_id, env_step, return`` of finished episodes of
    the runs, ``group`` (and each of ``also``) being a config field (``lambda_`` for the λ
    comparison; ``also=("gamma",)`` for a λ × γ study)."""
    fields = [group, *[f for f in also if f != group]]
    parts = []
    for run_id in run_ids:
        config = with_stored_defaults(store.get_run(run_id).config)
        metrics = store.metrics(run_id, [M.EPISODIC_RETURN.key])
        if metrics.empty:
            continue
        columns: dict[str, Any] = {field: _groupable(config.get(field)) for field in fields}
        columns |= {"seed": config.get("seed"), "run_id": run_id}
        columns["env_step"] = metrics["env_step"].to_numpy()
        columns["return"] = metrics["value"].to_numpy()
        parts.append(pd.DataFrame(columns))
    if not parts:
        return pd.DataFrame(columns=[*fields, "seed", "run_id", "env_step", "return"])
    return pd.concat(parts, ignore_index=True)


def _groupable(value: Any) -> Any:
    return ListValue(tuple(value)) if isinstance(value, list | tuple) else value


def sweep_summary(
    store: RunStore, sweep_id: str, group: str = "lambda_", seed: int = stats.BOOTSTRAP_SEED
) -> pd.DataFrame:
    """:func:`summary_table` of a stored sweep's trials grouped by ``group`` (what the page's
    summary, ``sweep --json`` and ``python -m gae_core summary`` all show)."""
    runs, _ = distinct_runs(store.list_runs(sweep_id=sweep_id), group)
    episodes = episodes_frame(store, [r.id for r in runs], group)
    if episodes.empty:
        return pd.DataFrame()
    threshold = runs[0].summary.reward_threshold if runs else None
    return summary_table(episodes, group=group, threshold=threshold, seed=seed)


def summary_records(table: pd.DataFrame, group: str) -> list[dict]:
    """The summary as JSON-ready entries: ``{"group", "value", "seeds", "runs",
    "final_return": {iqm, iqm_ci_low, iqm_ci_high, mean, mean_ci_low, mean_ci_high},
    "auc": {…}}``."""
    records = []
    for row in table.to_dict("records"):
        value = row[group]
        value = list(value.items) if isinstance(value, ListValue) else value
        entry = {"group": group, "value": value}
        entry |= {"seeds": int(row["seeds"]), "runs": int(row["runs"])}
        for score in ("final_return", "auc"):
            entry[score] = {
                f"{name}{suffix}": finite_or_none(row[f"{score}_{name}{suffix}"])
                for name in ("iqm", "mean")
                for suffix in ("", "_ci_low", "_ci_high")
            }
        if "solved_fraction" in row:
            entry["solved_fraction"] = finite_or_none(row["solved_fraction"])
        records.append(entry)
    return records
