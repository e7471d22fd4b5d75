"""A vector env for MuJoCo tasks whose step is a loop of MuJoCo calls, with the same numbers as
gymnasium's.

Why: in a HalfCheetah-v5 population the physics (``mj_step``) was 42 % of a worker's time and
the rest of gymnasium's per-env Python step (wrappers, info dicts, the vector env's merge) about
a third (``docs/PERFORMANCE.md``). :class:`LocomotionVectorEnv` is gymnasium's
``SyncVectorEnv`` in NEXT_STEP autoreset mode over the same ``gym.make`` envs, so resets,
seeding, spaces and closing are gymnasium's own; only a step that does not reset is replaced
by the env's arithmetic on MuJoCo's arrays (:data:`FAST_STEPS`). ``tests/test_mujoco_vector.py``
checks observations, rewards and ends against ``gym.make_vec`` bit for bit over episodes that
cross the time limit, and :func:`fast_step_works` checks a few steps again at run time, once
per process and env id (a gymnasium whose env computes otherwise then gets its own vector env).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import gymnasium as gym
import mujoco
import numpy as np

__all__ = ["FAST_STEPS", "LocomotionVectorEnv", "fast_step_works", "make_locomotion_vector_env"]


def _half_cheetah(env, action: np.ndarray) -> float:
    """HalfCheetah-v5's step on its MuJoCo data (gymnasium ``half_cheetah_v5.py``): the
    reward is forward_weight · Δx / dt − ctrl_weight · Σ a², with the control cost in the
    action's dtype, as gymnasium computes it; it never terminates."""
    data = env.data
    x_before = data.qpos[0]
    data.ctrl[:] = action
    mujoco.mj_step(env.model, data, nstep=env.frame_skip)
    # gymnasium's do_simulation also runs mj_rnePostConstraint; it fills derived force
    # fields (cacc, cfrc_int, cfrc_ext) that HalfCheetah's observation and reward never read,
    # and the next mj_step recomputes them.
    x_velocity = (data.qpos[0] - x_before) / env.dt
    forward = env._forward_reward_weight * x_velocity
    return forward - env._ctrl_cost_weight * np.sum(np.square(action))


#: env id → its step on the unwrapped env (reward; the observation is read by the vector env).
#: Only envs whose step and observation are written here take the fast path.
FAST_STEPS: dict[str, Callable[[gym.Env, np.ndarray], float]] = {"HalfCheetah-v5": _half_cheetah}


class LocomotionVectorEnv(gym.vector.SyncVectorEnv):
    """``SyncVectorEnv`` (NEXT_STEP autoreset) whose non-resetting steps call
    :data:`FAST_STEPS` directly: no wrappers, info dicts or per-env observation copies. The
    time limit is counted here, as gymnasium's ``TimeLimit`` counts it; returns empty infos."""

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(
            [functools.partial(gym.make, env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
        self._step_one = FAST_STEPS[env_id]
        self._bare = [env.unwrapped for env in self.envs]
        bare = self._bare[0]
        if not bare._exclude_current_positions_from_observation:  # pragma: no cover
            raise ValueError(f"{env_id}: the fast step assumes x is left out of observations")
        self._limit = self.envs[0].spec.max_episode_steps
        self._elapsed = np.zeros(num_envs, dtype=np.int64)
        self._qpos_size = bare.data.qpos.size

    def reset(self, *, seed=None, options=None):
        mask = None if options is None else options.get("reset_mask")
        if mask is None:
            self._elapsed[:] = 0
        else:
            self._elapsed[mask] = 0
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        actions = np.asarray(actions)
        observations = self._observations
        skip = 1  # HalfCheetah leaves x (qpos[0]) out of its observation
        split = self._qpos_size - skip
        for i, bare in enumerate(self._bare):
            if self._autoreset_envs[i]:
                observations[i], _ = self.envs[i].reset()
                self._elapsed[i] = 0
                self._rewards[i] = 0.0
                self._terminations[i] = False
                self._truncations[i] = False
                continue
            self._rewards[i] = self._step_one(bare, actions[i])
            data = bare.data
            observations[i, :split] = data.qpos[skip:]
            observations[i, split:] = data.qvel
            self._elapsed[i] += 1
            self._terminations[i] = False
            self._truncations[i] = self._limit is not None and self._elapsed[i] >= self._limit
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            observations.copy(),
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            {},
        )


@functools.cache
def fast_step_works(env_id: str) -> bool:
    """Whether :class:`LocomotionVectorEnv` steps ``env_id`` exactly as ``gym.make_vec``
    does in this gymnasium: two envs from one seed, a few fixed actions, equal observations,
    rewards and ends. Checked once per process and env id (a few milliseconds)."""
    steps, num_envs = 6, 2
    fast = LocomotionVectorEnv(env_id, num_envs)
    plain = gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )
    try:
        first = [fast.reset(seed=3)[0], plain.reset(seed=3)[0]]
        if not np.array_equal(*first):
            return False
        space = plain.single_action_space
        actions = np.linspace(space.low, space.high, steps * num_envs, dtype=space.dtype)
        for t in range(steps):
            chosen = actions[t * num_envs : (t + 1) * num_envs]
            mine, theirs = fast.step(chosen), plain.step(chosen)
            if not all(np.array_equal(a, b) for a, b in zip(mine[:4], theirs[:4], strict=True)):
                return False
        return True
    except Exception:  # any failure of the fast route means: do not take it
        return False
    finally:
        fast.close()
        plain.close()


def make_locomotion_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv | None:
    """:class:`LocomotionVectorEnv` for ``env_id`` where it has a fast step that reproduces
    gymnasium's here, else None."""
    if env_id not in FAST_STEPS or not fast_step_works(env_id):
        return None
    return LocomotionVectorEnv(env_id, num_envs)
