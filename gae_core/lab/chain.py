r"""A random-walk chain where every moment of δ, Â^(k) and GAE(γ, λ) is exact: the lab's anchor.

**The MDP.** Positions 0 … n−1, start in the middle (``n // 2``); actions 0 = left, 1 = right,
moves are deterministic; positions 0 and n−1 are terminal. Every step pays ``step_reward``,
entering n−1 pays ``right_reward`` (+1) on top, entering 0 pays ``left_reward`` (0). The policy
π(a|s) is a tabular matrix (default: right with p = 0.6 everywhere). The gymnasium env
``GAELab/RandomWalkChain-v0`` (one-hot float32 observation, TimeLimit 100) is the same MDP.

**Estimators at row 0** of a segment of L rows that starts at (s_0, a_0) and then follows π
(rows past a termination do not exist; row L−1 is an implicit cut):

    δ_l     = r_l + γ(1 − term_l) V̂(s_{l+1}) − V̂(s_l)
    Â^(k)_0 = Σ_{l<min(k, L_0)} γ^l δ_l         GAE_0 = Σ_{l<L_0} (γλ)^l δ_l

with L_0 ≤ L the rows that exist. The target is Q^π(s_0, a_0) − V̂(s_0), where Q^π and V^π are
infinite-horizon values (V^π = 0 at terminal states), so bias = E[Â] − target and
MSE = E[(Â − target)²] = bias² + Var[Â].

**Two independent computations.** (1) :func:`exact_estimator_moments` enumerates every action
sequence of the continuation (probability Π π(a_l|s_l); a path stops at termination) and
evaluates the estimators per path: exact mean and variance. (2) By linearity,
E[GAE_0] = Σ_l (γλ)^l m_l with m_l = E[δ_l·1{row l exists}], where μ_l(s) = P(s_l = s, alive)
obeys μ_1 = e_{next(s_0, a_0)}·1{not terminal}, μ_{l+1} = μ_l P_π (P_π: the policy's
transition matrix between non-terminal states) — :func:`linear_means`.

**Bias in closed form.** With e = V̂ − V^π and ε_j = Σ_s μ_j(s) e(s) (ε_0 = e(s_0)), the
non-error part of δ_l has zero mean for l ≥ 1, so the sums telescope to

    bias(GAE_λ) = (1 − λ) Σ_{j=1}^{L−1} γ^j λ^{j−1} ε_j + γ^L λ^{L−1} ε_L
    bias(Â^(k)) = γ^m ε_m,  m = min(k, L)

so δ's bias is γ ε_1 and λ = 1 (or k ≥ L) leaves γ^L E[e(s_L)·1{not terminated}]: unbiased
only when every path terminates within L rows or the critic is exact.

**Why these defaults.** With deterministic moves and a fixed a_0, δ_0 has zero variance and all its
error is the critic's bias γ e(s_1); λ = 1 trades that bias for the variance of the walk (+1 or 0,
after a random number of steps). With p = 0.6, γ = 0.95, 7 positions and critic_with_error(V^π, 0.2,
seed=0), the segment of L = 8 from (3, right) has MSE(λ) minimal near λ ≈ 0.3, ~1.7× below δ's and
~12× below λ = 1's: the lab's U-shaped trade-off. step_reward = 0 keeps values in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "GAELab/RandomWalkChain-v0"
MAX_EPISODE_STEPS = 100
DEFAULT_P_RIGHT = 0.6
DEFAULT_GAMMA = 0.95
MAX_SEGMENT = 20  # 2^19 paths: enumeration stays in memory; the lab needs ≤ ~12
MAX_SAMPLES = 1_000_000  # sampled continuations: [samples, L] arrays of a few hundred MB at most


# ----------------------------------------------------------------------------- the MDP


@dataclass(frozen=True)
class ChainSpec:
    """The chain's layout and rewards; ``start_state=None`` means the middle, ``n_states // 2``."""

    n_states: int = 7
    step_reward: float = 0.0
    left_reward: float = 0.0
    right_reward: float = 1.0
    start_state: int | None = None

    def __post_init__(self) -> None:
        if self.n_states < 3:
            raise ValueError(f"n_states must be ≥ 3 (two ends and a middle), got {self.n_states}")
        if self.start_state is not None and not 0 < self.start_state < self.n_states - 1:
            raise ValueError(f"start_state must be non-terminal, got {self.start_state}")

    @property
    def start(self) -> int:
        return self.n_states // 2 if self.start_state is None else self.start_state

    @property
    def terminal(self) -> np.ndarray:
        """Boolean mask [n_states]: True at positions 0 and n−1."""
        mask = np.zeros(self.n_states, dtype=bool)
        mask[[0, -1]] = True
        return mask


