"""Gymnasium environments for the trainer: which ids can be trained, and how they are built.

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

Observations are cast to float32 at the env boundary (MuJoCo returns float64), so the network
never sees another dtype.

Normalisation uses gymnasium's own vector wrappers: ``NormalizeObservation`` (running mean and
variance of observations) and ``NormalizeReward`` (rewards divided by a running std of the
discounted return; :class:`EpisodeNormalizeReward` keeps that return as SB3's VecNormalize
does), each followed by a clip at ±``normalize_clip`` as VecNormalize's. Below
them, :class:`RawRewards` keeps the env's own rewards of the last step: episode returns, curves
and recordings are always in the env's units.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import gymnasium as gym
import numpy as np

from gae_core.errors import UnsupportedEnvError

__all__ = [
    "CLASSIC_CONTROL",
    "MUJOCO",
    "SUPPORTED_ENVS",
    "RawRewards",
    "TrainingEnv",
    "check_env_id",
    "discrete_actions",
    "env_id_problem",
    "make_eval_env",
    "make_training_env",
    "make_vector_env",
    "reward_threshold",
]

#: Classic-control ids the trainer is tested on (flat Box observations; Discrete or 1-D Box
#: actions).
CLASSIC_CONTROL = (
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
)
#: The GAE paper's kind of task: MuJoCo locomotion and balancing (``gymnasium[mujoco]``).
MUJOCO = (
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
)
#: Supported ids and their spec's "solved" level (None where the spec has none).
SUPPORTED_ENVS: Mapping[str, float | None] = MappingProxyType(
    {env_id: gym.spec(env_id).reward_threshold for env_id in CLASSIC_CONTROL + MUJOCO}
)

_DEFAULT_EPISODE_CAP = 1000


def reward_threshold(env_id: str) -> float | None:
    """The env's "solved" level from its gymnasium spec, or None where it has none."""
    try:
        threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        return None
    return None if threshold is None else float(threshold)


def env_id_problem(env_id: object) -> str | None:
    """Why ``env_id`` cannot be trained, in one line, or None if it can.

    Accepted: registered gymnasium ids (the ones in :data:`SUPPORTED_ENVS` are tested) that build
    here and whose spaces the trainer handles. Rejected: ``module:Class`` strings and any id with
    a ':' (``gym.make`` would import the module, i.e. run code named by user input), ids gymnasium
    does not know, ids whose package is missing (the message says what to install) and ids with
    spaces the trainer cannot handle. The env is built once per id and process to find out.
    """
    supported = ", ".join(SUPPORTED_ENVS)
    if not isinstance(env_id, str) or not env_id:
        return f"must be a non-empty string, one of: {supported}"
    if ":" in env_id:
        return f"must be a registered gymnasium id, not a 'module:Class' path; one of: {supported}"
    if env_id not in gym.envs.registry:
        return f"unknown environment {env_id!r}; supported: {supported}"
    return _built(env_id)[0]


def discrete_actions(env_id: str) -> bool | None:
    """Whether a trainable env's actions are Discrete (a Gaussian policy's ``log_std_init`` and
    ``use_sde`` then do nothing); None where ``env_id`` cannot be trained. Reuses the build
    :func:`env_id_problem` made."""
    if env_id_problem(env_id) is not None:
        return None
    return _built(env_id)[1]


@functools.lru_cache(maxsize=64)
def _built(env_id: str) -> tuple[str | None, bool | None]:
    """``(problem, discrete actions)`` of building ``env_id`` once."""
    try:
        env = gym.make(env_id)
    except gym.error.DependencyNotInstalled as exc:
        return f"{env_id} needs a package that is not installed: {_one_line(exc)}", None
    except ImportError as exc:
        return f"{env_id} needs a package that is not installed: {_one_line(exc)}", None
    except Exception as exc:  # any failure to build is reported, not raised into a form
        return f"{env_id} could not be built: {type(exc).__name__}: {_one_line(exc)}", None
    try:
        problem = _spaces_problem(env_id, env.observation_space, env.action_space)
        return problem, isinstance(env.action_space, gym.spaces.Discrete)
    finally:
        env.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_env_id(env_id: object) -> str:
    """``env_id`` if it can be trained, else :class:`UnsupportedEnvError` with the reason."""
    problem = env_id_problem(env_id)
    if problem:
        raise UnsupportedEnvError(f"env_id {problem}")
    return env_id  # type: ignore[return-value]


