r"""The estimator lab: bias², variance and MSE of δ, Â^(k) and GAE(λ), measured on real rollouts
against Monte-Carlo truth.

For N states s sampled from the policy's own episodes, with the action a the policy took there:

* **Truth.** Q^π(s, a) by Monte Carlo: M rollouts that take a, then follow π, discounted with γ
  up to termination or a horizon H where γ^H ≤ 10⁻³ (at most 5,000 steps; the discount mass left,
  γ^H, is reported). With ``tail`` (a run's measurement at the run's own γ passes the policy's
  own critic) a rollout still running at H adds γ^H V̂_π(s_H), so the truth misses γ^H times
  that critic's error at s_H rather than γ^H V^π(s_H), which would read as bias in every
  estimator, λ = 1's too, wherever episodes outlast H. Time limits are not part of the state:
  the truth is the infinite-horizon value, matching how the estimators bootstrap at a
  truncation. V^π(s) likewise from M rollouts
  that sample the first action too. The target of every estimator is the paper's γ-just one
  (Schulman et al. 2016, Proposition 1) with the critic's own baseline:
  target(s) = Q^π(s, a) − V̂(s). λ = 1 is then unbiased wherever the continuation terminates
  within L steps; "bias" is exactly the error the critic injects by bootstrapping. The
  state-only offset V^π(s) − V̂(s), which does not bias the policy gradient, is reported apart.
* **Estimators.** K continuations of (s, a), each a real on-policy segment of L steps (to
  termination, or cut at L and bootstrapped there), give δ, Â^(k) and GAE(λ) at their first
  row with the chosen critic V̂: the sums :mod:`gae_core.estimators` gives at row 0, added up as
  the steps arrive (:mod:`gae_core.lab.rollouts`), so nothing is kept per step.
* **Statistics per state.** With m the mean and s² the variance (ddof 1) of an estimator over
  the K continuations, and s²_Q the variance of the M truth returns,

  .. math::  \widehat{\mathrm{bias}^2} = (m − \widehat{target})^2 − s^2/K − s_Q^2/M,

  the unbiased estimate of the squared bias (both means carry sampling noise, whose expected
  squares are subtracted; a state's estimate can fall below 0, the average over states cannot be
  biased by clipping it), variance = s², MSE = bias² + variance. Averages over states come with
  percentile-bootstrap confidence intervals across states.

Rollouts run in batches of env copies stepped together (:class:`~gae_core.lab.states.Simulator`;
as many as fit in a fixed budget). Before any work the memory the settings need is estimated
(:mod:`gae_core.lab.memory`) and settings past :data:`MEMORY_LIMIT` are refused
(:class:`LabTooLarge`, one line naming the fields to lower). Deterministic for a
given seed; ``progress`` gets the fraction done; ``cancel`` stops it between steps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gae_core.lab.memory import (
    MEMORY_LIMIT,
    RESAMPLES,
    LabTooLarge,
    MemoryEstimate,
    batch_size,
    check_memory,
    env_profile,
    memory_estimate,
    resamples_at_once,
)
from gae_core.lab.rollouts import (
    Critic,
    LabCancelled,
    Policy,
    Progress,
    labels,
    row_zero_estimates,
    truth,
)
from gae_core.lab.settings import (
    DEFAULT_KS,
    DEFAULT_LAMBDAS,
    HORIZON_TOLERANCE,
    MAX_HORIZON,
    LabSettings,
    default_ks,
)
from gae_core.lab.states import sample_starts
from gae_core.labels import assignment, label

__all__ = [
    "BIAS2_NOTE",
    "DEFAULT_KS",
    "DEFAULT_LAMBDAS",
    "GSDE_NOTE",
    "HORIZON_TOLERANCE",
    "MAX_HORIZON",
    "MEMORY_LIMIT",
    "Critic",
    "LabCancelled",
    "LabResult",
    "LabSettings",
    "LabTooLarge",
    "MemoryEstimate",
    "Policy",
    "check_memory",
    "default_ks",
    "measure",
    "measure_critics",
    "memory_estimate",
    "sample_starts",
    "trade_off_sentence",
]

#: Why a bias² can read below 0 (the page's caption and the CLI say it beside the numbers).
BIAS2_NOTE = (
    "bias² is the unbiased estimate (both means' noise subtracted), so it can dip below 0 "
    "where the critic is nearly exact, and by more, with the MSE and its interval, where few "
    "states, truth rollouts or continuations leave that noise large"
)

#: What the lab measures for a run that explored with gSDE (``use_sde``).
GSDE_NOTE = (
    "This run explored with gSDE: its rollouts held one noise matrix per env for a whole "
    "rollout, so their actions' noise is correlated in time. The lab draws each step's noise "
    "afresh from the same per-step Gaussian, the policy the training loss scores "
    "(gae_core.agent.policy), so it measures the estimators under that policy, not under the "
    "trained rollouts' correlated exploration."
)


@dataclass
class LabResult:
    """What the lab measured. ``estimators``: one row per estimator (``kind`` δ, k-step or GAE,
    ``param`` k or λ) with bias², variance and MSE averaged over states and their CIs.
    ``states``: per state, the target and its parts. ``per_state``: per state and estimator,
    mean, variance, bias² and MSE with the standard errors of the first three (delta method:
    SE(bias²) = √(4·bias²·e + 2e²) with e = s²/K + s²_Q/M; SE(s²) from the sample's fourth
    central moment). All three are the CSVs the page offers."""

    env_id: str
    settings: LabSettings
    estimators: pd.DataFrame
    states: pd.DataFrame
    per_state: pd.DataFrame
    horizon: int
    discount_left: float
    env_steps: int
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)
    #: whether a truth rollout still running at H took γ^H V̂(s_H) from the policy's critic
    #: (measurements stored before it did not)
    tail: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "settings": asdict(self.settings),
            "estimators": self.estimators.to_dict("list"),
            "states": self.states.to_dict("list"),
            "per_state": self.per_state.to_dict("list"),
            "horizon": self.horizon,
            "discount_left": self.discount_left,
            "env_steps": self.env_steps,
            "seconds": self.seconds,
            "meta": self.meta,
            "tail": self.tail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LabResult:
        settings = dict(data["settings"])
        return cls(
            env_id=data["env_id"],
            settings=LabSettings(**settings),
            estimators=pd.DataFrame(data["estimators"]),
            states=pd.DataFrame(data["states"]),
            per_state=pd.DataFrame(data["per_state"]),
            horizon=data["horizon"],
            discount_left=data["discount_left"],
            env_steps=data["env_steps"],
            seconds=data["seconds"],
            meta=data.get("meta", {}),
            tail=data.get("tail", False),
        )

    def horizon_note(self) -> str | None:
        """What the truth's horizon H (capped at :data:`MAX_HORIZON`, or given) does to the
        figures, or None. With its tail from the policy's critic (``tail``), where H leaves
        more than :data:`HORIZON_TOLERANCE` of the discount, each target carries γ^H times
        that critic's error at step H. Without it (measurements stored before, or at a γ
        other than the run's), each target misses about γ^H·V^π(s_H), taken as γ^H times the
        states' mean |V^π|: said where H leaves more than the tolerance or where that error's
        square is at least a tenth of the spread of the GAE rows' MSE over λ (the trade-off it
        can move; the least bias² or MSE would not do, as their unbiased estimates cross 0 with
        noise). Every estimator's bias² carries either error."""
        start = f"The truth stops at H = {self.horizon:,} steps with γ^H = {self.discount_left:.2g}"
        too = f"every estimator's bias² includes that error ({assignment('lambda_', 1.0)}'s too)"
        if self.tail:
            if self.discount_left <= HORIZON_TOLERANCE:
                return None
            return (
                f"{start} of the discount left (above {HORIZON_TOLERANCE:g}) and takes the rest "
                "from the policy's own critic: where episodes outlast H, each target carries "
                f"γ^H times that critic's error at step H, and {too}. A lower γ keeps the truth "
                "whole."
            )
        missing = self.discount_left * float(np.abs(self.states["v_pi"]).mean())
        mse = self.estimators.loc[self.estimators["kind"] == "gae", "mse"].to_numpy(float)
        spread = float(np.nanmax(mse) - np.nanmin(mse)) if np.isfinite(mse).any() else math.nan
        if self.discount_left <= HORIZON_TOLERANCE and not missing**2 >= 0.1 * spread:
            return None  # (also where either is unknown: NaN compares false)
        return (
            f"{start} of the discount left and takes no tail from a critic: where episodes "
            f"outlast H, each target misses the discounted return after step H (about "
            f"{missing:.2g} here), and {too}. At the run's own γ, a run's measurement (the lab "
            "page's or the CLI's) ends such rollouts with the policy's own critic instead."
        )

    def best_lambda(self) -> float:
        """The λ of least MSE."""
        gae = self.estimators[self.estimators["kind"] == "gae"]
        return float(gae.loc[gae["mse"].idxmin(), "param"])

    def sentence(self) -> str:
        """Why the least MSE is at the λ it is (:func:`trade_off_sentence`)."""
        gae = self.estimators[self.estimators["kind"] == "gae"].sort_values("param")
        return trade_off_sentence(gae["param"], gae["bias2"], gae["variance"])


