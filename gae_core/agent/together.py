"""Several actors replayed at once: deterministic evaluations and recorded episodes of stacked
networks, one forward pass per env step for all of them.

A population's members (:mod:`gae_core.agent.population`), or copies of their networks frozen
at an earlier update (what :mod:`gae_core.runs.population_run` evaluates and records once the
other members have reached the same step), play together here; each plays exactly what it
would play alone: its own envs seeded as alone (:func:`~gae_core.agent.recording.
evaluate_policies`, :func:`~gae_core.agent.recording.record_replays`), its own generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gae_core.agent.policy import ActorCritic, sample_actions
from gae_core.agent.recording import Replay, evaluate_policies, record_replays
from gae_core.agent.stacked import StackedMLP
from gae_core.trajectory import Trajectory

__all__ = ["evaluate_stacked", "record_stacked"]


def evaluate_stacked(
    actor: StackedMLP, discrete: bool, env_id: str, episodes: int, seeds: Sequence[int]
) -> list[list[float]]:
    """Returns of ``episodes`` deterministic episodes (argmax / mean actions) of each of the
    stacked ``actor``'s members, member k on the envs ``seeds[k]`` gives (as
    :func:`~gae_core.agent.recording.evaluate_replay` of its weights alone would play)."""
    _check(len(actor.weights[0]), seeds)

    def act(obs: np.ndarray) -> np.ndarray:  # [members, episodes, obs...]
        with torch.inference_mode():
            out = actor(torch.from_numpy(obs)).numpy()
        return out.argmax(axis=-1) if discrete else out.astype(np.float32)

    return evaluate_policies(act, env_id, episodes, seeds)


def record_stacked(
    models: Sequence[ActorCritic], env_id: str, episodes: int, seeds: Sequence[int]
) -> list[list[Trajectory]]:
    """The episodes :func:`~gae_core.agent.recording.record_replay` of each model alone would
    record (sampled actions, model k's own env and generator seeded ``seeds[k]``), played in
    lockstep with one stacked forward pass of their actors per step."""
    _check(len(models), seeds)
    actor = StackedMLP([m.actor for m in models])
    stds = [
        None if m.discrete else np.exp(m.log_std.detach().cpu().numpy()) for m in models
    ]  # fmt: skip

    def sample(obs: np.ndarray, playing: list[int], generators: list) -> list[np.ndarray]:
        with torch.inference_mode():
            out = actor(torch.from_numpy(obs.astype(np.float32))[:, None, :]).numpy()
        return [sample_actions(out[k], generators[k], stds[k])[0] for k in playing]

    return record_replays([Replay(m) for m in models], env_id, episodes, seeds, sample)


def _check(members: int, seeds: Sequence[int]) -> None:
    if len(seeds) != members:
        raise ValueError(f"seeds: one per member, got {len(seeds)} for {members}")
