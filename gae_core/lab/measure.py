r"""The estimator lab: bias², variance and MSE of δ, Â^(k) and GAE(λ), measured on real rollouts
against Monte-Carlo truth.

For N states s sampled from the policy's own episodes, with the action a the policy took there:

* **Truth.** Q^π(s, a) by Monte Carlo: M rollouts that take a, then follow π, discounted with γ
  up to termination or a horizon H where γ^H ≤ 10⁻³ (at most 5,000 steps; the discount mass left,
  γ^H, is reported). Time limits are not part of the state: the truth is the infinite-horizon
  value, matching how the estimators bootstrap at a truncation. V^π(s) likewise from M rollouts
  that sample the first action too. The target of every estimator is the paper's γ-just one
  (Schulman et al. 2016, Proposition 1) with the critic's own baseline:
  target(s) = Q^π(s, a) − V̂(s). λ = 1 is then unbiased wherever the continuation terminates
  within L steps; "bias" is exactly the error the critic injects by bootstrapping. The
  state-only offset V^π(s) − V̂(s), which does not bias the policy gradient, is reported apart.
* **Estimators.** K continuations of (s, a), each a real on-policy segment of L steps (to
  termination, or cut at L and bootstrapped there, marked truncated), give δ, Â^(k) and GAE(λ)
  at their first row, computed by :mod:`gae_core.estimators` (``gae_lambda_sweep`` for the λ
  grid) with the chosen critic V̂.
* **Statistics per state.** With m the mean and s² the variance (ddof 1) of an estimator over
  the K continuations, and s²_Q the variance of the M truth returns,

  .. math::  \widehat{\mathrm{bias}^2} = (m − \widehat{target})^2 − s^2/K − s_Q^2/M,

  the unbiased estimate of the squared bias (both means carry sampling noise, whose expected
  squares are subtracted; a state's estimate can fall below 0, the average over states cannot be
  biased by clipping it), variance = s², MSE = bias² + variance. Averages over states come with
  percentile-bootstrap confidence intervals across states.

Rollouts of all states run as one batch (:class:`~gae_core.lab.states.Simulator`). Deterministic
for a given seed; ``progress`` gets the fraction done; ``cancel`` stops it between steps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from gae_core import estimators
from gae_core.lab.states import Simulator, sample_starts
from gae_core.labels import assignment

__all__ = [
    "GSDE_NOTE",
    "LabCancelled",
    "LabResult",
    "LabSettings",
    "measure",
    "measure_critics",
    "sample_starts",
]

HORIZON_TOLERANCE = 1e-3
MAX_HORIZON = 5_000
#: What the lab measures for a run that explored with gSDE (``use_sde``).
GSDE_NOTE = (
    "This run explored with gSDE: its rollouts held one noise matrix per env for a whole "
    "rollout, so their actions' noise is correlated in time. The lab draws each step's noise "
    "afresh from the same per-step Gaussian, the policy A2C's loss scores "
    "(gae_core.agent.policy), so it measures the estimators under that policy, not under the "
    "trained rollouts' correlated exploration."
)
DEFAULT_LAMBDAS = tuple(float(x) for x in np.round(np.linspace(0.0, 1.0, 101), 2))
DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def default_ks(segment: int) -> tuple[int, ...]:
    """:data:`DEFAULT_KS` below the segment length L, then L: a k past L reads the segment to
    its end, the same estimator as k = L (a given ``ks`` may still name such k)."""
    return tuple(sorted({min(k, segment) for k in DEFAULT_KS}))


class Policy(Protocol):
    def sample(self, observations: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


class Critic(Protocol):
    def values(self, observations: np.ndarray) -> np.ndarray: ...


class LabCancelled(Exception):
    """The measurement was cancelled; nothing was written."""


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not low <= value <= high
    ):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


@dataclass(frozen=True)
class LabSettings:
    """What to measure; every field is validated (``ValueError`` naming it and its range)."""

    gamma: float = 0.99
    states: int = 64
    rollouts: int = 32
    continuations: int = 32
    segment: int = 500
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    ks: tuple[int, ...] | None = None  # None: default_ks(segment)
    horizon: int | None = None
    seed: int = 0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not 0.0 <= float(self.gamma) < 1.0:
            raise ValueError(
                f"gamma must be in [0, 1) (the truth is a discounted sum), got {self.gamma!r}"
            )
        _check_int("states", self.states, 1, 4096)
        _check_int("rollouts", self.rollouts, 2, 4096)
        _check_int("continuations", self.continuations, 2, 4096)
        _check_int("segment", self.segment, 1, 10_000)
        _check_int("seed", self.seed, 0, 2**31 - 1)
        if self.horizon is not None:
            _check_int("horizon", self.horizon, 1, 100_000)
        lambdas = tuple(float(x) for x in self.lambdas)
        if not lambdas or any(not 0.0 <= x <= 1.0 for x in lambdas):
            raise ValueError(f"lambdas must be 1 or more values in [0, 1], got {self.lambdas!r}")
        given = default_ks(self.segment) if self.ks is None else self.ks
        ks = tuple(_check_int("ks", k, 1, 10**6) for k in given)
        if len(set(lambdas)) != len(lambdas) or len(set(ks)) != len(ks):
            raise ValueError("lambdas and ks may not repeat a value")
        if not 0.5 <= float(self.confidence) < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        object.__setattr__(self, "lambdas", lambdas)
        object.__setattr__(self, "ks", ks)
        object.__setattr__(self, "gamma", float(self.gamma))

    @property
    def truth_horizon(self) -> int:
        """H: the given horizon, else the smallest with γ^H ≤ 10⁻³ (at most 5,000)."""
        if self.horizon is not None:
            return self.horizon
        if self.gamma == 0.0:
            return 1
        return min(
            MAX_HORIZON, max(1, math.ceil(math.log(HORIZON_TOLERANCE) / math.log(self.gamma)))
        )

    def env_steps(self, states: int | None = None) -> int:
        """Env steps the measurement takes at most (sampling the states not counted)."""
        n = self.states if states is None else states
        return n * (2 * self.rollouts * self.truth_horizon + self.continuations * self.segment)


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
        )

    def horizon_note(self) -> str | None:
        """What a short truth does to the figures, or None: when the truth horizon H (capped at
        :data:`MAX_HORIZON`, or given) leaves more than :data:`HORIZON_TOLERANCE` of the
        discount, a policy whose episodes outlast H has targets that miss its return after
        step H, and every estimator's bias² carries that error, λ = 1's too."""
        if self.discount_left <= HORIZON_TOLERANCE:
            return None
        return (
            f"The truth stops at H = {self.horizon:,} steps with γ^H = {self.discount_left:.2g} "
            f"of the discount left (above {HORIZON_TOLERANCE:g}): where episodes outlast H, "
            "each target misses the discounted return after step H, and every estimator's "
            f"bias² includes that error ({assignment('lambda_', 1.0)}'s too). A lower γ keeps "
            "the truth whole."
        )

    def best_lambda(self) -> float:
        """The λ of least MSE."""
        gae = self.estimators[self.estimators["kind"] == "gae"]
        return float(gae.loc[gae["mse"].idxmin(), "param"])


class _Progress:
    def __init__(self, total: int, callback: Callable[[float], None] | None, cancel: Any) -> None:
        self.total, self.done, self.callback, self.cancel = max(total, 1), 0, callback, cancel

    def step(self, steps: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise LabCancelled("the lab was cancelled")
        self.done += steps
        if self.callback is not None:
            self.callback(min(1.0, self.done / self.total))


def _truth(
    env_id: str,
    policy: Policy,
    starts: Sequence[tuple[Any, np.ndarray, Any]],
    settings: LabSettings,
    rng: np.random.Generator,
    progress: _Progress,
) -> tuple[np.ndarray, np.ndarray]:
    """``[N, M]`` discounted returns from (s, a) (for Q^π) and from s (for V^π)."""
    m, gamma, horizon = settings.rollouts, settings.gamma, settings.truth_horizon
    states = [s for s, _, _ in starts for _ in range(m)]
    actions = [a for _, _, a in starts for _ in range(m)]
    out = []
    for first in (actions, None):
        sim = Simulator(env_id, len(states), seed=settings.seed)
        try:
            obs = sim.set_states(states)
            total = np.zeros(len(states))
            alive = np.ones(len(states), bool)
            discount = 1.0
            for step in range(horizon):
                chosen = np.asarray(first) if step == 0 and first is not None else None
                obs, rewards, terminated = sim.step(
                    chosen if chosen is not None else policy.sample(obs, rng)
                )
                total += np.where(alive, discount * rewards, 0.0)
                alive &= ~terminated
                discount *= gamma
                progress.step(len(states))
                if not alive.any():
                    progress.step(len(states) * (horizon - step - 1))
                    break
        finally:
            sim.close()
        out.append(total.reshape(len(starts), m))
    return out[0], out[1]


def _continuations(
    env_id: str,
    policy: Policy,
    starts: Sequence[tuple[Any, np.ndarray, Any]],
    settings: LabSettings,
    rng: np.random.Generator,
    progress: _Progress,
) -> tuple[np.ndarray, ...]:
    """K segments of L steps from each (s, a): observations ``[L+1, N·K, d]`` and rewards,
    terminated, exists ``[L, N·K]`` (column n·K + k is continuation k of state n). Rows after a
    termination are padding: reward 0, marked terminated, so no estimator at row 0 reaches
    them."""
    k, length = settings.continuations, settings.segment
    states = [s for s, _, _ in starts for _ in range(k)]
    first = np.asarray([a for _, _, a in starts for _ in range(k)])
    width = len(states)
    sim = Simulator(env_id, width, seed=settings.seed + 1)
    try:
        obs = sim.set_states(states)
        observations = np.zeros((length + 1, width, obs.shape[1]), np.float32)
        observations[0] = obs
        rewards = np.zeros((length, width))
        terminated = np.ones((length, width), bool)
        exists = np.zeros((length, width), bool)
        alive = np.ones(width, bool)
        for t in range(length):
            obs, step_rewards, step_terminated = sim.step(
                first if t == 0 else policy.sample(obs, rng)
            )
            exists[t] = alive
            rewards[t] = np.where(alive, step_rewards, 0.0)
            terminated[t] = ~alive | step_terminated
            observations[t + 1] = obs
            alive &= ~step_terminated
            progress.step(width)
            if not alive.any():
                progress.step(width * (length - t - 1))
                break
    finally:
        sim.close()
    return observations, rewards, terminated, exists


def _estimator_inputs(rollouts: tuple[np.ndarray, ...], critic: Critic) -> tuple[np.ndarray, ...]:
    """The continuations valued by ``critic``: ``rewards, values, next_values, terminated,
    truncated`` ``[L, N·K]``; padding rows get values 0."""
    observations, rewards, terminated, exists = rollouts
    length, width = rewards.shape
    flat = observations.reshape(-1, observations.shape[-1])
    values = np.concatenate(
        [critic.values(flat[i : i + 65_536]) for i in range(0, len(flat), 65_536)]
    ).reshape(length + 1, width)
    current = np.where(exists, values[:-1], 0.0)
    following = np.where(exists, values[1:], 0.0)
    truncated = np.zeros((length, width), bool)
    truncated[-1] = exists[-1] & ~terminated[-1]  # cut at L: bootstrapped, marked truncated
    return rewards, current, following, terminated, truncated


def _first_row_estimates(
    inputs: tuple[np.ndarray, ...], settings: LabSettings
) -> tuple[np.ndarray, list[tuple[str, float]]]:
    """``[E, N·K]`` estimates at row 0 of every continuation, and the (kind, param) of each
    row: δ, Â^(k) for each k, GAE(λ) for each λ — all from :mod:`gae_core.estimators`."""
    gamma = settings.gamma
    rewards, current, following, terminated, _ = inputs
    delta = estimators.td_residuals(
        rewards[:1], current[:1], following[:1], terminated[:1], gamma=gamma
    )[0]
    k_step = estimators.k_step_advantages(*inputs, gamma=gamma, k=list(settings.ks))[:, 0, :]
    width = rewards.shape[1]
    gae = np.empty((len(settings.lambdas), width))
    chunk = max(1, 20_000_000 // (len(settings.lambdas) * rewards.shape[0]))
    for start in range(0, width, chunk):
        cols = slice(start, start + chunk)
        sweep = estimators.gae_lambda_sweep(
            *(x[:, cols] for x in inputs), gamma=gamma, lambdas=list(settings.lambdas)
        )
        gae[:, cols] = sweep[:, 0, :]
    labels = [("delta", 1.0)]
    labels += [("k_step", float(k)) for k in settings.ks]
    labels += [("gae", lam) for lam in settings.lambdas]
    return np.vstack([delta[None], k_step, gae]), labels


def _mean_ci(values: np.ndarray, settings: LabSettings) -> tuple[np.ndarray, ...]:
    """Mean over states (last axis) of each row, with a percentile-bootstrap interval across
    states (one vectorised scipy bootstrap for every estimator at once)."""
    point = values.mean(axis=-1)
    if values.shape[-1] < 2:
        return point, point.copy(), point.copy()
    result = scipy_stats.bootstrap(
        (values,),
        np.mean,
        axis=-1,
        vectorized=True,
        confidence_level=settings.confidence,
        n_resamples=2000,
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
) -> LabResult:
    """Measure every estimator's bias², variance and MSE (see the module docstring). ``starts``
    (state, observation, action) replaces sampling (the exactness tests pin them)."""
    (result,) = measure_critics(
        env_id, policy, [critic], settings, starts=starts, progress=progress, cancel=cancel
    )
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
) -> list[LabResult]:
    """:func:`measure` for several critics on the *same* states, truth rollouts and
    continuations (common random numbers: the critics' differences are not sampling noise)."""
    started = time.perf_counter()
    rng = np.random.default_rng(settings.seed)
    if starts is None:
        starts = sample_starts(env_id, policy, settings.states, rng, settings.seed)
    n = len(starts)
    tracker = _Progress(settings.env_steps(n), progress, cancel)
    q_returns, v_returns = _truth(env_id, policy, starts, settings, rng, tracker)
    rollouts = _continuations(env_id, policy, starts, settings, rng, tracker)
    observations = np.stack([obs for _, obs, _ in starts])
    results = []
    for critic in critics:
        estimates, labels = _first_row_estimates(_estimator_inputs(rollouts, critic), settings)
        v_hat = np.asarray(critic.values(observations), float)
        results.append(_summarise(env_id, settings, estimates, labels, q_returns, v_returns, v_hat))
    for result in results:
        result.env_steps = tracker.done
        result.seconds = time.perf_counter() - started
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