def trade_off_sentence(lambdas: Sequence[float], bias2: Sequence[float],
                       variance: Sequence[float]) -> str:  # fmt: skip
    """One sentence saying where GAE's least MSE = bias² + variance lies over ``lambdas``
    (ascending, from λ = 0 to 1) and, for each side of it, which term rises from there to
    that end (the larger rise; the critic's bootstrap bias usually rises towards small λ, the
    sampled rewards' variance towards large λ, but a segment cut short gives λ = 1 bias of its
    own): each clause quotes that term at the end and at the least. When the MSE does not
    change with λ (a segment of one step) it says so."""
    lam = np.asarray(lambdas, float)
    b, v = np.asarray(bias2, float), np.asarray(variance, float)
    mse = b + v
    lam_label = label("lambda_")
    if np.ptp(mse) <= 1e-9 * max(1.0, float(np.abs(mse).max())):
        return (f"{lam_label} makes no difference here: every {lam_label} gives the same "
                f"estimate (MSE {mse[0]:.3g})")  # fmt: skip
    best = int(np.argmin(mse))
    at = assignment("lambda_", lam[best])

    def rise(end: int) -> str:
        """What grows from the least to the end ``end`` (0 or −1), and by how much."""
        where = assignment("lambda_", lam[end])
        if b[end] - b[best] >= v[end] - v[best]:
            why = "the critic's bootstrap bias" if end == 0 else "bias² (the bootstrap at the "\
                "segment's end)"  # fmt: skip
            return f"{why} grows (bias² {b[end]:.3g} at {where}, {b[best]:.3g} at {at})"
        return (f"the sampled rewards' variance grows (variance {v[end]:.3g} at {where}, "
                f"{v[best]:.3g} at {at})")  # fmt: skip

    if best == lam.size - 1:
        return f"Least MSE at {at}: towards smaller {lam_label} " + rise(0) + (
            ", the larger cost here: the rewards that follow (s, a) vary little, as on "
            "near-deterministic dynamics" if b[0] - b[best] >= v[0] - v[best] else "")  # fmt: skip
    if best == 0:
        return f"Least MSE at {at}: towards larger {lam_label} " + rise(-1) + (
            ", the larger cost here: the critic is accurate enough to bootstrap from at once"
            if v[-1] - v[best] > b[-1] - b[best] else "")  # fmt: skip
    return f"Least MSE at {at}: below it {rise(0)}; above it {rise(-1)}"


