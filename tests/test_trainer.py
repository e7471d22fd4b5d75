"""A2C+GAE trainer: smoke runs on every supported env family, determinism, truncation
bootstrapping against the closed form 1/(1−γ), divergence, checkpoints and recordings."""

from __future__ import annotations

import copy
import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.optim import Optimizer
from gae_core.agent.recording import evaluate_values
from gae_core.agent.trainer import Trainer, TrainingDiverged
from gae_core.trajectory import Trajectory

METRIC_KEYS = {m.key for m in M.LOSSES} | {M.STEPS_PER_SECOND.key, M.WALL_TIME.key}

FIVE_ENVS = [
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "Pendulum-v1",
    "MountainCarContinuous-v0",
]


class ConstantRewardEnv(gym.Env):
    """Reward 1 every step, never terminates, one constant observation: V(s) = Σγ^k = 1/(1−γ)
    for the infinite-horizon task; only the TimeLimit wrapper cuts episodes (truncation)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([0.5, -0.5], np.float32), {}

    def step(self, action):
        return np.array([0.5, -0.5], np.float32), 1.0, False, False, {}


CONSTANT_ID = "TestConstantReward-v0"
TIME_LIMIT = 10
if CONSTANT_ID not in gym.envs.registry:
    gym.register(CONSTANT_ID, entry_point=ConstantRewardEnv, max_episode_steps=TIME_LIMIT)


def tiny(env_id: str = "CartPole-v1", **overrides) -> TrainConfig:
    base = dict(
        env_id=env_id,
        num_envs=2,
        rollout_steps=8,
        total_steps=64,
        hidden_sizes=(16,),
        checkpoint_every=0,
        record_episodes=0,
    )
    return TrainConfig(**{**base, **overrides})


def run(config: TrainConfig, updates: int):
    trainer = Trainer(config)
    try:
        return [trainer.step() for _ in range(updates)], trainer
    finally:
        trainer.close()


@pytest.mark.parametrize("env_id", FIVE_ENVS)
def test_smoke_each_env(env_id):
    results, trainer = run(tiny(env_id), updates=4)
    assert trainer.env_steps == results[-1].env_steps >= 4 * 2 * 8 - 2  # minus reset rows
    for result in results:
        assert set(result.metrics) == METRIC_KEYS
        assert all(math.isfinite(v) for v in result.metrics.values())
    assert trainer.done == (trainer.env_steps >= 64)


def test_same_seed_same_metrics_and_episodes():
    def trace(seed):
        results, _ = run(tiny(seed=seed, num_envs=4, rollout_steps=16), updates=15)
        metrics = [
            {k: v for k, v in r.metrics.items() if not k.startswith("perf/")} for r in results
        ]
        return metrics, [r.episodes for r in results]

    first, second, other = trace(3), trace(3), trace(4)
    assert first == second
    assert sum(len(e) for e in first[1]) > 0  # episodes did finish
    assert first != other


def test_episodes_report_step_return_and_length():
    # a budget far away: no rollout is cut short (see test_last_rollout_is_cut_at_the_budget)
    config = tiny(CONSTANT_ID, num_envs=3, rollout_steps=8, gamma=0.9, total_steps=10_000)
    results, _ = run(config, updates=6)
    episodes = [e for r in results for e in r.episodes]
    # 3 envs in lockstep: 10 real steps, then one NEXT_STEP reset row that is not counted.
    assert [e.env_step for e in episodes] == [30] * 3 + [60] * 3 + [90] * 3 + [120] * 3
    assert all(e.length == TIME_LIMIT and e.return_ == TIME_LIMIT for e in episodes)
    assert results[-1].env_steps == 6 * 3 * 8 - 3 * 4  # 4 reset rows per env so far


def test_reset_rows_masked_and_truncation_flagged():
    trainer = Trainer(tiny(CONSTANT_ID, num_envs=2, rollout_steps=12))
    trainer.collect()
    rollout = trainer._rollout
    # Row 9 is the time limit (truncated, not terminated); row 10 is the env's reset row.
    assert rollout.truncated[:, 0].tolist() == [False] * 9 + [True] + [False] * 2
    assert not rollout.terminated.any()
    assert rollout.valid[:, 0].tolist() == [True] * 10 + [False] + [True]
    trainer.close()


def test_rollout_of_reset_rows_only_is_skipped_not_diverged():
    # rollout_steps 1, envs in lockstep: every 11th rollout is nothing but reset rows.
    results, _ = run(tiny(CONSTANT_ID, num_envs=2, rollout_steps=1), updates=12)
    assert results[10].metrics["losses/grad_norm"] == 0.0
    assert results[10].env_steps == results[9].env_steps == 20
    assert all(math.isfinite(v) for r in results for v in r.metrics.values())


@pytest.mark.parametrize("lambda_", [0.0, 0.9])
def test_truncation_bootstraps_to_the_infinite_horizon_value(lambda_):
    """With γ = 0.9 the critic must learn V = 1/(1−γ) = 10 although every episode is cut after
    10 steps. Treating the cut as termination would give the finite-horizon values
    (1 − γ^(10−t))/(1 − γ) averaged over t (one observation for all t): about 4.1 (about 5 as
    measured, with λ-returns). With λ = 0, training on the NEXT_STEP reset rows (reward 0,
    target γV) would pull V down to 10/1.1 ≈ 9.1: the masking is checked too."""
    gamma = 0.9
    config = tiny(
        CONSTANT_ID,
        num_envs=4,
        rollout_steps=16,
        total_steps=12_000,
        gamma=gamma,
        lambda_=lambda_,
        learning_rate=3e-3,
        value_coef=1.0,
        hidden_sizes=(16,),
    )
    trainer = Trainer(config)
    while not trainer.done:
        trainer.step()
    start = np.array([[0.5, -0.5]], np.float32)
    value = float(evaluate_values(config, trainer.checkpoint_bytes(), start)[0])
    trainer.close()
    as_if_terminated = np.mean([(1 - gamma ** (TIME_LIMIT - t)) / (1 - gamma) for t in range(10)])
    assert as_if_terminated < 4.2
    assert abs(value - 1 / (1 - gamma)) < 0.3, value


def test_nan_weights_raise_training_diverged():
    for part in ("actor", "critic"):
        trainer = Trainer(tiny())
        trainer.step()
        with torch.no_grad():
            getattr(trainer.model, part)[0].weight.fill_(float("nan"))
        with pytest.raises(TrainingDiverged, match=r"non-finite|became nan"):
            trainer.step()
        trainer.close()


def test_huge_learning_rate_diverges_or_trains_finite():
    # Either outcome is acceptable; what is not is a NaN metric slipping through silently.
    trainer = Trainer(tiny("Pendulum-v1", learning_rate=1.0, max_grad_norm=0.0))
    try:
        for _ in range(30):
            result = trainer.step()
            assert all(math.isfinite(v) for v in result.metrics.values())
    except TrainingDiverged:
        pass
    finally:
        trainer.close()


def test_checkpoint_round_trip_and_evaluate_values():
    config = tiny(checkpoint_every=32)
    trainer = Trainer(config)
    assert not trainer.checkpoint_due()
    while not trainer.checkpoint_due():
        trainer.step()
    data = trainer.checkpoint_bytes()
    assert trainer.checkpoint_due()  # a pure read: saving does not move the schedule
    state = torch.load(io.BytesIO(data), weights_only=True)
    assert set(state) == set(trainer.model.state_dict())
    observations = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    with torch.no_grad():
        expected = trainer.model.values(torch.from_numpy(observations)).numpy()
    trainer.step()  # 16 steps: the next multiple of 32 is not crossed yet
    assert not trainer.checkpoint_due()
    np.testing.assert_allclose(evaluate_values(config, data, observations), expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"shape \[T, 4\]"):
        evaluate_values(config, data, observations[:, :3])
    trainer.close()


def check_trajectory(trajectory: Trajectory, action_shape: tuple[int, ...]) -> None:
    length = len(trajectory)
    assert length >= 1
    assert trajectory.observations.shape == trajectory.next_observations.shape
    assert trajectory.actions.shape == (length, *action_shape)
    for name in ("rewards", "values", "next_values", "terminated", "truncated", "log_probs"):
        assert getattr(trajectory, name).shape == (length,), name
    np.testing.assert_array_equal(trajectory.next_values[:-1], trajectory.values[1:])
    np.testing.assert_array_equal(trajectory.next_observations[:-1], trajectory.observations[1:])
    done = trajectory.terminated | trajectory.truncated
    assert done[-1] and not done[:-1].any()
    assert np.all(trajectory.log_probs <= 0) or trajectory.actions.dtype == np.float32


def test_record_trajectories_are_consistent():
    trainer = Trainer(tiny())
    trainer.step()
    trajectories = trainer.record(episodes=2, seed=5)
    assert len(trajectories) == 2
    for trajectory in trajectories:
        check_trajectory(trajectory, ())
        assert trajectory.terminated[-1] or len(trajectory) == 500
        copy_ = Trajectory.from_bytes(trajectory.to_bytes())
        for name in ("observations", "actions", "values", "truncated"):
            np.testing.assert_array_equal(getattr(copy_, name), getattr(trajectory, name))
    again = trainer.record(episodes=2, seed=5)
    np.testing.assert_array_equal(again[1].actions, trajectories[1].actions)
    trainer.close()


def test_record_truncates_at_time_limit_and_leaves_training_untouched():
    config = tiny(CONSTANT_ID)
    with_recording, plain = Trainer(config), Trainer(config)
    with_recording.step()
    plain.step()
    (trajectory,) = with_recording.record(episodes=1, seed=0)
    check_trajectory(trajectory, ())
    assert len(trajectory) == TIME_LIMIT and trajectory.truncated[-1]
    assert not trajectory.terminated.any()
    a, b = with_recording.step().metrics, plain.step().metrics
    assert {k: v for k, v in a.items() if "perf" not in k} == {
        k: v for k, v in b.items() if "perf" not in k
    }


def test_continuous_actions_clipped_for_env_but_logged_unclipped():
    trainer = Trainer(tiny("Pendulum-v1"))
    with torch.no_grad():
        trainer.model.log_std.fill_(2.0)  # σ ≈ 7.4 against bounds of ±2
    trainer.step()
    assert np.abs(trainer._rollout.actions).max() > 2.0
    (trajectory,) = trainer.record(episodes=1, seed=1)
    check_trajectory(trajectory, (1,))
    assert np.abs(trajectory.actions).max() > 2.0 and trajectory.truncated[-1]
    trainer.close()


@pytest.mark.parametrize("kind", ["adam", "rmsprop"])
def test_optimizer_matches_torch_optim(kind):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    reference_net = copy.deepcopy(net)
    ours = Optimizer(list(net.parameters()), kind, 1e-2)
    if kind == "adam":
        reference = torch.optim.Adam(reference_net.parameters(), lr=1e-2, eps=1e-5)
    else:
        reference = torch.optim.RMSprop(reference_net.parameters(), lr=1e-2, eps=1e-5, alpha=0.99)
    for _ in range(10):
        x = torch.randn(16, 4)
        for model, optimizer in ((net, ours), (reference_net, reference)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(net.parameters(), reference_net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_last_rollout_is_cut_at_the_budget():
    # 16 envs × 64 steps = 1024 rows per update; a 2500-step budget needs a 3rd, shorter rollout
    config = tiny("CartPole-v1", num_envs=16, rollout_steps=64, total_steps=2500)
    trainer = Trainer(config)
    try:
        while not trainer.done:
            trainer.step()
        # reset rows do not count, so the run can end a little below a multiple of 16 but
        # never a whole rollout past the budget
        assert config.total_steps <= trainer.env_steps < config.total_steps + config.num_envs
        assert trainer._batch.rewards.shape[0] < config.rollout_steps  # the last one was cut
    finally:
        trainer.close()
