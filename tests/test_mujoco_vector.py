"""The MuJoCo loop vector env (``agent/mujoco_vector.py``) against gymnasium's own vector env:
the same observations (cast to float32, as the trainer gets gymnasium's), rewards and ends,
bit for bit, across time limits and autoresets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from gae_core.agent import mujoco_vector
from gae_core.agent.envs import make_vector_env, quiet_env_warnings
from gae_core.agent.mujoco_vector import FAST_STEPS, LocomotionVectorEnv, as_float32

pytestmark = pytest.mark.slow  # MuJoCo


def gymnasium_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )


@pytest.mark.parametrize("env_id", sorted(FAST_STEPS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_loop_steps_exactly_as_gymnasium_across_time_limits(env_id, dtype):
    quiet_env_warnings(env_id)
    num_envs = 3
    fast, plain = LocomotionVectorEnv(env_id, num_envs), gymnasium_vector_env(env_id, num_envs)
    try:
        limit = plain.envs[0].spec.max_episode_steps
        start = plain.reset(seed=11)[0]
        np.testing.assert_array_equal(fast.reset(seed=11)[0], as_float32(start))
        rng = np.random.default_rng(0)
        space = plain.single_action_space
        ends = 0
        for t in range(2 * limit + 5):  # two time limits, each followed by its reset row
            actions = rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(dtype)
            if t % 97 == 0:
                actions[0] = space.high * 3  # out of bounds: both pass it to MuJoCo alike
            mine, (obs, *theirs) = fast.step(actions), plain.step(actions)
            names = ("obs", "reward", "terminated", "truncated")
            for name, a, b in zip(names, mine[:4], (as_float32(obs), *theirs[:3]), strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{name} at step {t}")
            ends += int(mine[3].sum())
        assert ends == 2 * num_envs  # the time limit was reached twice by every env
        # a reset in the middle of an episode starts both from the same seeds again
        start = plain.reset(seed=12)[0]
        np.testing.assert_array_equal(fast.reset(seed=12)[0], as_float32(start))
        actions = np.zeros((num_envs, *space.shape), dtype)
        np.testing.assert_array_equal(fast.step(actions)[0], as_float32(plain.step(actions)[0]))
    finally:
        fast.close()
        plain.close()


def test_make_vector_env_takes_the_loop_only_where_it_is_written_and_checked(monkeypatch):
    env = make_vector_env("HalfCheetah-v5", 2)
    try:
        assert isinstance(env.unwrapped, LocomotionVectorEnv)
        assert env.single_observation_space.dtype == np.float32
    finally:
        env.close()
    env = make_vector_env("Hopper-v5", 2)  # no fast step written for it
    try:
        assert type(env.unwrapped) is gym.vector.SyncVectorEnv
    finally:
        env.close()

    right = FAST_STEPS["HalfCheetah-v5"]

    def wrong(bare, before, after, actions):  # rewards 1e-9 off gymnasium's
        return right(bare, before, after, actions) + 1e-9

    monkeypatch.setitem(FAST_STEPS, "HalfCheetah-v5", wrong)
    mujoco_vector.fast_step_works.cache_clear()
    try:
        assert not mujoco_vector.fast_step_works("HalfCheetah-v5")
        env = make_vector_env("HalfCheetah-v5", 2)
        try:
            assert type(env.unwrapped) is gym.vector.SyncVectorEnv
        finally:
            env.close()
    finally:
        mujoco_vector.fast_step_works.cache_clear()


def test_masked_resets_bad_actions_and_a_step_before_reset_behave_as_gymnasium_says():
    env_id = "HalfCheetah-v5"
    quiet_env_warnings(env_id)
    fast, plain = LocomotionVectorEnv(env_id, 3), gymnasium_vector_env(env_id, 3)
    try:
        with pytest.raises(gym.error.ResetNeeded):
            fast.step(np.zeros((3, 6), np.float32))
        fast.reset(seed=0)
        plain.reset(seed=0)
        for _ in range(50):
            actions = np.full((3, 6), 0.3, np.float32)
            fast.step(actions)
            plain.step(actions)
        mask = np.array([True, False, False])
        mine = fast.reset(options={"reset_mask": mask.copy()})[0]
        theirs = plain.reset(options={"reset_mask": mask.copy()})[0]
        np.testing.assert_array_equal(mine, as_float32(theirs))  # rows 1–2 as they were
        for bad in (np.zeros((3, 1)), np.zeros(3), np.zeros((4, 6))):
            with pytest.raises(ValueError, match="actions must have shape"):
                fast.step(bad)
        actions = np.full((3, 6), -0.2, np.float32)
        mine, (obs, *theirs) = fast.step(actions), plain.step(actions)
        np.testing.assert_array_equal(mine[0], as_float32(obs))
        np.testing.assert_array_equal(mine[1], theirs[0])
    finally:
        fast.close()
        plain.close()
