"""Pure data builders behind the insight pages: the advantage explorer's per-step table, its
(t, λ) heat map and estimator weights, and the λ comparison's aggregation across seeds.

Everything here returns pandas DataFrames with self-describing column names (the CSV exports
are these frames, unchanged). No plotting and no Streamlit: :mod:`gae_core.figures` turns the
frames into Plotly figures.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from gae_core import estimators

# Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30 (beyond: the normal 1.96 is
# within 2 %). A table keeps scipy out of the runtime requirements.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """t_{0.975} with ``df`` degrees of freedom (the half-width factor of a 95 % interval)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def gae_column(lambda_: float) -> str:
    return f"gae[lambda={lambda_:g}]"


def k_step_column(k: int) -> str:
    return f"k_step[k={k}]"


# ----------------------------------------------------------------------------- explorer


def advantage_table(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    *,
    gamma: float,
    lambdas: Sequence[float],
    ks: Sequence[int] = (),
) -> pd.DataFrame:
    """One row per step t of a 1-D trajectory: inputs, flags, δ_t, each Â^(k)_t and GAE at each λ.

    Columns: ``t``, ``reward``, ``value`` (V(s_t)), ``next_value`` (V(s_{t+1})), ``terminated``,
    ``truncated``, ``end_of_rollout`` (the implicit cut after the last row), ``steps_left``
    (L_t, steps to the end of t's segment, inclusive), ``delta``, ``k_step[k=K]`` for each K, and
    ``gae[lambda=L]`` for each λ. Every estimate comes from :mod:`gae_core.estimators`.
    """
    rewards, values, next_values = (np.asarray(x) for x in (rewards, values, next_values))
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be a 1-D trajectory [T], got shape {rewards.shape}")
    terminated = np.asarray(terminated, dtype=bool)
    truncated = np.asarray(truncated, dtype=bool)
    args = (rewards, values, next_values, terminated, truncated)
    steps = len(rewards)
    end = np.zeros(steps, dtype=bool)
    if steps:
        end[-1] = True
    table = pd.DataFrame(
        {
            "t": np.arange(steps),
            "reward": rewards,
            "value": values,
            "next_value": next_values,
            "terminated": terminated,
            "truncated": truncated,
            "end_of_rollout": end,
            "steps_left": steps_left(terminated, truncated),
            "delta": estimators.td_residuals(*args[:4], gamma=gamma),
        }
    )
    if len(ks):
        stacked = estimators.k_step_advantages(*args, gamma=gamma, k=list(ks))
        for k, column in zip(ks, stacked, strict=True):
            table[k_step_column(k)] = column
    if len(lambdas):
        sweep = estimators.gae_lambda_sweep(*args, gamma=gamma, lambdas=list(lambdas))
        for lambda_, column in zip(lambdas, sweep, strict=True):
            table[gae_column(lambda_)] = column
    return table


#: The explorer's λ grid: one gae_lambda_sweep over it serves the slider, the pins and the map.
LAMBDA_GRID = np.round(np.linspace(0.0, 1.0, 101), 2)


def lambda_index(lambda_: float, grid: np.ndarray = LAMBDA_GRID) -> int:
    """Position of ``lambda_`` in ``grid``; a ValueError names the grid when it is not on it."""
    hits = np.flatnonzero(np.isclose(grid, lambda_, rtol=0.0, atol=1e-9))
    if not len(hits):
        raise ValueError(f"lambda {lambda_} is not on the grid (steps of {grid[1] - grid[0]:g})")
    return int(hits[0])


def with_gae_columns(
    table: pd.DataFrame, sweep: np.ndarray, lambdas: Sequence[float], grid: np.ndarray = LAMBDA_GRID
) -> pd.DataFrame:
    """``table`` plus ``gae[lambda=L]`` columns read from a precomputed ``[len(grid), T]``
    sweep: moving the λ slider costs a column copy, not a recomputation."""
    table = table.copy()
    for lambda_ in dict.fromkeys(lambdas):
        table[gae_column(lambda_)] = sweep[lambda_index(lambda_, grid)]
    return table


def heatmap_from_sweep(sweep: np.ndarray, grid: np.ndarray = LAMBDA_GRID) -> pd.DataFrame:
    """Long frame ``lambda, t, gae`` from a ``[len(grid), T]`` sweep."""
    steps = sweep.shape[1]
    return pd.DataFrame(
        {
            "lambda": np.repeat(grid, steps),
            "t": np.tile(np.arange(steps), len(grid)),
            "gae": sweep.reshape(-1),
        }
    )


def steps_left(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """L_t: steps from t to the end of its segment, inclusive (first done step, or row T−1)."""
    done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
    out = np.empty(len(done), dtype=np.int64)
    remaining = 0
    for t in range(len(done) - 1, -1, -1):
        remaining = 1 if (done[t] or t == len(done) - 1) else remaining + 1
        out[t] = remaining
    return out


def gae_heatmap(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    *,
    gamma: float,
    lambdas: Sequence[float] | None = None,
) -> pd.DataFrame:
    """GAE over (t, λ) in long form: columns ``lambda``, ``t``, ``gae`` (one
    :func:`~gae_core.estimators.gae_lambda_sweep` call; λ defaults to 0, 0.01, …, 1)."""
    grid = LAMBDA_GRID if lambdas is None else np.asarray(lambdas, dtype=float)
    sweep = estimators.gae_lambda_sweep(
        rewards, values, next_values, terminated, truncated, gamma=gamma, lambdas=grid
    )
    return heatmap_from_sweep(sweep, grid)


def weights_table(lambda_: float, horizon: int) -> pd.DataFrame:
    """Weight of each Â^(k), k = 1..H, in GAE at a step with H steps left in its segment.

    Columns: ``k``, ``weight`` (from :func:`~gae_core.estimators.estimator_weights`),
    ``geometric_weight`` ((1−λ)λ^(k−1), the infinite-horizon weight) and ``tail`` (True on the
    last row, whose weight λ^(H−1) is all the geometric mass of k ≥ H piled on Â^(H)).
    """
    weights = estimators.estimator_weights(lambda_, horizon)
    k = np.arange(1, horizon + 1)
    return pd.DataFrame(
        {
            "k": k,
            "weight": weights,
            "geometric_weight": (1.0 - lambda_) * float(lambda_) ** (k - 1.0),
            "tail": k == horizon,
        }
    )


# ----------------------------------------------------------------------------- comparison


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
    factor = np.array([t_quantile_975(int(n) - 1) if n > 1 else np.nan for n in counts])
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
    env_steps: np.ndarray, returns: np.ndarray, threshold: float, window: int = 100
) -> float:
    """First env step at which the mean of the last ``window`` episodes reaches ``threshold``
    (with a full window, as Gym's "solved" rule); NaN if never."""
    env_steps, returns = np.asarray(env_steps, float), np.asarray(returns, float)
    if len(returns) < window:
        return math.nan
    means = running_mean(returns, window)
    hits = np.flatnonzero((np.arange(1, len(returns) + 1) >= window) & (means >= threshold))
    return float(env_steps[hits[0]]) if len(hits) else math.nan


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