def _spaces_problem(
    env_id: str, observation_space: gym.Space, action_space: gym.Space
) -> str | None:
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        return (
            f"{env_id} has observation space {observation_space}; the trainer needs a flat Box "
            "(vector observations)"
        )
    discrete = isinstance(action_space, gym.spaces.Discrete)
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not (discrete or box):
        return f"{env_id} has action space {action_space}; the trainer needs Discrete or a flat Box"
    if box and not (
        np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))
    ):
        return f"{env_id} has unbounded actions; clipping needs finite bounds"
    return None


def _float32_observations(env: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    if env.single_observation_space.dtype == np.float32:
        return env
    return gym.wrappers.vector.DtypeObservation(env, np.float32)


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """A vector env in NEXT_STEP autoreset mode (the native one where gymnasium has it) with
    float32 observations."""
    check_env_id(env_id)
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
        raise UnsupportedEnvError(
            f"env_id {env_id}: the trainer's rollout loop needs NEXT_STEP autoreset, "
            f"the env uses {mode}"
        )
    return _float32_observations(env)


class RawRewards(gym.vector.VectorWrapper):
    """Passes everything through and keeps ``rewards``, the env's own rewards of the last step
    (reward normalisation sits above it)."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.rewards = np.zeros(env.num_envs, np.float64)

    def step(self, actions: Any) -> tuple:
        observations, rewards, terminated, truncated, infos = self.env.step(actions)
        self.rewards = np.asarray(rewards, np.float64).copy()
        return observations, rewards, terminated, truncated, infos


@dataclass
class TrainingEnv:
    """The training env stack: ``env`` is its top (what the trainer steps); ``raw`` holds the
    env's own rewards; the normalisers are None where the config does not ask for them."""

    env: gym.vector.VectorEnv
    raw: RawRewards
    observations: gym.wrappers.vector.NormalizeObservation | None
    rewards: gym.wrappers.vector.NormalizeReward | None  # or EpisodeNormalizeReward

    def normalization_state(self) -> dict[str, np.ndarray]:
        """The running statistics, for a checkpoint (empty without normalisation)."""
        state: dict[str, np.ndarray] = {}
        if self.observations is not None:
            rms = self.observations.obs_rms
            state |= {"obs_mean": rms.mean, "obs_var": rms.var, "obs_count": np.asarray(rms.count)}
        if self.rewards is not None:
            state["return_var"] = np.asarray(self.rewards.return_rms.var)
        return {k: np.array(v, np.float64) for k, v in state.items()}

    def close(self) -> None:
        self.env.close()


def make_training_env(
    env_id: str,
    num_envs: int,
    *,
    normalize_observations: bool = False,
    normalize_rewards: bool = False,
    gamma: float = 0.99,
    clip: float = 0.0,
    reset_at_truncation: bool = False,
) -> TrainingEnv:
    """:func:`make_vector_env` with gymnasium's normalisation wrappers as asked, each followed
    by a clip of what it outputs to ±``clip`` when ``clip`` > 0 (SB3's VecNormalize clips both
    at 10; gymnasium's normalisers do not clip), and :class:`RawRewards` below the reward
    normaliser. ``reset_at_truncation``: the reward normaliser's return restarts at every
    episode end (:class:`EpisodeNormalizeReward`), not only at termination."""
    raw = RawRewards(make_vector_env(env_id, num_envs))
    env: gym.vector.VectorEnv = raw
    observations = rewards = None
    if normalize_observations:
        env = observations = gym.wrappers.vector.NormalizeObservation(env)
        if clip > 0:
            env = gym.wrappers.vector.TransformObservation(
                env, functools.partial(clip_normalized, clip=clip)
            )
    if normalize_rewards:
        normalizer = EpisodeNormalizeReward if reset_at_truncation else NormalizeReward
        env = rewards = normalizer(env, gamma=gamma)
        if clip > 0:
            # One np.clip on the batch: gymnasium's vector ClipReward clips env by env.
            env = gym.wrappers.vector.TransformReward(
                env, functools.partial(np.clip, a_min=-clip, a_max=clip)
            )
    return TrainingEnv(env, raw, observations, rewards)


NormalizeReward = gym.wrappers.vector.NormalizeReward


class EpisodeNormalizeReward(NormalizeReward):
    """Gymnasium's ``NormalizeReward`` with SB3's VecNormalize rule for the discounted return it
    scales by: ``G ← γ·G + r`` on every step, the running variance updated with it, and ``G``
    restarted at every episode end (terminated or truncated), kept in float64.

    Gymnasium's rule differs twice (its issues #760 and #1507 call both intended): a truncated
    episode's return carries into the next, and at a termination the sample is ``r`` alone, not
    ``γ·G + r``. With a constant −1 reward, γ = 0.99 and episodes truncated at 200 steps
    (MountainCar, and Acrobot before it learns) its return settles near −100, and the running
    std comes out 8.8 instead of 24.2 after 100k steps: rewards 2.8× larger than the Zoo's runs
    see. The library's wrapper keeps its running statistics, its reset and its
    ``update_running_mean``; only the step is ours. The row after an episode end is a NEXT_STEP
    reset row (no transition), which neither rule counts (``make_vector_env`` builds only
    NEXT_STEP envs)."""

    def __init__(self, env: gym.vector.VectorEnv, gamma: float = 0.99) -> None:
        super().__init__(env, gamma=gamma)
        self.accumulated_reward = np.zeros(self.num_envs, np.float64)
        self._ended = np.zeros(self.num_envs, bool)

    def reset(self, **kwargs: Any) -> tuple:
        self._ended[:] = False
        self.accumulated_reward[:] = 0.0
        return super().reset(**kwargs)

    def step(self, actions: Any) -> tuple:
        observations, rewards, terminated, truncated, infos = self.env.step(actions)
        active = ~self._ended
        self.accumulated_reward[active] = (
            self.accumulated_reward[active] * self.gamma + rewards[active]
        )
        if self.update_running_mean and active.any():
            self.return_rms.update(self.accumulated_reward[active])
        self._ended = np.logical_or(terminated, truncated)
        self.accumulated_reward[self._ended] = 0.0
        scaled = rewards / np.sqrt(self.return_rms.var + self.epsilon)
        return observations, scaled, terminated, truncated, infos


def clip_normalized(observations: np.ndarray, clip: float) -> np.ndarray:
    """Normalised observations clipped to ±``clip``, their dtype kept (training and replay
    share it)."""
    return np.clip(observations, -clip, clip).astype(observations.dtype, copy=False)


def make_eval_env(env_id: str) -> gym.Env:
    """One plain env (with the spec's TimeLimit) for recording trajectories; float32
    observations."""
    check_env_id(env_id)
    env = gym.make(env_id)
    if env.observation_space.dtype != np.float32:
        env = gym.wrappers.DtypeObservation(env, np.float32)
    return env


def episode_cap(env: gym.Env) -> int:
    """The spec's time limit, or a cap for specs without one (the last step is then marked
    truncated)."""
    spec = env.spec
    if spec is not None and spec.max_episode_steps:
        return int(spec.max_episode_steps)
    return _DEFAULT_EPISODE_CAP