def tabular_model(spec: ChainSpec) -> tuple[np.ndarray, np.ndarray]:
    """(next_state [n, 2] int, reward [n, 2]); terminal rows are absorbing with reward 0."""
    s = np.arange(spec.n_states)
    nxt = np.stack([s - 1, s + 1], axis=1)
    reward = spec.step_reward + np.where(nxt == spec.n_states - 1, spec.right_reward, 0.0)
    reward = reward + np.where(nxt == 0, spec.left_reward, 0.0)
    # Terminal rows are never used by an episode; absorbing keeps the arrays well-defined.
    nxt[spec.terminal] = s[spec.terminal, None]
    reward[spec.terminal] = 0.0
    return nxt, reward


def policy_matrix(spec: ChainSpec, p_right: float | np.ndarray = DEFAULT_P_RIGHT) -> np.ndarray:
    """π(a|s) as [n_states, 2] (columns left, right); ``p_right`` is a scalar or one per state."""
    p = np.broadcast_to(np.asarray(p_right, dtype=float), (spec.n_states,))
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p_right must lie in [0, 1], got {p_right}")
    return np.stack([1.0 - p, p], axis=1)


def _check_policy(spec: ChainSpec, policy: np.ndarray) -> np.ndarray:
    pi = np.asarray(policy, dtype=float)
    if pi.shape != (spec.n_states, 2) or np.any(pi < 0) or not np.allclose(pi.sum(1), 1.0):
        raise ValueError(f"policy must be [{spec.n_states}, 2] with rows summing to 1")
    return pi


def policy_transition_matrix(spec: ChainSpec, policy: np.ndarray) -> np.ndarray:
    """P_π[s, s'] between non-terminal states (terminal rows and columns are 0: absorbed)."""
    pi = _check_policy(spec, policy)
    nxt, _ = tabular_model(spec)
    n = spec.n_states
    P = np.zeros((n, n))
    for a in range(2):
        np.add.at(P, (np.arange(n), nxt[:, a]), pi[:, a])
    P[spec.terminal, :] = 0.0
    P[:, spec.terminal] = 0.0
    return P


