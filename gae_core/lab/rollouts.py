"""The estimator lab's rollouts: the Monte-Carlo truth and the continuations whose estimates at row
0 it keeps, env copies stepped in batches (:class:`~gae_core.lab.states.Simulator`), progress
reported and cancel honoured between steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from gae_core.lab import chain
from gae_core.lab.memory import ROWS_PER_PRODUCT
from gae_core.lab.settings import LabSettings
from gae_core.lab.states import Simulator

__all__ = [
    "Critic",
    "LabCancelled",
    "Policy",
    "Progress",
    "labels",
    "row_zero_estimates",
    "truth",
]


class Policy(Protocol):
    def sample(self, observations: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


class Critic(Protocol):
    def values(self, observations: np.ndarray) -> np.ndarray: ...


class LabCancelled(Exception):
    """The measurement was cancelled; nothing was written."""


class Progress:
    """Work done out of ``total`` (env steps, or any units of the same cost): each
    :meth:`step` reports the fraction to ``callback`` and raises :class:`LabCancelled` once
    ``cancel`` (a ``threading.Event``) is set."""

    def __init__(self, total: float, callback: Callable[[float], None] | None, cancel: Any) -> None:
        self.total, self.done, self.callback, self.cancel = max(total, 1), 0, callback, cancel

    def step(self, steps: float) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise LabCancelled("the lab was cancelled")
        self.done += steps
        if self.callback is not None:
            self.callback(min(1.0, self.done / self.total))


def _blocks(width: int, batch: int) -> list[slice]:
    """Columns ``[0, width)`` in consecutive blocks of at most ``batch``."""
    return [slice(i, min(i + batch, width)) for i in range(0, width, batch)]


@contextmanager
def _simulators(env_id: str, seed: int) -> Iterator[Callable[[int], Simulator]]:
    """Simulators of the sizes asked for, each made once and closed at the end."""
    made: dict[int, Simulator] = {}

    def of_size(size: int) -> Simulator:
        if size not in made:
            made[size] = Simulator(env_id, size, seed=seed)
        return made[size]

    try:
        yield of_size
    finally:
        for sim in made.values():
            sim.close()


def truth(
    env_id: str,
    policy: Policy,
    starts: Sequence[tuple[Any, np.ndarray, Any]],
    settings: LabSettings,
    rng: np.random.Generator,
    progress: Progress,
    batch: int,
    tail: Critic | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``[N, M]`` discounted returns from (s, a) (for Q^π) and from s (for V^π), rolled out
    ``batch`` copies at a time, each to termination or the horizon H; with ``tail``, a
    rollout still running at H adds γ^H·tail(s_H), the discounted value it would go on to
    earn, so the truth misses γ^H (V^π − tail)(s_H), not γ^H V^π(s_H)."""
    m, gamma, horizon = settings.rollouts, settings.gamma, settings.truth_horizon
    width = len(starts) * m
    out = []
    for given_first in (True, False):
        total = np.zeros(width)
        with _simulators(env_id, settings.seed) as simulator:
            for cols in _blocks(width, batch):
                owners = [starts[i // m] for i in range(cols.start, cols.stop)]
                size = len(owners)
                sim = simulator(size)
                obs = sim.set_states([state for state, _, _ in owners])
                first = np.asarray([action for _, _, action in owners]) if given_first else None
                returns = total[cols]
                alive = np.ones(size, bool)
                discount = 1.0
                for step in range(horizon):
                    chosen = first if step == 0 and first is not None else None
                    obs, rewards, terminated = sim.step(
                        chosen if chosen is not None else policy.sample(obs, rng)
                    )
                    returns += np.where(alive, discount * rewards, 0.0)
                    alive &= ~terminated
                    discount *= gamma
                    progress.step(size)
                    if not alive.any():
                        progress.step(size * (horizon - step - 1))
                        break
                else:
                    if tail is not None and alive.any():
                        returns[alive] += discount * np.asarray(tail.values(obs[alive]), float)
        out.append(total.reshape(len(starts), m))
    return out[0], out[1]


class _RowZero:
    r"""δ, Â^(k) and GAE(λ) at row 0 of every continuation, summed as the rows arrive: ``table``
    ``[C, E, N·K]`` (critic, estimator as :func:`labels` orders them, continuation) and nothing
    kept per row. With δ_l = 0 on the rows past a termination (and L the segment's cut),

        Â^(k)_0 = Σ_{l<k} γ^l δ_l,        GAE(λ)_0 = Σ_l (γλ)^l δ_l,

    which is what :mod:`gae_core.estimators` gives at row 0 (``tests/test_lab.py`` checks it on
    random segments); the weights are the chain's (:func:`chain.k_step_weights`,
    :func:`chain.gae_weights`). Rows are multiplied in by blocks of :data:`ROWS_PER_PRODUCT`,
    one matrix product each. Columns come in blocks of at most ``batch``: :meth:`start` one,
    :meth:`add` its δ row after row (``[C, size]``), :meth:`finish` it."""

    def __init__(self, settings: LabSettings, critics: int, width: int, batch: int) -> None:
        gamma, length = settings.gamma, settings.segment
        self.weights = np.vstack(
            [
                chain.k_step_weights(gamma, np.asarray(settings.ks), length),
                chain.gae_weights(gamma, np.asarray(settings.lambdas), length),
            ]
        )  # [E − 1, L]
        self.table = np.zeros((critics, 1 + len(self.weights), width))
        self._rows = np.empty((critics, ROWS_PER_PRODUCT, min(batch, width)))
        self._product = np.empty((len(self.weights), min(batch, width)))
        self._cols, self._size, self._row, self._held = slice(0, 0), 0, 0, 0

    def start(self, cols: slice) -> None:
        self._cols, self._size, self._row, self._held = cols, cols.stop - cols.start, 0, 0

    def add(self, deltas: np.ndarray) -> None:
        if self._row == 0:
            self.table[:, 0, self._cols] = deltas
        self._rows[:, self._held, : self._size] = deltas
        self._row += 1
        self._held += 1
        if self._held == ROWS_PER_PRODUCT:
            self._multiply()

    def finish(self) -> None:
        if self._held:
            self._multiply()

    def _multiply(self) -> None:
        size, count = self._size, self._held
        weights = self.weights[:, self._row - count : self._row]
        product = self._product[:, :size]  # strided views: BLAS takes them as they are
        for critic in range(len(self.table)):
            np.matmul(weights, self._rows[critic, :count, :size], out=product)
            self.table[critic, 1:, self._cols] += product
        self._held = 0


def labels(settings: LabSettings) -> list[tuple[str, float]]:
    """(kind, param) of each estimator, in the order of :class:`_RowZero`'s table."""
    labels = [("delta", 1.0)]
    labels += [("k_step", float(k)) for k in settings.ks]
    labels += [("gae", lam) for lam in settings.lambdas]
    return labels


def _values(critic: Critic, observations: np.ndarray) -> np.ndarray:
    if not len(observations):
        return np.zeros(0)
    return np.asarray(critic.values(observations), dtype=np.float64)


def row_zero_estimates(
    env_id: str,
    policy: Policy,
    critics: Sequence[Critic],
    starts: Sequence[tuple[Any, np.ndarray, Any]],
    settings: LabSettings,
    rng: np.random.Generator,
    progress: Progress,
    batch: int,
) -> np.ndarray:
    """``[C, E, N·K]``: each critic's estimates at row 0 of K segments of L steps from each
    (s, a) (column n·K + k is continuation k of state n), rolled out ``batch`` copies at a
    time. A segment ends at termination or is cut at L and bootstrapped there; every critic
    values the same steps, and only the states a δ needs (not a terminal one's successor)."""
    k, length, gamma = settings.continuations, settings.segment, settings.gamma
    width = len(starts) * k
    summed = _RowZero(settings, len(critics), width, batch)
    with _simulators(env_id, settings.seed + 1) as simulator:
        for cols in _blocks(width, batch):
            owners = [starts[i // k] for i in range(cols.start, cols.stop)]
            size = len(owners)
            sim = simulator(size)
            obs = sim.set_states([state for state, _, _ in owners])
            first = np.asarray([action for _, _, action in owners])
            current = np.stack([_values(critic, obs) for critic in critics])  # V̂(s_t)
            alive = np.ones(size, bool)
            summed.start(cols)
            for t in range(length):
                obs, rewards, terminated = sim.step(first if t == 0 else policy.sample(obs, rng))
                going = alive & ~terminated
                following = np.zeros_like(current)  # V̂(s_{t+1}); 0 after a termination
                for row, critic in enumerate(critics):
                    following[row, going] = _values(critic, obs[going])
                # δ_t = r_t + γ(1 − terminated_t) V̂(s_{t+1}) − V̂(s_t); 0 past a termination
                summed.add(np.where(alive, rewards + gamma * following - current, 0.0))
                current, alive = following, going
                progress.step(size)
                if not alive.any():
                    progress.step(size * (length - t - 1))
                    break
            summed.finish()
    return summed.table
