"""A vector env for MuJoCo tasks whose step is a loop of MuJoCo calls, with the same numbers as
gymnasium's.

Why: in a MuJoCo population gymnasium's per-env Python step (wrappers, info dicts, the vector
env's merge) costs a large share beside the physics (measured in ``docs/PERFORMANCE.md``,
"HalfCheetah's step as MuJoCo calls"). :class:`LocomotionVectorEnv` is gymnasium's
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

__all__ = [
    "FAST_STEPS",
    "LocomotionVectorEnv",
    "as_float32",
    "fast_step_works",
    "make_locomotion_vector_env",
]


def _half_cheetah(env, x_before: np.ndarray, x_after: np.ndarray, actions: np.ndarray):
    """HalfCheetah-v5's rewards for the envs that stepped (gymnasium ``half_cheetah_v5.py``):
    forward_weight · Δx / dt − ctrl_weight · Σ a², the control cost in the actions' dtype as
    gymnasium computes it (its row sums equal one env's ``np.sum``); it never terminates."""
    forward = env._forward_reward_weight * ((x_after - x_before) / env.dt)
    return forward - env._ctrl_cost_weight * np.sum(np.square(actions), axis=1)


#: env id → its rewards from x (qpos[0]) before and after the step, for the envs that stepped;
#: only envs whose observation is qpos without x, then qvel, and that never terminate, with
#: their reward written here, take the fast path.
FAST_STEPS: dict[str, Callable[..., np.ndarray]] = {"HalfCheetah-v5": _half_cheetah}


class LocomotionVectorEnv(gym.vector.SyncVectorEnv):
    """``SyncVectorEnv`` (NEXT_STEP autoreset) whose non-resetting steps call
    :data:`FAST_STEPS` directly: no wrappers, info dicts or per-env observation copies. The
    time limit is counted here, as gymnasium's ``TimeLimit`` counts it; returns empty infos.
    The sub-envs' own wrappers (``envs[i]``: their ``TimeLimit`` counter, the env checker) do
    not see these steps: step them only through this vector env."""

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(
            [functools.partial(gym.make, env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
        self._rewards_of = FAST_STEPS[env_id]
        self._bare = [env.unwrapped for env in self.envs]
        bare = self._bare[0]
        self._model, self._frame_skip = bare.model, bare.frame_skip
        # float32 observations, cast once for all envs (gymnasium's vector DtypeObservation
        # casts env by env); reset observations are float64 and cast with the rest
        self.single_observation_space = gym.spaces.Box(
            -np.inf, np.inf, self.single_observation_space.shape, np.float32
        )
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        if not bare._exclude_current_positions_from_observation:  # pragma: no cover
            raise ValueError(f"{env_id}: the fast step assumes x is left out of observations")
        self._limit = self.envs[0].spec.max_episode_steps
        self._elapsed = np.zeros(num_envs, dtype=np.int64)
        self._qpos_size = bare.data.qpos.size

    def reset(self, *, seed=None, options=None):
        mask = None if options is None else options.get("reset_mask")
        # gymnasium's masked reset refills the other rows from its per-env list, which the
        # fast step does not keep: give it the rows as they are
        self._env_obs = list(self._observations)
        observations, infos = super().reset(seed=seed, options=options)
        self._elapsed[slice(None) if mask is None else mask] = 0
        self._was_reset = True
        return observations.astype(np.float32), infos

    def step(self, actions):
        if not getattr(self, "_was_reset", False):
            raise gym.error.ResetNeeded("Cannot call env.step() before calling env.reset()")
        actions = np.asarray(actions)
        expected = (self.num_envs, *self.single_action_space.shape)
        if actions.shape != expected:
            raise ValueError(f"actions must have shape {expected}, got {actions.shape}")
        observations = self._observations
        split = self._qpos_size - 1  # x (qpos[0]) is left out of the observation
        resets = self._autoreset_envs
        stepped = np.flatnonzero(~resets)
        before, after = np.empty(len(stepped)), np.empty(len(stepped))
        for k, i in enumerate(stepped):
            data = self._bare[i].data
            before[k] = data.qpos[0]
            data.ctrl[:] = actions[i]
            mujoco.mj_step(self._model, data, nstep=self._frame_skip)
            # gymnasium's do_simulation also runs mj_rnePostConstraint: it fills derived force
            # fields (cacc, cfrc_int, cfrc_ext) that these observations and rewards never read;
            # here they stay as the last reset left them (mj_step computes them only for force
            # sensors, which HalfCheetah has none of).
            after[k] = data.qpos[0]
            observations[i, :split] = data.qpos[1:]
            observations[i, split:] = data.qvel
        for i in np.flatnonzero(resets):
            observations[i], _ = self.envs[i].reset()
            self._elapsed[i] = 0
        self._rewards[resets] = 0.0
        self._rewards[stepped] = self._rewards_of(self._bare[0], before, after, actions[stepped])
        self._elapsed[stepped] += 1
        self._terminations[:] = False
        self._truncations[:] = False
        if self._limit is not None:
            self._truncations[stepped] = self._elapsed[stepped] >= self._limit
        self._autoreset_envs = self._terminations | self._truncations
        return (
            observations.astype(np.float32),
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            {},
        )


def as_float32(observations: np.ndarray) -> np.ndarray:
    """gymnasium's observations as the trainer sees them (``envs.make_vector_env`` casts)."""
    return np.asarray(observations, dtype=np.float32)


@functools.cache
def fast_step_works(env_id: str) -> bool:
    """Whether :class:`LocomotionVectorEnv` steps ``env_id`` exactly as ``gym.make_vec``
    does in this gymnasium: two envs from one seed, a few fixed actions, equal observations
    (as float32), rewards and ends. Checked once per process and env id (milliseconds)."""
    steps, num_envs = 6, 2
    fast = LocomotionVectorEnv(env_id, num_envs)
    plain = gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )
    try:
        if not np.array_equal(fast.reset(seed=3)[0], as_float32(plain.reset(seed=3)[0])):
            return False
        space = plain.single_action_space
        actions = np.linspace(space.low, space.high, steps * num_envs, dtype=space.dtype)
        for t in range(steps):
            chosen = actions[t * num_envs : (t + 1) * num_envs]
            mine, (obs, *theirs) = fast.step(chosen), plain.step(chosen)
            for a, b in zip(mine[:4], (as_float32(obs), *theirs[:3]), strict=True):
                if not np.array_equal(a, b):
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
