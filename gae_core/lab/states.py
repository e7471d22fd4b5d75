"""Saving and restoring an environment's state, and stepping many restored copies at once.

The lab restarts rollouts from states it sampled earlier, so it needs, per env family, the full
state (not the observation: Acrobot observes cos/sin of its angles, MuJoCo hides part of qpos)
and a way to put an env back into it:

* classic control: ``env.unwrapped.state`` (CartPole, Acrobot, MountainCar, MountainCarContinuous,
  Pendulum); the observation is rebuilt the way each env builds it;
* MuJoCo: ``qpos`` and ``qvel`` through ``MujocoEnv.set_state``;
* the lab's chain: its position.

Envs are unwrapped: time limits are not part of the state, so a restored rollout runs until it
terminates or the lab cuts it. An env of another family gets a clear
:class:`~gae_core.errors.UnsupportedEnvError` rather than a wrong answer.

:class:`Simulator` holds B copies and steps them together: CartPole through gymnasium's
numpy-vectorised ``CartPoleVectorEnv`` (its state array is set directly), every other env as B
single envs stepped in a loop (the policy forward, the expensive part, is batched either way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from gae_core.agent.envs import check_env_id, quiet_env_warnings
from gae_core.errors import UnsupportedEnvError
from gae_core.lab import chain

__all__ = ["STATE_FAMILIES", "Simulator", "StateAccess", "sample_starts", "state_access"]

#: The vectorised CartPole never truncates inside the lab: rollouts are cut by the lab itself.
_NO_TIME_LIMIT = 10**12


@dataclass(frozen=True)
class StateAccess:
    """How to read, restore and observe the state of one env family (unwrapped envs)."""

    family: str
    get: Callable[[gym.Env], Any]
    set: Callable[[gym.Env, Any], None]
    observe: Callable[[gym.Env], np.ndarray]


def _get_classic(env: gym.Env) -> np.ndarray:
    return np.array(env.state, dtype=np.float64, copy=True)


def _set_classic(env: gym.Env, state: np.ndarray) -> None:
    env.state = np.array(state, dtype=np.asarray(env.state).dtype, copy=True)


def _observe_state(env: gym.Env) -> np.ndarray:
    return np.asarray(env.state, dtype=np.float32)


def _get_mujoco(env: gym.Env) -> tuple[np.ndarray, np.ndarray]:
    return env.data.qpos.copy(), env.data.qvel.copy()


def _set_mujoco(env: gym.Env, state: tuple[np.ndarray, np.ndarray]) -> None:
    env.set_state(*state)


def _observe_mujoco(env: gym.Env) -> np.ndarray:
    return np.asarray(env._get_obs(), dtype=np.float32)


def _set_chain(env: gym.Env, state: int) -> None:
    chain.set_state(env, int(state))


_CLASSIC = {
    "CartPole": _observe_state,
    "MountainCar": _observe_state,
    "Continuous_MountainCar": _observe_state,
    "Acrobot": lambda env: np.asarray(env._get_ob(), dtype=np.float32),
    "Pendulum": lambda env: np.asarray(env._get_obs(), dtype=np.float32),
}

#: Env families whose state can be saved and restored (documentation and messages).
STATE_FAMILIES = ("classic control", "MuJoCo", "the lab's chain")


def state_access(env_id: str) -> StateAccess:
    """The state access of ``env_id``'s family; ``UnsupportedEnvError`` naming the id and the
    families the lab supports otherwise, or why the id cannot be built here (an env module's id
    whose module this process was not told to import)."""
    check_env_id(env_id)
    quiet_env_warnings(env_id)
    env = gym.make(env_id).unwrapped
    try:
        name = type(env).__name__
        for prefix, observe in _CLASSIC.items():
            if name == f"{prefix}Env":
                return StateAccess("classic", _get_classic, _set_classic, observe)
        if isinstance(env, chain.RandomWalkChain):
            return StateAccess(
                "chain",
                chain.get_state,
                _set_chain,
                lambda e: chain.observation(e.position, e.chain.n_states),
            )
        mujoco = getattr(gym.envs, "mujoco", None)
        if mujoco is not None and isinstance(env, mujoco.MujocoEnv):
            return StateAccess("mujoco", _get_mujoco, _set_mujoco, _observe_mujoco)
    finally:
        env.close()
    raise UnsupportedEnvError(
        f"env_id {env_id}: the estimator lab restarts rollouts from saved states, and this env's "
        f"state cannot be saved and restored (supported: {', '.join(STATE_FAMILIES)})"
    )


class Simulator:
    """B unwrapped copies of ``env_id`` stepped together from states set by the caller.

    After a copy terminates its later outputs are meaningless: the caller masks them (the
    generic path stops stepping it; the vectorised CartPole would auto-reset it).
    """

    def __init__(self, env_id: str, size: int, seed: int = 0) -> None:
        self.env_id, self.size = env_id, size
        self.access = state_access(env_id)
        self._vector = None
        if gym.spec(env_id).vector_entry_point is not None and self.access.family == "classic":
            self._vector = gym.make_vec(
                env_id, size, vectorization_mode="vector_entry_point"
            ).unwrapped
            self._vector.max_episode_steps = _NO_TIME_LIMIT
            self._vector.reset(seed=seed)
            self._envs: list[gym.Env] = []
        else:
            self._envs = [gym.make(env_id).unwrapped for _ in range(size)]
            for i, env in enumerate(self._envs):
                env.reset(seed=seed + i)
        probe = gym.make(env_id)
        space = probe.action_space
        probe.close()
        self._bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        self._alive = np.ones(size, bool)

    def set_states(self, states: Sequence[Any]) -> np.ndarray:
        """Put copy i into ``states[i]``; returns the observations ``[B, obs_dim]``."""
        if len(states) != self.size:
            raise ValueError(f"states must have {self.size} entries, got {len(states)}")
        self._alive[:] = True
        if self._vector is not None:
            self._vector.state = np.stack([np.asarray(s, np.float64) for s in states], axis=1)
            self._vector.steps[:] = 0
            self._vector.prev_done[:] = False
            return self._vector.state.T.astype(np.float32)
        for env, state in zip(self._envs, states, strict=True):
            self.access.set(env, state)
        return np.stack([self.access.observe(env) for env in self._envs])

    def reset(self, seed: int) -> np.ndarray:
        """Fresh episodes (the env's own start distribution) in every copy; observations."""
        self._alive[:] = True
        if self._vector is not None:
            obs, _ = self._vector.reset(seed=seed)
            self._vector.steps[:] = 0
            return obs
        out = []
        for i, env in enumerate(self._envs):
            env.reset(seed=seed + i)
            out.append(self.access.observe(env))
        return np.stack(out)

    def get_states(self) -> list[Any]:
        if self._vector is not None:
            return [self._vector.state[:, i].copy() for i in range(self.size)]
        return [self.access.get(env) for env in self._envs]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every copy still alive: ``(observations, rewards, terminated)``;
        actions are clipped to the action bounds for the env, as in training."""
        if self._bounds is not None:
            actions = np.clip(actions, *self._bounds)
        if self._vector is not None:
            obs, rewards, terminated, _, _ = self._vector.step(actions)
            self._alive &= ~terminated
            return obs, rewards.astype(np.float64), terminated
        obs = np.zeros((self.size, *self._obs_shape()), np.float32)
        rewards = np.zeros(self.size)
        terminated = ~self._alive
        for i in np.flatnonzero(self._alive):
            o, r, term, _, _ = self._envs[i].step(actions[i])
            obs[i], rewards[i], terminated[i] = o, r, term
        self._alive &= ~terminated
        return obs, rewards, terminated

    def _obs_shape(self) -> tuple[int, ...]:
        return self._envs[0].observation_space.shape

    def close(self) -> None:
        if self._vector is not None:
            self._vector.close()
        for env in self._envs:
            env.close()


def sample_starts(
    env_id: str, policy: Any, count: int, rng: np.random.Generator, seed: int
) -> list[tuple[Any, np.ndarray, Any]]:
    """``count`` (state, observation, action) triples drawn uniformly from the steps of
    ``count`` fresh episodes of the policy (its on-policy state distribution, each episode run
    to termination or the spec's time limit), with the action the policy took there.
    ``policy``: anything with ``sample(observations, rng)`` (a lab ``Policy``)."""
    cap = gym.spec(env_id).max_episode_steps or 1000
    sim = Simulator(env_id, count, seed=seed)
    try:
        obs = sim.reset(int(rng.integers(2**31)))
        alive = np.ones(count, bool)
        visited: list[tuple[Any, np.ndarray, Any]] = []
        for _ in range(cap):
            actions = policy.sample(obs, rng)
            states = sim.get_states()
            visited += [(states[i], obs[i].copy(), actions[i]) for i in np.flatnonzero(alive)]
            obs, _, terminated = sim.step(actions)
            alive &= ~terminated
            if not alive.any():
                break
        picks = rng.choice(len(visited), size=min(count, len(visited)), replace=False)
        return [visited[i] for i in np.sort(picks)]
    finally:
        sim.close()
