"""Gymnasium environments for the trainer: which ids are supported, and how they are built.

Autoreset mode (gymnasium >= 1.0). We use ``AutoresetMode.NEXT_STEP`` for every vector env, chosen
explicitly for sync envs and checked for native ones, because:

* CartPole's native vector env (``vector_entry_point``, about 3x faster than a sync vector of
  single envs) implements only NEXT_STEP, and one mode for all envs means one rollout loop;
* in NEXT_STEP mode the observation returned by the step that ends an episode *is* the true final
  observation, so ``next_values[t] = values[t+1]`` holds for every row, truncated ones included,
  and the critic needs no extra forward pass for final observations.

The price is one "reset row" after every episode end: the env ignores the action, returns
reward 0 and the reset observation. The trainer marks those rows invalid and leaves them out of
the loss, the step count and the episode statistics (see ``Trainer.collect``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import gymnasium as gym
import numpy as np

__all__ = [
    "SUPPORTED_ENVS",
    "env_id_problem",
    "make_eval_env",
    "make_vector_env",
    "max_episode_steps",
]

# Classic-control ids the trainer is tested on (flat Box observations; Discrete or 1-D Box
# actions). Values are the spec's reward threshold ("solved" level), None where it has none.
_CLASSIC_CONTROL = (
    "CartPole-v1",
    "CartPole-v0",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
)
SUPPORTED_ENVS: Mapping[str, float | None] = MappingProxyType(
    {env_id: gym.spec(env_id).reward_threshold for env_id in _CLASSIC_CONTROL}
)

# Without a TimeLimit in the spec an episode is cut here (and marked truncated) when recording.
_DEFAULT_EPISODE_CAP = 1000


def env_id_problem(env_id: object) -> str | None:
    """Why ``env_id`` cannot be used, or None if it can.

    Accepted: the ids in :data:`SUPPORTED_ENVS`, and plain ids that code in this process has
    registered with ``gymnasium.register`` (tests do). Rejected: ``module:Class`` strings and any
    id with a ':' (``gym.make`` would import the module, i.e. run code named by user input), and
    ids gymnasium does not know.
    """
    supported = ", ".join(SUPPORTED_ENVS)
    if not isinstance(env_id, str) or not env_id:
        return f"must be a non-empty string, one of: {supported}"
    if ":" in env_id:
        return f"must be a registered gymnasium id, not a 'module:Class' path; one of: {supported}"
    if env_id not in gym.envs.registry:
        return f"unknown environment {env_id!r}; supported: {supported}"
    return None


def max_episode_steps(env_id: str) -> int | None:
    """The spec's time limit, or None."""
    return gym.spec(env_id).max_episode_steps


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """A vector env in NEXT_STEP autoreset mode: the native one where gymnasium has it."""
    spec = gym.spec(env_id)
    if spec.vector_entry_point is not None:
        env = gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point")
    else:
        env = gym.make_vec(
            env_id,
            num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
        )
    mode = env.metadata.get("autoreset_mode")
    if mode is not gym.vector.AutoresetMode.NEXT_STEP:
        env.close()
        raise RuntimeError(
            f"{env_id}: the trainer's rollout loop needs NEXT_STEP autoreset, the env uses {mode}"
        )
    _check_spaces(env_id, env.single_observation_space, env.single_action_space)
    return env


def make_eval_env(env_id: str) -> gym.Env:
    """One plain env (with the spec's TimeLimit) for recording trajectories."""
    env = gym.make(env_id)
    _check_spaces(env_id, env.observation_space, env.action_space)
    return env


def _check_spaces(env_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    from gae_core.config import ConfigError  # local: config imports this module

    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise ConfigError(
            f"env_id: {env_id} has observation space {observation_space}; "
            "the trainer needs a flat Box"
        )
    discrete = isinstance(action_space, gym.spaces.Discrete)
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not (discrete or box):
        raise ConfigError(
            f"env_id: {env_id} has action space {action_space}; "
            "the trainer needs Discrete or a flat Box"
        )
    if box and not (
        np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))
    ):
        raise ConfigError(f"env_id: {env_id} has unbounded actions; clipping needs finite bounds")
