"""How much memory a measurement of the estimator lab needs, estimated before it starts, and the
limit past which it is refused (:func:`check_memory`: one line naming the fields to lower; the
CLI exits 2 and the page does not start).

The lab never holds anything of size L·N·K (segment × states × continuations): it keeps each
critic's estimates at row 0 and steps env copies in batches, so its peak is sized by N·K times
the number of estimators, the truth's N·M returns, and the episodes sampled for the starts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from gae_core.errors import ConfigError
from gae_core.lab.settings import LabSettings
from gae_core.lab.states import state_access

__all__ = [
    "MEMORY_LIMIT",
    "LabTooLarge",
    "MemoryEstimate",
    "batch_size",
    "check_memory",
    "memory_estimate",
    "resamples_at_once",
]

#: The most memory one measurement may take: :func:`check_memory` refuses larger settings before
#: any work, in one line naming the fields to lower (the CLI exits 2, the page does not start).
MEMORY_LIMIT = 2 * 2**30
#: Env copies stepped together at most: bounds the policy's and the critics' forward batches.
MAX_BATCH = 65_536
#: Memory for the env copies stepped together; a batch holds as many copies as fit in it.
SIMULATOR_BUDGET = 256 * 2**20
#: Resident bytes of one env copy, per kind (measured on gymnasium 1.4, rounded up): CartPole's
#: numpy-vectorised env keeps a column per copy, the other classic envs and the chain are a
#: Python object each, a MuJoCo env holds a model and data of its own (1.1 MB for Hopper).
COPY_BYTES = {"vector": 256, "chain": 4 * 2**10, "classic": 8 * 2**10, "mujoco": 2 * 2**20}
#: Bytes per row of a network's forward pass (a policy's or a critic's, one at a time).
FORWARD_BYTES = 2 * 2**10
#: Rows of δ multiplied into the estimates at once (:mod:`gae_core.lab.rollouts`).
ROWS_PER_PRODUCT = 32
#: Bootstrap resamples, and the memory they may take at once (scipy's ``batch``).
RESAMPLES = 2000
BOOTSTRAP_BUDGET = 256 * 2**20


class LabTooLarge(ConfigError):
    """Settings whose measurement would need more than :data:`MEMORY_LIMIT`; the message names
    the estimate, the limit and the fields to lower."""


@dataclass(frozen=True)
class MemoryEstimate:
    """What a measurement needs at its peak (``bytes``), the stage that peaks and the
    settings that size it (a phrase naming the fields), and the fields that would lower it."""

    bytes: int
    sized_by: str
    lower: str


@dataclass(frozen=True)
class _EnvProfile:
    kind: str  # a key of COPY_BYTES
    observation: int  # floats per observation
    state: int  # bytes of one saved state (sample_starts keeps one per visited step)
    episode_cap: int  # the spec's time limit: steps of a start-sampling episode at most


def _held_bytes(value: Any) -> int:
    """Bytes a saved state holds: arrays with their headers, tuples of them, scalars."""
    if isinstance(value, np.ndarray):
        return 112 + value.nbytes
    if isinstance(value, tuple | list):
        return 56 + 8 * len(value) + sum(_held_bytes(v) for v in value)
    return 32


@functools.lru_cache(maxsize=64)
def env_profile(env_id: str) -> _EnvProfile:
    """``env_id``'s sizes (one env made and closed); ``UnsupportedEnvError`` for an env whose
    state the lab cannot restore."""
    access = state_access(env_id)
    spec = gym.spec(env_id)
    env = gym.make(env_id)
    try:
        env.reset(seed=0)
        state = access.get(env.unwrapped)
        observation = int(np.prod(env.observation_space.shape))
    finally:
        env.close()
    kind = access.family
    if kind == "classic" and spec.vector_entry_point is not None:
        kind = "vector"  # what Simulator steps: CartPole's numpy-vectorised env
    return _EnvProfile(kind, observation, _held_bytes(state), spec.max_episode_steps or 1000)


def resamples_at_once(rows: int, states: int) -> int:
    """Bootstrap resamples drawn together for ``rows`` figures over ``states`` states: all of
    them, or as many as fit in :data:`BOOTSTRAP_BUDGET` (each holds ``rows × states``)."""
    per_resample = rows * states * 8
    if per_resample * RESAMPLES <= BOOTSTRAP_BUDGET:
        return RESAMPLES
    return max(1, BOOTSTRAP_BUDGET // per_resample)


def batch_size(kind: str) -> int:
    """Env copies stepped together for an env of ``kind``."""
    return max(1, min(MAX_BATCH, SIMULATOR_BUDGET // COPY_BYTES[kind]))


def memory_estimate(
    env_id: str, settings: LabSettings, critics: int = 1, states: int | None = None
) -> MemoryEstimate:
    """The memory a measurement of ``env_id`` with ``settings`` and ``critics`` critics needs
    at its peak, stage by stage, from the sizes of what each stage holds (an upper bound: the
    tests compare it with the allocations traced on small cases). ``states``: the number of
    given start states, if not ``settings.states``.

    * sampling the start states: N env copies and every visited step of N episodes (up to the
      time limit), each a saved state, an observation and an action;
    * the truth: the N·M returns of Q^π and of V^π, and one batch of env copies with its
      per-copy arrays and a forward pass;
    * the continuations: each critic's estimates at row 0, ``[C, E, N·K]`` (E = 1 + |ks| +
      |λ|), the estimators' weights ``[E, L]``, one batch of copies, its δ rows and products;
    * the figures: the estimates, two more of one critic's (centred powers), the bootstrap's
      resamples (at most :data:`BOOTSTRAP_BUDGET`) and the per-state tables.

    Nothing of size L·N·K is ever held: the segment L only sizes the weights."""
    env = env_profile(env_id)
    n = settings.states if states is None else states
    m, k, length = settings.rollouts, settings.continuations, settings.segment
    estimators = 1 + len(settings.ks) + len(settings.lambdas)
    copy, batch = COPY_BYTES[env.kind], batch_size(env.kind)
    # one copy's arrays in a batch: observations (float32, the env's own float64 copies), its
    # reward, flags, return or δ, action and bookkeeping
    per_copy = copy + FORWARD_BYTES + 24 * env.observation + 192
    entry = 320 + env.state + 4 * env.observation  # a visited step: state, observation, action
    starts = n * (copy + FORWARD_BYTES + env.episode_cap * entry)
    kept = n * entry
    returns = 2 * n * m * 8
    truth = kept + returns + min(n * m, batch) * per_copy
    width, cont_batch = n * k, min(n * k, batch)
    table = critics * estimators * width * 8
    continuations = (
        kept
        + returns
        + table
        + estimators * length * 8
        + cont_batch * (per_copy + 8 * critics * (ROWS_PER_PRODUCT + 4) + 8 * estimators)
    )
    figures = (
        kept
        + returns
        + table
        + 2 * estimators * width * 8
        + resamples_at_once(estimators, n) * (estimators + 1) * n * 8  # resamples, indices
        + critics * estimators * n * 256  # the per-state tables
    )
    stages = {
        "starts": starts,
        "truth": truth,
        "continuations": continuations,
        "figures": figures,
    }
    peak = max(stages, key=stages.get)
    if peak == "starts":
        sized_by = f"sampling states {n:,} episodes of up to {env.episode_cap:,} steps"
        lower = "states"
    elif peak == "truth":
        sized_by = f"the truth of states {n:,} × rollouts {m:,}"
        lower = "states or rollouts"
    else:
        sized_by = (
            f"the estimates of states {n:,} × continuations {k:,} × {estimators} estimators "
            f"(δ, {len(settings.ks)} ks, {len(settings.lambdas)} lambdas) × {critics} "
            f"critic{'s' if critics != 1 else ''}"
        )
        lower = "states, continuations, lambdas or ks, or measure fewer critics"
    return MemoryEstimate(int(stages[peak]), sized_by, lower)


def check_memory(
    env_id: str, settings: LabSettings, critics: int = 1, states: int | None = None
) -> MemoryEstimate:
    """:func:`memory_estimate`, or :class:`LabTooLarge` (a ``ValueError``) past
    :data:`MEMORY_LIMIT`: one line with the estimate, the limit and the fields to lower."""
    estimate = memory_estimate(env_id, settings, critics, states)
    if estimate.bytes > MEMORY_LIMIT:
        raise LabTooLarge(
            f"the lab would need about {estimate.bytes / 2**30:.1f} GiB of memory for "
            f"{estimate.sized_by}, above its limit of {MEMORY_LIMIT / 2**30:g} GiB: lower "
            f"{estimate.lower}"
        )
    return estimate
