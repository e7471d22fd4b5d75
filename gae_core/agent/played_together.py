"""Several replays played at once: deterministic evaluations and recorded episodes of the
members of a trainer (or copies of them frozen at an earlier update), one stacked forward pass
of their actors per env step.

Each plays exactly what it would play alone: its own envs seeded as alone
(:func:`~gae_core.agent.recording.evaluate_policies`,
:func:`~gae_core.agent.recording.record_replays`), its own generator, its own frozen
normalisation (:class:`~gae_core.agent.recording.Replay`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gae_core.agent.policy import sample_actions
from gae_core.agent.recording import Replay, evaluate_policies, record_replays
from gae_core.agent.stacked import StackedMLP
from gae_core.trajectory import Trajectory

__all__ = ["evaluate_replays", "record_replays_together"]


def _inputs(replays: Sequence[Replay], obs: np.ndarray) -> torch.Tensor:
    """Raw observations ``[K, B, D]`` as each replay's policy sees them (its statistics)."""
    if all(r.obs_mean is None for r in replays):
        return torch.from_numpy(np.ascontiguousarray(obs, np.float32))
    return torch.stack([r.policy_input(o) for r, o in zip(replays, obs, strict=True)])


def evaluate_replays(
    replays: Sequence[Replay], env_id: str, episodes: int, seeds: Sequence[int]
) -> list[list[float]]:
    """Returns of ``episodes`` deterministic episodes (argmax / mean actions) of each replay,
    replay k on the envs ``seeds[k]`` gives (as
    :func:`~gae_core.agent.recording.evaluate_replay` of it alone would play)."""
    _check(len(replays), seeds)
    actor = StackedMLP([r.model.actor for r in replays])
    discrete = replays[0].model.discrete

    def act(obs: np.ndarray) -> np.ndarray:  # [replays, episodes, obs...]
        with torch.inference_mode():
            out = actor(_inputs(replays, obs)).numpy()
        return out.argmax(axis=-1) if discrete else out.astype(np.float32)

    return evaluate_policies(act, env_id, episodes, seeds)


def record_replays_together(
    replays: Sequence[Replay], env_id: str, episodes: int, seeds: Sequence[int]
) -> list[list[Trajectory]]:
    """The episodes :func:`~gae_core.agent.recording.record_replay` of each replay alone would
    record (sampled actions, replay k's own env and generator seeded ``seeds[k]``), played in
    lockstep with one stacked forward pass of their actors per step (gSDE policies, whose noise
    depends on each one's features, sample one by one)."""
    _check(len(replays), seeds)
    if any(r.model.sde for r in replays):
        return record_replays(replays, env_id, episodes, seeds)
    actor = StackedMLP([r.model.actor for r in replays])
    stds = [
        None if r.model.discrete else np.exp(r.model.log_std.detach().cpu().numpy())
        for r in replays
    ]  # fmt: skip

    def sample(obs: np.ndarray, playing: list[int], generators: list) -> list[np.ndarray]:
        with torch.inference_mode():
            out = actor(_inputs(replays, obs[:, None, :])).numpy()
        return [sample_actions(out[k], generators[k], stds[k])[0] for k in playing]

    return record_replays(replays, env_id, episodes, seeds, sample)


def _check(members: int, seeds: Sequence[int]) -> None:
    if len(seeds) != members:
        raise ValueError(f"seeds: one per member, got {len(seeds)} for {members}")
