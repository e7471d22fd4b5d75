"""The λ comparison's data: each seed's learning curve on a common step grid, the per-group
bands across seeds, AUC, steps to solve and the summary table.

Everything returns pandas DataFrames with self-describing column names (the CSV exports are these
frames, unchanged); :mod:`gae_core.insight.figures` draws them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gae_core import metrics as M
from gae_core.outcome import SOLVED_WINDOW, summarize_returns
from gae_core.runs.store import RunStore


def running_mean(returns: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each index (fewer at the start)."""
    returns = np.asarray(returns, dtype=float)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    cumsum = np.concatenate([[0.0], np.cumsum(returns)])
    index = np.arange(1, len(returns) + 1)
    start = np.maximum(index - window, 0)
    return (cumsum[index] - cumsum[start]) / (index - start)


def step_grid(max_steps: Sequence[int], points: int = 200) -> np.ndarray:
    """Common env-step grid from 0 to the shortest curve's last step (no extrapolation)."""
    if not len(max_steps):
        raise ValueError("need at least one curve")
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    return np.linspace(0.0, float(min(max_steps)), points)


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


def aggregate_curves(
    episodes: pd.DataFrame, *, group: str = "lambda", points: int = 200, window: int = 10
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean episodic return per group with a 95 % confidence band across seeds.

    Args:
        episodes: long frame with columns ``group``, ``seed``, ``env_step``, ``return``.
        group: the column that names a curve (λ by default).
        points: grid size; the grid ends at the shortest seed's last episode step.
        window: episodes in each seed's running mean before averaging across seeds.

    Returns:
        ``(bands, aligned)``. ``bands``: ``group, env_step, mean, ci_low, ci_high, seeds`` where
        the band is mean ± t_{0.975, n−1}·s/√n over the n seeds with a value at that step (no
        band with one seed). ``aligned``: each seed on the grid, ``group, seed, env_step,
        return``.
    """
    missing = {group, "seed", "env_step", "return"} - set(episodes.columns)
    if missing:
        raise ValueError(f"episodes is missing columns {sorted(missing)}")
    if episodes.empty:
        raise ValueError("episodes is empty: no finished episode to aggregate")
    grid = step_grid(episodes.groupby([group, "seed"])["env_step"].max().tolist(), points)
    aligned_parts, band_parts = [], []
    for key, frame in episodes.groupby(group, sort=True):
        seeds, curves = [], []
        for seed, run in frame.groupby("seed", sort=True):
            seeds.append(seed)
            curves.append(align_curve(run["env_step"], run["return"], grid, window=window))
            aligned_parts.append(
                pd.DataFrame({group: key, "seed": seed, "env_step": grid, "return": curves[-1]})
            )
        band_parts.append(_band(key, grid, np.vstack(curves), group))
    return pd.concat(band_parts, ignore_index=True), pd.concat(aligned_parts, ignore_index=True)


def _band(key, grid: np.ndarray, curves: np.ndarray, group: str) -> pd.DataFrame:
    counts = np.sum(~np.isnan(curves), axis=0)
    with warnings.catch_warnings():  # steps where no (or one) seed has a value yet give NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(curves, axis=0)
        std = np.nanstd(curves, axis=0, ddof=1)
    factor = np.where(counts > 1, scipy_stats.t.ppf(0.975, np.maximum(counts - 1, 1)), np.nan)
    half = factor * std / np.sqrt(np.maximum(counts, 1))
    return pd.DataFrame(
        {
            group: key,
            "env_step": grid,
            "mean": mean,
            "ci_low": mean - half,
            "ci_high": mean + half,
            "seeds": counts,
        }
    )


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


def summary_table(
    episodes: pd.DataFrame,
    *,
    group: str = "lambda",
    threshold: float | None = None,
    final_window: int = 100,
    points: int = 200,
) -> pd.DataFrame:
    """Per group: final return mean ± std across seeds (each seed's mean of its last
    ``final_window`` episodes), normalised AUC of the seed-mean curve, median steps to solved
    and the fraction of seeds that solved (when ``threshold`` is given), and ``best`` marking
    the group with the highest AUC (ties: highest final mean)."""
    _, aligned = aggregate_curves(episodes, group=group, points=points, window=1)
    rows = []
    for key, frame in episodes.groupby(group, sort=True):
        finals, solve_steps = [], []
        for _, run in frame.groupby("seed", sort=True):
            run = run.sort_values("env_step", kind="stable")
            finals.append(float(run["return"].tail(final_window).mean()))
            if threshold is not None:
                solve_steps.append(
                    steps_to_solve(run["env_step"], run["return"], threshold, final_window)
                )
        curve = aligned[aligned[group] == key].groupby("env_step")["return"].mean()
        solved = [s for s in solve_steps if not math.isnan(s)]
        rows.append(
            {
                group: key,
                "seeds": len(finals),
                "final_return_mean": float(np.mean(finals)),
                "final_return_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
                "auc_mean_return": area_under_curve(curve.index.to_numpy(), curve.to_numpy()),
                "median_steps_to_solve": float(np.median(solved)) if solved else math.nan,
                "solved_fraction": len(solved) / len(finals) if threshold is not None else math.nan,
            }
        )
    table = pd.DataFrame(rows)
    ranking = table.sort_values(["auc_mean_return", "final_return_mean"], ascending=False)
    table["best"] = table.index == ranking.index[0]
    return table


def episodes_frame(store: RunStore, run_ids: Sequence[str], group: str) -> pd.DataFrame:
    """Long frame ``<group>, seed, run_id, env_step, return`` of finished episodes of the runs,
    ``group`` being a config field (``lambda_`` for the λ comparison)."""
    parts = []
    for run_id in run_ids:
        run = store.get_run(run_id)
        metrics = store.metrics(run_id, [M.EPISODIC_RETURN.key])
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
