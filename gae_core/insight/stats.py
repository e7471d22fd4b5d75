r"""Study statistics after Agarwal et al., *Deep Reinforcement Learning at the Edge of the
Statistical Precipice* (NeurIPS 2021) and its ``rliable`` library, on scipy.

A λ study has few seeds per group, so point estimates alone mislead. A *seed* here is one
replicate: one run, or the mean of the runs that share a seed (a pooled crossed axis; they are
not independent: :data:`gae_core.insight.compare.SHARED_SEED`). Per group of seeds:

* **IQM**, the interquartile mean: the mean of the middle 50 % of the scores,
  ``scipy.stats.trim_mean(x, 0.25)``, which cuts ⌊n/4⌋ scores from each end (none below 4
  seeds, where the IQM is the mean). Robust to one failed seed, less noisy than the median.
* **Percentile-bootstrap confidence intervals** (``scipy.stats.bootstrap``, ``method=
  "percentile"``): seeds are resampled with replacement; the interval is the (α/2, 1 − α/2)
  quantiles of the statistic over resamples. For the mean and the IQM every resample's value
  lies between the smallest and the largest score, so an interval can never leave the range of
  the data (a Student-t band with 2 seeds can: t₀.₉₇₅,₁ = 12.7).
* **Stratified bootstrap** over several tasks: seeds are resampled within each task, and the
  statistic is taken over the pooled resampled scores (rliable's aggregate over a runs × tasks
  matrix).
* **Probability of improvement** P(X > Y) + ½·P(X = Y) over all pairs of seeds of two groups
  (the Mann–Whitney U statistic divided by n·m), with a bootstrap interval that resamples both
  groups independently.
* **Performance profile**: the fraction of seeds whose score is *above* τ, over thresholds τ,
  with bootstrap bands.

Every function is deterministic for a given ``seed``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gae_core.labels import MISSING

__all__ = [
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "CONFIDENCE_TEXT",
    "FEW_SEEDS",
    "INTERVAL_DEFINITION",
    "IQM_DEFINITION",
    "RESAMPLES",
    "STATISTICS",
    "best_group_sentence",
    "bootstrap_ci",
    "curve_band",
    "default_taus",
    "estimate_text",
    "few_seeds_warning",
    "group_summary",
    "improvement_matrix",
    "iqm",
    "mean",
    "median_gap_ci",
    "performance_profile",
    "probability_of_improvement",
    "score_places",
    "side_by_side",
    "stratified_bootstrap_ci",
    "too_few_seeds",
]

#: Below this many seeds per group the page warns that intervals are wide.
FEW_SEEDS = 5
#: Every interval here: its resamples, confidence level and generator seed (the defaults).
RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0
#: The confidence level as the charts and tables print it (``95 %``).
CONFIDENCE_TEXT = f"{CONFIDENCE * 100:g} %"
#: The intervals and the IQM in words (a comparison's methods paragraph).
INTERVAL_DEFINITION = f"{CONFIDENCE_TEXT} percentile bootstrap over seeds (Agarwal et al., 2021)"
IQM_DEFINITION = "the 25 % trimmed mean: ⌊n/4⌋ seeds cut from each end, the mean below 4 seeds"


def iqm(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: ``trim_mean(scores, 0.25)`` (⌊n/4⌋ cut from each end)."""
    return scipy_stats.trim_mean(scores, 0.25, axis=axis)


