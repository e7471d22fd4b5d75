"""Trajectories for the advantage explorer: the recorded ones from the store, fresh ones from
any checkpoint's policy, and values re-evaluated with any checkpoint's critic (an early critic
next to a late one shows how critic error becomes bias in the advantages)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from gae_core.config import TrainConfig
from gae_core.envs import make_eval_env
from gae_core.trainer import Trajectory, evaluate_values, load_model, record_episode


def record_fresh(config: TrainConfig, checkpoint: bytes, seed: int) -> Trajectory:
    """One evaluation episode of the checkpoint's policy (sampled actions), env reset with
    ``seed``; values from the same checkpoint's critic."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2**31 - 1], got {seed!r}")
    model = load_model(config, checkpoint)
    env = make_eval_env(config.env_id)
    try:
        return record_episode(env, model, np.random.default_rng(seed), seed, torch.device("cpu"))
    finally:
        env.close()


def revalue(trajectory: Trajectory, config: TrainConfig, checkpoint: bytes) -> Trajectory:
    """The same transitions with ``values`` and ``next_values`` from another checkpoint's
    critic; rewards, flags and actions untouched. One batch over s_0..s_T, so
    ``next_values[t] == values[t + 1]`` holds exactly inside the (single-episode) trajectory."""
    states = np.concatenate([trajectory.observations, trajectory.next_observations[-1:]])
    all_values = evaluate_values(config, checkpoint, states)
    return dataclasses.replace(trajectory, values=all_values[:-1], next_values=all_values[1:])


def load_trajectory(
    store,
    run_id: str,
    policy_step: int,
    *,
    recorded: int | None = None,
    fresh_seed: int | None = None,
    critic_step: int | None = None,
) -> Trajectory:
    """A trajectory of ``run_id``'s checkpoint at ``policy_step``: the ``recorded``-th one saved
    with it, or a ``fresh_seed`` recording of its policy; values from the checkpoint at
    ``critic_step`` when given (else the policy's own critic)."""
    if (recorded is None) == (fresh_seed is None):
        raise ValueError("give exactly one of recorded (an index) or fresh_seed")
    config = TrainConfig.from_dict(store.get_run(run_id).config)
    if recorded is not None:
        saved = store.trajectories(run_id, policy_step)
        if not 0 <= recorded < len(saved):
            raise ValueError(
                f"recorded must be in [0, {len(saved) - 1}] for checkpoint {policy_step}, "
                f"got {recorded}"
            )
        trajectory = saved[recorded]
    else:
        trajectory = record_fresh(config, store.load_checkpoint(run_id, policy_step), fresh_seed)
    if critic_step is not None and critic_step != policy_step:
        trajectory = revalue(trajectory, config, store.load_checkpoint(run_id, critic_step))
    return trajectory