def _mean_ci(values: np.ndarray, settings: LabSettings) -> tuple[np.ndarray, ...]:
    """Mean over states (last axis) of each row, with a percentile-bootstrap interval across
    states (one vectorised scipy bootstrap for every estimator at once)."""
    point = values.mean(axis=-1)
    if values.shape[-1] < 2:
        return point, point.copy(), point.copy()
    at_once = resamples_at_once(*values.shape)
    result = scipy_stats.bootstrap(
        (values,),
        np.mean,
        axis=-1,
        vectorized=True,
        confidence_level=settings.confidence,
        n_resamples=RESAMPLES,
        batch=None if at_once == RESAMPLES else at_once,
        method="percentile",
        rng=np.random.default_rng(settings.seed),
    )
    return point, result.confidence_interval.low, result.confidence_interval.high


def measure(
    env_id: str,
    policy: Policy,
    critic: Critic,
    settings: LabSettings,
    *,
    starts: Sequence[tuple[Any, np.ndarray, Any]] | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    tail: Critic | None = None,
) -> LabResult:
    """Measure every estimator's bias², variance and MSE (see the module docstring). ``starts``
    (state, observation, action) replaces sampling (the exactness tests pin them)."""
    (result,) = measure_critics(env_id, policy, [critic], settings, starts=starts,
                                progress=progress, cancel=cancel, tail=tail)  # fmt: skip
    return result