def exact_values(
    spec: ChainSpec, policy: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Infinite-horizon (V^π [n], Q^π [n, 2]) from (I − γ P_π) V = r_π; 0 at terminal states."""
    pi = _check_policy(spec, policy)
    nxt, reward = tabular_model(spec)
    r_pi = np.where(spec.terminal, 0.0, (pi * reward).sum(1))
    V = np.linalg.solve(np.eye(spec.n_states) - gamma * policy_transition_matrix(spec, pi), r_pi)
    Q = reward + gamma * np.where(spec.terminal[nxt], 0.0, V[nxt])
    Q[spec.terminal] = 0.0
    return V, Q


def critic_with_error(V_pi: np.ndarray, error_scale: float, seed: int = 0) -> np.ndarray:
    """V̂ = V^π + error_scale·N(0, 1) per state, terminal states included.

    The error is *not* zeroed at terminal states on purpose: no estimator reads V̂ there (a
    segment never starts at a terminal state, and δ at a terminating step drops V̂(s_{t+1})),
    and the tests check that changing it changes nothing — a real critic is never exact there.
    """
    rng = np.random.default_rng(seed)
    V_pi = np.asarray(V_pi, dtype=float)
    return V_pi + error_scale * rng.standard_normal(V_pi.shape)


# ----------------------------------------------------------------------------- the gym env


def observation(state: int, n_states: int = ChainSpec.n_states) -> np.ndarray:
    """One-hot float32 encoding of a position."""
    obs = np.zeros(n_states, dtype=np.float32)
    obs[state] = 1.0
    return obs


class RandomWalkChain(gym.Env[np.ndarray, np.int64]):
    """The chain as a gymnasium env; keyword arguments are :class:`ChainSpec`'s fields.

    Stepping from a terminal position (only reachable by ignoring ``terminated``) is absorbing.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's own layout)

    def __init__(self, **spec_fields: Any) -> None:
        self.chain = ChainSpec(**spec_fields)  # not `spec`: gymnasium owns that attribute
        self._next, self._reward = tabular_model(self.chain)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.chain.n_states,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = self.chain.start

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.chain.start
        return observation(self.position, self.chain.n_states), {"state": self.position}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        s, a = self.position, int(action)
        self.position = int(self._next[s, a])
        terminated = bool(self.chain.terminal[self.position])
        obs = observation(self.position, self.chain.n_states)
        return obs, float(self._reward[s, a]), terminated, False, {"state": self.position}


def register() -> None:
    """Register ``GAELab/RandomWalkChain-v0`` (TimeLimit 100); calling it again is a no-op."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=RandomWalkChain, max_episode_steps=MAX_EPISODE_STEPS)


def get_state(env: gym.Env) -> int:
    """The position of the (possibly wrapped) chain env."""
    return int(env.unwrapped.position)  # type: ignore[attr-defined]


def set_state(env: gym.Env, state: int) -> None:
    """Move the chain to ``state``; only the position changes (reset first for a fresh clock)."""
    chain: ChainSpec = env.unwrapped.chain  # type: ignore[attr-defined]
    if not 0 <= state < chain.n_states:
        raise ValueError(f"state must lie in [0, {chain.n_states}), got {state}")
    env.unwrapped.position = int(state)  # type: ignore[attr-defined]


register()


# ----------------------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class Paths:
    """Every continuation of a segment. Arrays [P, …]; rows past termination are padding."""

    prob: np.ndarray  # [P] probability of the path (sums to 1)
    states: np.ndarray  # [P, L+1] s_0 … s_L (after termination: the terminal state)
    rewards: np.ndarray  # [P, L] r_l (0 where the row does not exist)
    terminated: np.ndarray  # [P, L] True at the terminating row only
    exists: np.ndarray  # [P, L] row l is part of the segment (not past a termination)


def _check_start(spec: ChainSpec, start_state: int, start_action: int, segment: int) -> None:
    if not 0 < start_state < spec.n_states - 1:
        raise ValueError(f"start_state must be non-terminal, got {start_state}")
    if start_action not in (0, 1):
        raise ValueError(f"start_action must be 0 or 1, got {start_action}")
    if not 1 <= segment <= MAX_SEGMENT:
        raise ValueError(f"segment must lie in [1, {MAX_SEGMENT}], got {segment}")


def enumerate_paths(
    spec: ChainSpec, policy: np.ndarray, start_state: int, start_action: int, segment: int
) -> Paths:
    """All action sequences after a_0 with probability > 0; a path stops at termination."""
    _check_start(spec, start_state, start_action, segment)
    pi = _check_policy(spec, policy)
    nxt, reward = tabular_model(spec)
    L = segment
    prob = np.ones(1)
    states = np.full((1, L + 1), start_state)
    rewards = np.zeros((1, L))
    term = np.zeros((1, L), dtype=bool)
    exists = np.zeros((1, L), dtype=bool)
    exists[0, 0] = True
    for t in range(L):
        live = exists[:, t]
        # Finished paths are kept once, with their terminal state carried forward.
        parts = [np.flatnonzero(~live)]
        acts = [np.full(parts[0].size, -1)]
        for a in (start_action,) if t == 0 else (0, 1):
            # a_0 is given (even if π(a_0|s_0) = 0); later zero-probability branches are dropped.
            idx = np.flatnonzero(live & ((t == 0) | (pi[states[:, t], a] > 0)))
            parts.append(idx)
            acts.append(np.full(idx.size, a))
        idx, act = np.concatenate(parts), np.concatenate(acts)
        prob, states, rewards = prob[idx], states[idx], rewards[idx]
        term, exists = term[idx], exists[idx]
        moved = act >= 0
        s = states[moved, t]
        if t > 0:
            prob[moved] *= pi[s, act[moved]]
        states[:, t + 1] = states[:, t]
        states[moved, t + 1] = nxt[s, act[moved]]
        rewards[moved, t] = reward[s, act[moved]]
        term[moved, t] = spec.terminal[states[moved, t + 1]]
        if t + 1 < L:
            exists[:, t + 1] = exists[:, t] & ~term[:, t]
    return Paths(prob, states, rewards, term, exists)


def path_deltas(paths: Paths, critic: np.ndarray, gamma: float) -> np.ndarray:
    """δ_l per path [P, L]; 0 on rows that do not exist, so sums over l stop at termination."""
    v = np.asarray(critic, dtype=float)
    s, s_next = paths.states[:, :-1], paths.states[:, 1:]
    boot = np.where(paths.terminated, 0.0, v[s_next])  # no V̂(s_{t+1}) after termination
    return np.where(paths.exists, paths.rewards + gamma * boot - v[s], 0.0)


def gae_weights(gamma: float, lambdas: np.ndarray, segment: int) -> np.ndarray:
    """[Λ, L] weights (γλ)^l of δ_l in GAE_0 (0^0 = 1, so λ = 0 gives δ_0)."""
    return np.power(gamma * np.asarray(lambdas, float)[:, None], np.arange(segment)[None, :])


def k_step_weights(gamma: float, ks: np.ndarray, segment: int) -> np.ndarray:
    """[K, L] weights γ^l·1{l < k} of δ_l in Â^(k)_0."""
    lag = np.arange(segment)[None, :]
    return np.where(lag < np.asarray(ks)[:, None], np.power(float(gamma), lag), 0.0)


@dataclass(frozen=True)
class Moments:
    """Exact mean and variance of estimators against one target."""

    mean: np.ndarray
    variance: np.ndarray
    target: float

    @property
    def bias(self) -> np.ndarray:
        return self.mean - self.target

    @property
    def mse(self) -> np.ndarray:
        return self.bias**2 + self.variance


@dataclass(frozen=True)
class EstimatorMoments:
    """Moments of δ_0, Â^(k)_0 (one per k) and GAE_0 (one per λ) for one (s_0, a_0, L)."""

    target: float  # Q^π(s_0, a_0) − V̂(s_0)
    state_offset: float  # V^π(s_0) − V̂(s_0): the part of the target due to the critic
    delta: Moments  # 0-d arrays
    k_step: Moments  # [K]
    gae: Moments  # [Λ]
    ks: np.ndarray = field(repr=False)
    lambdas: np.ndarray = field(repr=False)
    n_paths: int = 0


def _moments(prob: np.ndarray, values: np.ndarray, target: float) -> Moments:
    shifted = values - values[0]  # a value equal on every path: variance exactly 0
    offset = prob @ shifted
    return Moments(values[0] + offset, prob @ (shifted - offset) ** 2, target)


def _target(spec: ChainSpec, policy, critic, gamma: float, s0: int, a0: int) -> tuple[float, float]:
    """The target Q^π(s_0, a_0) − V̂(s_0) and V^π(s_0) − V̂(s_0) (the critic's error at s_0)."""
    V, Q = exact_values(spec, policy, gamma)
    return float(Q[s0, a0] - critic[s0]), float(V[s0] - critic[s0])


def exact_estimator_moments(
    spec: ChainSpec,
    policy: np.ndarray,
    critic: np.ndarray,
    gamma: float,
    start_state: int,
    start_action: int,
    segment: int,
    lambdas: np.ndarray,
    ks: np.ndarray,
) -> EstimatorMoments:
    """Exact moments by enumerating every continuation (≤ 2^(L−1) paths)."""
    paths = enumerate_paths(spec, policy, start_state, start_action, segment)
    deltas = path_deltas(paths, critic, gamma)
    lambdas, ks = np.atleast_1d(np.asarray(lambdas, float)), np.atleast_1d(np.asarray(ks, int))
    target, offset = _target(spec, policy, critic, gamma, start_state, start_action)
    return EstimatorMoments(
        target=target,
        state_offset=offset,
        delta=_moments(paths.prob, deltas[:, 0], target),
        k_step=_moments(paths.prob, deltas @ k_step_weights(gamma, ks, segment).T, target),
        gae=_moments(paths.prob, deltas @ gae_weights(gamma, lambdas, segment).T, target),
        ks=ks,
        lambdas=lambdas,
        n_paths=int(paths.prob.size),
    )


@dataclass(frozen=True)
class SampledMoments:
    """GAE_0's moments per λ from ``samples`` continuations: sample bias², variance (1/n) and
    MSE = mean of (Â − target)² = bias² + variance, with the MSE's standard error."""

    lambdas: np.ndarray
    bias2: np.ndarray
    variance: np.ndarray
    mse: np.ndarray
    mse_se: np.ndarray
    samples: int


def sample_paths(
    spec: ChainSpec,
    policy: np.ndarray,
    start_state: int,
    start_action: int,
    segment: int,
    samples: int,
    rng: np.random.Generator,
) -> Paths:
    """``samples`` continuations drawn by stepping the chain (a_0 given, then a ~ π), each of
    weight 1/samples: the same layout as :func:`enumerate_paths`, so the same estimators apply."""
    _check_start(spec, start_state, start_action, segment)
    pi = _check_policy(spec, policy)
    nxt, reward = tabular_model(spec)
    n, L = int(samples), segment
    states = np.full((n, L + 1), start_state)
    rewards = np.zeros((n, L))
    term = np.zeros((n, L), dtype=bool)
    exists = np.zeros((n, L), dtype=bool)
    exists[:, 0] = True
    action = np.full(n, start_action)
    for t in range(L):
        s = states[:, t]
        states[:, t + 1] = np.where(exists[:, t], nxt[s, action], s)
        rewards[:, t] = np.where(exists[:, t], reward[s, action], 0.0)
        term[:, t] = exists[:, t] & spec.terminal[states[:, t + 1]]
        if t + 1 < L:
            exists[:, t + 1] = exists[:, t] & ~term[:, t]
        action = (rng.random(n) < pi[states[:, t + 1], 1]).astype(int)
    return Paths(np.full(n, 1.0 / n), states, rewards, term, exists)


def sampled_gae_moments(
    spec: ChainSpec,
    policy: np.ndarray,
    critic: np.ndarray,
    gamma: float,
    start_state: int,
    start_action: int,
    segment: int,
    lambdas: np.ndarray,
    samples: int,
    seed: int = 0,
) -> SampledMoments:
    """GAE_0's moments over λ estimated from ``samples`` sampled continuations
    (:func:`sample_paths`) against the exact target: the Monte-Carlo points the lab draws on
    :func:`exact_estimator_moments`' curves."""
    if not 2 <= samples <= MAX_SAMPLES:
        raise ValueError(f"samples must be an integer in [2, {MAX_SAMPLES:,}], got {samples}")
    rng = np.random.default_rng(seed)
    paths = sample_paths(spec, policy, start_state, start_action, segment, samples, rng)
    lambdas = np.atleast_1d(np.asarray(lambdas, float))
    values = path_deltas(paths, critic, gamma) @ gae_weights(gamma, lambdas, segment).T
    target, _ = _target(spec, policy, critic, gamma, start_state, start_action)
    squared = (values - target) ** 2
    moments = _moments(paths.prob, values, target)
    return SampledMoments(
        lambdas, moments.bias**2, moments.variance, squared.mean(0),
        squared.std(0, ddof=1) / np.sqrt(samples), int(samples),
    )  # fmt: skip


# ----------------------------------------------------------------------------- linearity


def state_distribution(
    spec: ChainSpec, policy: np.ndarray, start_state: int, start_action: int, segment: int
) -> np.ndarray:
    """μ [L+1, n]: μ_l(s) = P(s_l = s and not terminated before l); μ_L is where a cut lands."""
    _check_start(spec, start_state, start_action, segment)
    P = policy_transition_matrix(spec, policy)
    nxt, _ = tabular_model(spec)
    mu = np.zeros((segment + 1, spec.n_states))
    mu[0, start_state] = 1.0
    s1 = nxt[start_state, start_action]
    mu[1, s1] = 0.0 if spec.terminal[s1] else 1.0  # a_0 is given, not drawn from π
    for t in range(1, segment):
        mu[t + 1] = mu[t] @ P  # μ_l = μ_1 P_π^(l−1)
    return mu


def expected_deltas(
    spec: ChainSpec,
    policy: np.ndarray,
    critic: np.ndarray,
    gamma: float,
    start_state: int,
    start_action: int,
    segment: int,
) -> np.ndarray:
    """m [L]: m_l = E[δ_l·1{row l exists}], from μ_l and the per-(s, a) expected δ."""
    pi = _check_policy(spec, policy)
    v = np.asarray(critic, dtype=float)
    nxt, reward = tabular_model(spec)
    d = reward + gamma * np.where(spec.terminal[nxt], 0.0, v[nxt]) - v[:, None]  # δ(s, a)
    mu = state_distribution(spec, pi, start_state, start_action, segment)
    m = mu[1:segment] @ (pi * d).sum(1)
    return np.concatenate([[d[start_state, start_action]], m])


def linear_means(
    spec: ChainSpec,
    policy: np.ndarray,
    critic: np.ndarray,
    gamma: float,
    start_state: int,
    start_action: int,
    segment: int,
    lambdas: np.ndarray,
    ks: np.ndarray,
) -> tuple[float, np.ndarray, np.ndarray]:
    """(E[δ_0], E[Â^(k)_0] [K], E[GAE_0] [Λ]) by linearity — independent of the enumeration."""
    m = expected_deltas(spec, policy, critic, gamma, start_state, start_action, segment)
    lambdas, ks = np.atleast_1d(np.asarray(lambdas, float)), np.atleast_1d(np.asarray(ks, int))
    return (
        float(m[0]),
        k_step_weights(gamma, ks, segment) @ m,
        gae_weights(gamma, lambdas, segment) @ m,
    )