def mean(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(scores, axis=axis)


STATISTICS: dict[str, Callable[..., Any]] = {"iqm": iqm, "mean": mean}


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The scores as floats with NaN left out (a seed without a score), as every function here
    takes them."""
    x = np.asarray(values, float)
    return x[~np.isnan(x)]


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")


def _statistic(name: str) -> Callable[..., Any]:
    if name not in STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(STATISTICS)}, got {name!r}")
    return STATISTICS[name]


def _bootstrap(data: tuple, statistic: Callable, confidence: float, resamples: int, seed: int,
               paired: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    with warnings.catch_warnings():  # constant data: scipy warns, the interval is the value
        warnings.simplefilter("ignore")
        result = scipy_stats.bootstrap(
            data,
            statistic,
            vectorized=True,
            axis=-1,
            paired=paired,
            confidence_level=confidence,
            n_resamples=resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return result.confidence_interval.low, result.confidence_interval.high


def bootstrap_ci(
    scores: Sequence[float] | np.ndarray,
    statistic: str = "iqm",
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """``(point, low, high)`` of the statistic over the scores (NaN dropped) with a percentile
    bootstrap interval over seeds; one score gives ``(x, x, x)``, none ``(nan, nan, nan)``."""
    _check(confidence, resamples)
    function = _statistic(statistic)
    x = _finite(scores)
    if len(x) == 0:
        return (np.nan, np.nan, np.nan)
    point = float(function(x))
    if len(x) == 1 or np.all(x == x[0]):
        return (point, point, point)
    low, high = _bootstrap((x,), function, confidence, resamples, seed)
    return (point, float(low), float(high))


def stratified_bootstrap_ci(
    scores_by_task: Sequence[Sequence[float]],
    statistic: str = "iqm",
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """``(point, low, high)`` of the statistic over all tasks' scores pooled, seeds resampled
    within each task (rliable's stratified bootstrap)."""
    _check(confidence, resamples)
    function = _statistic(statistic)
    tasks = [_finite(t) for t in scores_by_task]
    tasks = [t for t in tasks if len(t)]
    if not tasks:
        return (np.nan, np.nan, np.nan)
    point = float(function(np.concatenate(tasks)))
    rng = np.random.default_rng(seed)
    draws = np.concatenate(
        [t[rng.integers(0, len(t), size=(resamples, len(t)))] for t in tasks], axis=1
    )
    values = function(draws, axis=-1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return (point, float(low), float(high))


def _median_gap(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis) - np.median(y, axis=axis)


def _improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) + ½ P(X = Y) over all pairs, batched over leading axes."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    greater = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    equal = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * equal


def _two_samples(
    statistic: Callable, x: Sequence[float], y: Sequence[float], confidence: float,
    resamples: int, seed: int,
) -> tuple[float, float, float]:  # fmt: skip
    """``(value, low, high)`` of ``statistic(x, y)`` with a bootstrap interval resampling x and
    y independently. With one seed in either group there is no interval (NaN bounds): a
    bootstrap cannot see that seed's noise, and holding it fixed would claim a certainty the
    data do not have (every score equal is the exception: the value whatever is resampled)."""
    _check(confidence, resamples)
    a, b = _finite(x), _finite(y)
    if not len(a) or not len(b):
        return (np.nan, np.nan, np.nan)
    point = float(statistic(a, b))
    if np.all(np.concatenate([a, b]) == a[0]):
        return (point, point, point)
    if len(a) == 1 or len(b) == 1:
        return (point, np.nan, np.nan)
    low, high = _bootstrap((a, b), statistic, confidence, resamples, seed)
    return (point, float(low), float(high))


def median_gap_ci(
    x: Sequence[float], y: Sequence[float], *, confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:  # fmt: skip
    """``(gap, low, high)``: median(x) − median(y) with a bootstrap interval (how large a gap
    two sets of seeds allow; :func:`_two_samples`)."""
    return _two_samples(_median_gap, x, y, confidence, resamples, seed)


def probability_of_improvement(
    x: Sequence[float], y: Sequence[float], *, confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:  # fmt: skip
    """``(p, low, high)``: P(X > Y) + ½·P(X = Y) over seeds, i.e. U / (n·m) of the
    Mann–Whitney test, with a bootstrap interval (:func:`_two_samples`: none with one seed in
    either group)."""
    return _two_samples(_improvement, x, y, confidence, resamples, seed)


def improvement_matrix(
    groups: Mapping[Any, Sequence[float]], *, confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:  # fmt: skip
    """Long frame ``x, y, probability, ci_low, ci_high`` for every ordered pair x ≠ y."""
    if not groups:
        raise ValueError("groups must not be empty")
    rows = []
    for x, xs in groups.items():
        for y, ys in groups.items():
            if x == y:
                continue
            p, low, high = probability_of_improvement(
                xs, ys, confidence=confidence, resamples=resamples, seed=seed
            )
            rows.append({"x": x, "y": y, "probability": p, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows, columns=["x", "y", "probability", "ci_low", "ci_high"])


def default_taus(groups: Mapping[Any, Sequence[float]], points: int = 101) -> np.ndarray:
    """Thresholds evenly spaced from just below the smallest score of all groups (every
    profile starts at 1) to the largest (where every profile is 0, scores counting only when
    strictly above τ). Below by 5 % of the scores' range, or by max(1, 1 % of the score) when
    every score is equal: a study whose runs all end at 500 draws a step at 500, not an empty
    chart."""
    scores = _finite(np.concatenate([np.asarray(v, float) for v in groups.values()]))
    if not len(scores):
        return np.zeros(1)
    low, high = float(scores.min()), float(scores.max())
    pad = 0.05 * (high - low) if high > low else max(1.0, 0.01 * abs(low))
    return np.linspace(low - pad, high, points)


def performance_profile(
    groups: Mapping[Any, Sequence[float]],
    taus: np.ndarray | None = None,
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """Long frame ``group, tau, fraction, ci_low, ci_high``: the share of a group's seeds with a
    score strictly above τ, with a bootstrap band over seeds (NaN for a group without scores)."""
    _check(confidence, resamples)
    if not groups:
        raise ValueError("groups must not be empty")
    taus = default_taus(groups) if taus is None else np.asarray(taus, float)
    parts = []
    for name, values in groups.items():
        x = _finite(values)
        if not len(x):  # no score: no profile (NaN), not a crash
            empty = np.full(len(taus), np.nan)
            parts.append(pd.DataFrame({"group": name, "tau": taus, "fraction": empty,
                                       "ci_low": empty, "ci_high": empty}))  # fmt: skip
            continue
        above = (x[None, :] > taus[:, None]).astype(float)  # [taus, seeds]
        fraction = above.mean(axis=1)
        low, high = fraction.copy(), fraction.copy()
        varied = (above.min(axis=1) != above.max(axis=1)) & (len(x) > 1)
        if varied.any():
            low[varied], high[varied] = _bootstrap(
                (above[varied],), mean, confidence, resamples, seed
            )
        parts.append(pd.DataFrame({"group": name, "tau": taus, "fraction": fraction,
                                   "ci_low": low, "ci_high": high}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def curve_band(
    curves: np.ndarray,
    statistic: str = "iqm",
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """Per grid point of ``curves [seeds, points]`` (NaN where a seed has no value yet): the
    statistic over the seeds present and its percentile-bootstrap band; columns ``center,
    ci_low, ci_high, seeds``. One seed: the band is the value; none: NaN. Points with every seed
    present are bootstrapped in one vectorised call."""
    _check(confidence, resamples)
    function = _statistic(statistic)
    curves = np.asarray(curves, float)
    present = ~np.isnan(curves)
    counts = present.sum(axis=0)
    center = np.full(curves.shape[1], np.nan)
    low, high = center.copy(), center.copy()
    full = counts == curves.shape[0]
    if full.any():
        block = curves[:, full].T  # [points, seeds]
        center[full] = function(block, axis=-1)
        varied = block.min(axis=1) != block.max(axis=1)
        low[full], high[full] = center[full], center[full]
        if curves.shape[0] > 1 and varied.any():
            index = np.flatnonzero(full)[varied]
            low[index], high[index] = _bootstrap((block[varied],), function, confidence,
                                                 resamples, seed)  # fmt: skip
    for point in np.flatnonzero(~full & (counts > 0)):
        center[point], low[point], high[point] = bootstrap_ci(
            curves[:, point], statistic, confidence=confidence, resamples=resamples, seed=seed
        )
    return pd.DataFrame({"center": center, "ci_low": low, "ci_high": high, "seeds": counts})


def group_summary(
    scores: pd.DataFrame,
    group: str,
    columns: Sequence[str],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> pd.DataFrame:
    """One row per group value: ``<group>``, ``seeds`` and, for every score column c,
    ``c_iqm, c_iqm_ci_low, c_iqm_ci_high, c_mean, c_mean_ci_low, c_mean_ci_high``.
    ``scores`` holds one row per seed. A score with one seed in a group has no interval (NaN
    bounds, as :func:`probability_of_improvement` gives): a bootstrap of one value is
    ``[x, x]``, which reads as certainty where nothing of the seeds' spread is known."""
    rows = []
    for key, frame in scores.groupby(group, sort=True):
        row: dict[str, Any] = {group: key, "seeds": len(frame)}
        for column in columns:
            for name in ("iqm", "mean"):
                point, low, high = bootstrap_ci(
                    frame[column].to_numpy(), name, confidence=confidence,
                    resamples=resamples, seed=seed,
                )  # fmt: skip
                if len(_finite(frame[column].to_numpy())) < 2:
                    low = high = np.nan
                row |= {f"{column}_{name}": point, f"{column}_{name}_ci_low": low,
                        f"{column}_{name}_ci_high": high}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


#: How a score reads where its group has one seed (:func:`group_summary`'s NaN bounds).
NO_INTERVAL = "one seed: no interval"


def score_places(*values: float) -> int:
    """Decimal places for scores of these sizes (:func:`estimate_text`'s rule): one where the
    largest is at least 10 (or 0), else three significant digits of it."""
    largest = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if largest >= 10 or largest == 0:
        return 1
    return max(1, 2 - math.floor(math.log10(largest)))


def side_by_side(a: float, b: float) -> tuple[str, str]:
    """Two scores to the same places for a sentence: the fewest, from the tables' rule
    (:func:`score_places`) up to six, at which they print apart (the rule's where they never
    do): 2.5 against 2 reads "2.50 against 2.00"; 500 against 499.96 never reads as a tie."""
    a, b = a + 0.0, b + 0.0  # −0.0 prints as 0.0
    rule = score_places(a, b)
    places = next((p for p in range(rule, 7) if f"{a:,.{p}f}" != f"{b:,.{p}f}"), rule)
    return f"{a:,.{places}f}", f"{b:,.{places}f}"


def estimate_text(point: float | None, low: float | None, high: float | None) -> str:
    """A score and its interval as every table of them prints it, with thousands separators,
    to one decimal where the largest of its numbers is at least 10 and otherwise to three
    significant digits of that largest (a return of a fraction of one must not read 0.3 for
    every group): ``1,234.5 [1,200.0, 1,260.3]``, ``0.266 [0.221, 0.305]``; ``1,234.5 (one
    seed: no interval)`` where the bounds are missing (NaN or None); ``–`` where the score
    is."""
    point, low, high = (math.nan if v is None else v for v in (point, low, high))
    if point != point:
        return MISSING
    places = score_places(*(v for v in (point, low, high) if v == v))  # NaN != NaN
    if low != low or high != high:
        return f"{point:,.{places}f} ({NO_INTERVAL})"
    return f"{point:,.{places}f} [{low:,.{places}f}, {high:,.{places}f}]"


def best_group_sentence(
    groups: Mapping[Any, Sequence[float]],
    label: Callable[[Any], str],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> str:
    """The group with the highest IQM (ties: mean) against the runner-up, in words:
    "λ = 0.95 beats λ = 1 with probability 0.78 [0.61, 0.92] …", saying so when the interval
    includes ½ (no better than a coin flip at this sample size). Where the group first on IQM
    wins at most half the seed pairs (P(X > Y) printed as 0.50 or less), it is said to rank
    first on IQM, with both IQMs, and the runner-up to win as many seed pairs or more: never
    that it "beats" it. Groups tied at the top (same IQM and mean, e.g. every seed at the
    env's ceiling) are named together, not ranked. NaN scores are left out, as everywhere
    here; a group without scores ranks last. With one seed in either of the two groups there
    is no interval (a bootstrap cannot see that seed's noise), and the sentence says so
    instead of printing one; with fewer than :data:`FEW_SEEDS`, an interval that excludes ½
    is said to be too few seeds to trust. No final full stop: the caller ends the sentence."""
    if len(groups) < 2:
        return "Only one group: nothing to compare"
    finite = {g: _finite(v) for g, v in groups.items()}
    if not any(len(v) for v in finite.values()):
        return "No scores to compare"

    def key(g: Any) -> tuple[float, float]:
        values = finite[g]
        return (float(iqm(values)), float(np.mean(values))) if len(values) else (-np.inf,) * 2

    ranked = sorted(groups, key=key, reverse=True)
    top = [g for g in ranked if np.allclose(key(g), key(ranked[0]), rtol=0, atol=1e-9)]
    if len(top) > 1:
        names = ", ".join(label(g) for g in top[:-1]) + f" and {label(top[-1])}"
        level_iqm, level_mean = side_by_side(*key(top[0]))
        return (
            f"{names} tie at the top (IQM {level_iqm}, mean {level_mean}): "
            "this score does not separate them"
        )
    best, second = ranked[0], ranked[1]
    if not len(finite[second]):  # the runner-up has no score: nothing to weigh it against
        without = [label(g) for g in ranked[1:] if not len(finite[g])]
        names = " and ".join([", ".join(without[:-1]), without[-1]] if len(without) > 1
                             else without)  # fmt: skip
        verb = "has" if len(without) == 1 else "have"
        return f"{label(best)} ranks first; {names} {verb} no scores to compare it with"
    p, low, high = probability_of_improvement(
        finite[best], finite[second], confidence=confidence, resamples=resamples, seed=seed
    )
    interval = "" if np.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    how = "(P(X > Y) over seeds" + (
        "" if np.isnan(low) else f", {confidence * 100:g} % bootstrap CI"
    )
    if round(p, 2) > 0.5:  # as printed: 0.497 and 0.503 read 0.50, a coin flip
        text = f"{label(best)} beats {label(second)} with probability {p:.2f}{interval} {how})"
    else:  # first on IQM, yet the runner-up wins as many seed pairs or more: never "beats"
        (best_iqm, _), (second_iqm, _) = key(best), key(second)
        shown, other = side_by_side(best_iqm, second_iqm)
        first = (f"on IQM ({shown} against {other} for {label(second)})" if shown != other
                 else f"(IQM tied at {shown} with {label(second)}, higher mean)")  # fmt: skip
        pairs = "as many" if round(p, 2) == 0.5 else "more"
        text = (
            f"{label(best)} ranks first {first}, yet {label(second)} wins {pairs} seed pairs: "
            f"P({label(best)} > {label(second)}) = {p:.2f}{interval} {how})"
        )
    if np.isnan(low):  # one seed in either group
        return text + " — one seed in a group, so no interval: not distinguishable from seed noise"
    if low <= 0.5 <= high:
        text += " — not distinguishable from seed noise at this sample size"
    elif few := too_few_seeds(min(len(finite[best]), len(finite[second]))):
        # 2 seeds a group that all order one way give [1.00, 1.00]: a bootstrap over so few
        # seeds cannot see their noise (few_seeds_warning)
        text += f" — {few}"
    return text


def too_few_seeds(fewest: int, unit: str = "group") -> str | None:
    """The clause a verdict drawn from intervals adds when its smallest ``unit`` (a group, a
    cell) has fewer than :data:`FEW_SEEDS` seeds, or None."""
    if fewest >= FEW_SEEDS:
        return None
    return (f"from only {fewest} seeds in a {unit}: too few for this interval to be trusted "
            f"(use 10 per {unit})")  # fmt: skip


def few_seeds_warning(n_min: int) -> str | None:
    """Why intervals are wide with fewer than :data:`FEW_SEEDS` seeds per group, or None."""
    if n_min >= FEW_SEEDS:
        return None
    return (
        f"Only {n_min} seed{'s' if n_min != 1 else ''} in the smallest group: a bootstrap over "
        f"so few seeds can take only a handful of distinct values, so the intervals are wide "
        "and cover the truth less often than they claim. Use 10 seeds per group to rank groups."
    )