def measure_critics(
    env_id: str,
    policy: Policy,
    critics: Sequence[Critic],
    settings: LabSettings,
    *,
    starts: Sequence[tuple[Any, np.ndarray, Any]] | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
    tail: Critic | None = None,
) -> list[LabResult]:
    """:func:`measure` for several critics on the *same* states, truth rollouts and
    continuations (common random numbers: the critics' differences are not sampling noise);
    ``tail``: the critic whose γ^H V̂(s_H) ends a truth rollout still running at H (a run's
    measurements pass the policy's own; None: the truth stops at H)."""
    started = time.perf_counter()
    n = settings.states if starts is None else len(starts)
    check_memory(env_id, settings, critics=len(critics), states=n)  # before any work
    batch = batch_size(env_profile(env_id).kind)
    rng = np.random.default_rng(settings.seed)
    if starts is None:
        starts = sample_starts(env_id, policy, settings.states, rng, settings.seed)
    n = len(starts)
    tracker = Progress(settings.env_steps(n), progress, cancel)
    q_returns, v_returns = truth(env_id, policy, starts, settings, rng, tracker, batch, tail)
    table = row_zero_estimates(env_id, policy, critics, starts, settings, rng, tracker, batch)
    observations = np.stack([obs for _, obs, _ in starts])
    names = labels(settings)
    results = []
    for critic, estimates in zip(critics, table, strict=True):
        v_hat = np.asarray(critic.values(observations), float)
        results.append(_summarise(env_id, settings, estimates, names, q_returns, v_returns, v_hat))
    for result in results:
        result.env_steps = tracker.done
        result.seconds = time.perf_counter() - started
        result.tail = tail is not None
    return results


def _summarise(
    env_id: str,
    settings: LabSettings,
    estimates: np.ndarray,
    labels: list[tuple[str, float]],
    q_returns: np.ndarray,
    v_returns: np.ndarray,
    v_hat: np.ndarray,
) -> LabResult:
    """Per-state and averaged statistics of one critic's estimates (module docstring)."""
    n, m = q_returns.shape
    k = settings.continuations
    estimates = estimates.reshape(len(labels), n, k)
    q_hat, v_pi = q_returns.mean(axis=1), v_returns.mean(axis=1)
    target = q_hat - v_hat
    noise = q_returns.var(axis=1, ddof=1) / m
    means, variances = estimates.mean(axis=-1), estimates.var(axis=-1, ddof=1)
    bias2 = (means - target) ** 2 - variances / k - noise  # unbiased per state (docstring)
    mse = bias2 + variances
    # Standard errors of the per-state figures (delta method): how far a state's Monte-Carlo
    # figure may sit from the exact one; the chain's exactness tests compare within them.
    error_var = variances / k + noise  # variance of (m − target)
    bias2_se = np.sqrt(4.0 * np.maximum(bias2, 0.0) * error_var + 2.0 * error_var**2)
    centred4 = ((estimates - means[..., None]) ** 4).mean(axis=-1)
    variance_se = np.sqrt(np.maximum(centred4 - variances**2 * (k - 3) / (k - 1), 0.0) / k)

    rows = {"kind": [kind for kind, _ in labels], "param": [param for _, param in labels]}
    for name, values in (("bias2", bias2), ("variance", variances), ("mse", mse)):
        point, low, high = _mean_ci(values, settings)
        rows |= {name: point, f"{name}_ci_low": low, f"{name}_ci_high": high}
    states_frame = pd.DataFrame(
        {
            "state": np.arange(n),
            "q_hat": q_hat,
            "q_se": np.sqrt(noise),
            "v_pi": v_pi,
            "v_hat": v_hat,
            "target": target,
            "offset": v_pi - v_hat,
        }
    )
    per_state = pd.DataFrame(
        {
            "state": np.tile(np.arange(n), len(labels)),
            "kind": np.repeat(rows["kind"], n),
            "param": np.repeat(rows["param"], n),
            "mean": means.reshape(-1),
            "mean_se": np.sqrt(variances / k).reshape(-1),
            "variance": variances.reshape(-1),
            "variance_se": variance_se.reshape(-1),
            "bias2": bias2.reshape(-1),
            "bias2_se": bias2_se.reshape(-1),
            "mse": mse.reshape(-1),
        }
    )
    horizon = settings.truth_horizon
    return LabResult(
        env_id=env_id,
        settings=settings,
        estimators=pd.DataFrame(rows),
        states=states_frame,
        per_state=per_state,
        horizon=horizon,
        discount_left=settings.gamma**horizon,
        env_steps=0,
        seconds=0.0,
    )
