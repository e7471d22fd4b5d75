"""The trainer as a single run (M = 1): smoke runs on every supported env family and both
algorithms, determinism, truncation bootstrapping against the closed form 1/(1−γ), divergence,
checkpoints, recordings, normalisation and gSDE."""

from __future__ import annotations

import copy
import io
import itertools
import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cli_env, stored_and_stepped, stored_update_metric
from gymnasium.wrappers.utils import RunningMeanStd

import gae_core
from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import make_vector_env
from gae_core.agent.normalize import Normalizers
from gae_core.agent.optim import Optimizer
from gae_core.agent.recording import evaluate_values, load_replay
from gae_core.agent.trainer import Trainer, TrainingDiverged
from gae_core.runs.member_run import UpdateLog
from gae_core.trajectory import Trajectory

METRIC_KEYS = {m.key for m in M.UPDATE} | {M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
PPO_KEYS = METRIC_KEYS | {M.APPROX_KL.key, M.CLIP_FRACTION.key}

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
        return [trainer.step()[0] for _ in range(updates)], trainer
    finally:
        trainer.close()


def steps_of(trainer: Trainer) -> int:
    return trainer.member(0).env_steps


PPO = dict(algo="ppo", n_epochs=3, minibatch_size=6)


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
@pytest.mark.parametrize("env_id", FIVE_ENVS)
def test_smoke_each_env(env_id, algo):
    extra = PPO if algo == "ppo" else {}
    results, trainer = run(tiny(env_id, **extra), updates=4)
    assert steps_of(trainer) == results[-1].env_steps >= 4 * 2 * 8 - 2  # minus reset rows
    for result in results:
        assert set(result.metrics) == (PPO_KEYS if algo == "ppo" else METRIC_KEYS)
        assert all(math.isfinite(v) for v in result.metrics.values())
    assert trainer.done == (steps_of(trainer) >= 64)


def test_same_seed_same_metrics_and_episodes():
    def trace(seed):
        config = tiny(seed=seed, num_envs=4, rollout_steps=16, total_steps=10_000)
        results, _ = run(config, updates=15)
        metrics = [
            {k: v for k, v in r.metrics.items() if M.get(k).namespace != "perf"} for r in results
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
    trainer.collect([0])
    rollout = trainer._batch
    # Row 9 is the time limit (truncated, not terminated); row 10 is the env's reset row.
    assert rollout.truncated[:, 0].tolist() == [False] * 9 + [True] + [False] * 2
    assert not rollout.terminated.any()
    assert rollout.valid[:, 0].tolist() == [True] * 10 + [False] + [True]
    trainer.close()


def test_rollout_of_reset_rows_only_is_skipped_not_diverged():
    """rollout_steps 1, envs in lockstep: every 11th rollout is nothing but reset rows. It
    takes no step and reports its learning rate only: no loss was measured."""
    config = tiny(CONSTANT_ID, num_envs=2, rollout_steps=1, lr_schedule="linear")
    results, _ = run(config, updates=12)
    assert results[10].env_steps == results[9].env_steps == 20
    clocks = {M.LEARNING_RATE.key, M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
    assert set(results[10].metrics) == clocks
    assert set(results[9].metrics) == set(results[11].metrics) == METRIC_KEYS
    expected_rate = config.learning_rate * (1 - 20 / config.total_steps)  # the linear schedule
    assert results[10].metrics[M.LEARNING_RATE.key] == pytest.approx(expected_rate)
    assert all(math.isfinite(v) for r in results for v in r.metrics.values())


def test_a_stored_window_averages_only_the_updates_that_measured_a_metric():
    """UpdateLog: an update without a loss (no valid row) leaves that loss's mean alone; the
    learning rate averages over every update, a clock keeps its last value."""
    log = UpdateLog(100)
    loss, rate, wall = M.VALUE_LOSS.key, M.LEARNING_RATE.key, M.WALL_TIME.key
    assert log.add(0, 40, 1.0, {loss: 2.0, rate: 3e-3, wall: 1.0}) == []
    assert log.add(40, 40, 1.5, {rate: 2e-3, wall: 1.5}) == []  # took no step
    rows = {key: (step, value) for key, step, _, value in log.add(40, 120, 2.0,
            {loss: 5.0, rate: 1e-3, wall: 2.0})}  # fmt: skip
    assert rows == {loss: (120, 3.5), rate: (120, pytest.approx(2e-3)), wall: (120, 2.0)}
    assert log.add(120, 160, 2.5, {rate: 1e-3, wall: 2.5}) == []
    assert log.close() == [(rate, 160, 2.5, 1e-3), (wall, 160, 2.5, 2.5)]
    assert log.close() == []


def test_a_runs_stored_loss_rows_leave_out_the_updates_that_took_no_step(tmp_path):
    """Stored end to end (execute_run, the store): every 11th update of this run has no valid
    row; its value-loss rows are the means of the other updates in their windows, and its
    learning-rate rows average every update."""
    config = tiny(CONSTANT_ID, num_envs=2, rollout_steps=1, total_steps=120, log_every=30)
    store, run_id, updates = stored_and_stepped(tmp_path, config)
    assert sum(M.VALUE_LOSS.key not in m for _, m in updates) >= 5
    for metric in (M.VALUE_LOSS, M.LEARNING_RATE):
        expected = stored_update_metric([(s, m.get(metric.key)) for s, m in updates], 30)
        stored = store.metrics(run_id, [metric.key])
        assert stored["env_step"].tolist() == [s for s, _ in expected]
        np.testing.assert_allclose(stored["value"], [v for _, v in expected], rtol=1e-6)
    store.close()


@pytest.mark.slow
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


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
@pytest.mark.parametrize(("part", "what"), [("actor", "loss"), ("critic", "critic values")])
def test_nan_weights_end_the_run_with_training_diverged(part, what, algo):
    """A run whose values or loss become NaN stops learning at that update, reports no metric
    of it, and says what blew up (its run ends failed with this message)."""
    trainer = Trainer(tiny(**(PPO if algo == "ppo" else {})))
    try:
        trainer.step()
        with torch.no_grad():
            getattr(trainer, part).weights[0].fill_(float("nan"))
        assert trainer.step() == {} and trainer.done
        assert trainer.member(0).error == (
            f"{TrainingDiverged.__name__}: {what} became non-finite at update 1"
        )
    finally:
        trainer.close()


def test_checkpoint_round_trip_and_evaluate_values():
    config = tiny(checkpoint_every=32, total_steps=1000)  # (the last rollout ends on 64)
    trainer = Trainer(config)
    member = trainer.member(0)
    assert not member.checkpoint_due()
    while not member.checkpoint_due():
        trainer.step()
    data = trainer.checkpoint_bytes()
    assert member.checkpoint_due()  # a pure read: saving does not move the schedule
    state = torch.load(io.BytesIO(data), weights_only=True)
    assert set(state["model"]) == set(trainer.model_of().state_dict())
    assert set(state) == {"model"}  # no normalisation: no statistics saved
    observations = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    with torch.no_grad():
        expected = trainer.model_of().values(torch.from_numpy(observations)).numpy()
    trainer.step()  # 16 steps: the next multiple of 32 is not crossed yet
    assert not member.checkpoint_due()
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
    trajectories = trainer.record(0, episodes=2, seed=5)
    assert len(trajectories) == 2
    for trajectory in trajectories:
        check_trajectory(trajectory, ())
        assert trajectory.terminated[-1] or len(trajectory) == 500
        copy_ = Trajectory.from_bytes(trajectory.to_bytes())
        for name in ("observations", "actions", "values", "truncated"):
            np.testing.assert_array_equal(getattr(copy_, name), getattr(trajectory, name))
    again = trainer.record(0, episodes=2, seed=5)
    np.testing.assert_array_equal(again[1].actions, trajectories[1].actions)
    trainer.close()


def test_record_truncates_at_time_limit_and_leaves_training_untouched():
    config = tiny(CONSTANT_ID)
    with_recording, plain = Trainer(config), Trainer(config)
    with_recording.step()
    plain.step()
    (trajectory,) = with_recording.record(0, episodes=1, seed=0)
    check_trajectory(trajectory, ())
    assert len(trajectory) == TIME_LIMIT and trajectory.truncated[-1]
    assert not trajectory.terminated.any()
    a, b = with_recording.step()[0].metrics, plain.step()[0].metrics
    assert {k: v for k, v in a.items() if "perf" not in k} == {
        k: v for k, v in b.items() if "perf" not in k
    }


def test_continuous_actions_clipped_for_env_but_logged_unclipped():
    trainer = Trainer(tiny("Pendulum-v1"))
    with torch.no_grad():
        trainer.log_std.fill_(2.0)  # σ ≈ 7.4 against bounds of ±2
    trainer.step()
    assert np.abs(trainer._rollout.actions).max() > 2.0
    (trajectory,) = trainer.record(0, episodes=1, seed=1)
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


@pytest.mark.parametrize("kind", ["adam", "rmsprop"])
@pytest.mark.parametrize("seed", range(4))
def test_a_populations_optimizer_steps_each_member_as_its_own_would(kind, seed):
    """Optimizer.step(rows=...): member m's rows of every parameter end where an optimizer of
    its own ends when stepped only at the updates where m is in ``rows`` (same gradients; to
    float rounding); a member out of a step keeps its parameters and moments. With ``keep``,
    a member in neither (one that has ended) is no longer copied, and the others are as
    before."""
    generator = torch.Generator().manual_seed(seed)
    members, updates = 3, 12
    params = [torch.randn(members, 5, generator=generator), torch.randn(members, 2, 4)]
    alone = [[p[m].clone() for p in params] for m in range(members)]
    population = Optimizer(params, kind, 1e-2)
    optimizers = [Optimizer(own, kind, 1e-2) for own in alone]
    rows = torch.rand(updates, members, generator=generator) < 0.6
    rows[0] = True
    rows[1:3, 0] = False  # member 0 falls behind: Adam's corrections differ between members
    for t in range(updates):
        grads = [torch.randn(p.shape, generator=generator) for p in params]
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        # RMSprop's first moments are the fused kernel's scratch (m = g), not its state
        moments = population.second_moments if kind == "rmsprop" else [
            *population.first_moments, *population.second_moments]  # fmt: skip
        state = (*params, *moments)
        before = [x.clone() for x in state]
        keep = None
        if t >= 8:  # member 2 ended after update 7: out of every later step, and not kept
            rows[t, 2] = False
            keep = ~rows[t] & (torch.arange(members) != 2)
        population.step(rows=rows[t], keep=keep)
        idle = torch.nonzero(~rows[t] if keep is None else keep).flatten()
        for old, new in zip(before, state, strict=True):
            torch.testing.assert_close(new[idle], old[idle], rtol=0, atol=0)
        for m in torch.nonzero(rows[t]).flatten().tolist():
            for own, g in zip(alone[m], grads, strict=True):
                own.grad = g[m].clone()
            optimizers[m].step()
        if t == 7:
            ended_at = [p[2].clone() for p in params]
    counts = rows.cumsum(0)  # members stepping together with different step counts:
    assert any(len(set(counts[t][rows[t]].tolist())) > 1 for t in range(updates))
    for m in range(members):
        for p, own in zip(ended_at if m == 2 else [p[m] for p in params], alone[m], strict=True):
            torch.testing.assert_close(p, own, rtol=1e-6, atol=1e-7)


def test_last_rollout_is_cut_at_the_budget():
    # 16 envs × 64 steps = 1024 rows per update; a 2500-step budget needs a 3rd, shorter rollout
    config = tiny("CartPole-v1", num_envs=16, rollout_steps=64, total_steps=2500)
    trainer = Trainer(config)
    try:
        while not trainer.done:
            trainer.step()
        # reset rows do not count, so the run can end a little below a multiple of 16 but
        # never a whole rollout past the budget
        assert config.total_steps <= steps_of(trainer) < config.total_steps + config.num_envs
        assert trainer._batch.rewards.shape[0] < config.rollout_steps  # the last one was cut
    finally:
        trainer.close()


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_a_run_never_ends_on_a_rollout_of_a_few_rows(algo):
    """Reset rows do not count, so a last rollout cut to the steps a budget needs could fall a
    few steps short and leave a rollout of a few rows after it (PPO then took its epochs over
    them: a Pendulum run ended on 16 rows). The last rollout runs on until the budget is
    counted, up to a quarter of a rollout past its length: over many budgets every rollout
    holds at least a quarter of ``rollout_steps``, a run ends less than ``num_envs`` past its
    budget, and some last rollouts ran past ``rollout_steps``."""
    lengths_past = 0
    for total in range(150, 260, 7):  # 10-step episodes in lockstep, then a reset row each
        config = tiny(CONSTANT_ID, algo=algo, num_envs=2, rollout_steps=8, total_steps=total,
                      minibatch_size=8)  # fmt: skip
        trainer = Trainer(config)
        try:
            lengths = []
            while not trainer.done:
                trainer.step()
                lengths.append(trainer._batch.rewards.shape[0])
            assert min(lengths) >= 2, (total, lengths)
            assert total <= steps_of(trainer) < total + config.num_envs
            lengths_past += max(lengths) > config.rollout_steps
        finally:
            trainer.close()
    assert lengths_past


# ----------------------------------------------------------------------------- issue 9 features


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_mujoco_tasks_train_and_record_with_float64_observations(env_id):
    """MuJoCo returns float64 observations: they are float32 from the env boundary on, and a few
    thousand steps train, checkpoint, record and evaluate without a dtype error."""
    config = tiny(
        env_id,
        total_steps=3000,
        num_envs=4,
        normalize_observations=True,
        normalize_rewards=True,
        log_std_init=-0.5,
    )
    trainer = Trainer(config)
    try:
        assert gym.make(env_id).observation_space.dtype == np.float64
        while not trainer.done:
            (result,) = trainer.step().values()
            assert all(math.isfinite(v) for v in result.metrics.values())
        (trajectory,) = trainer.record(0, 1, seed=3)
        assert trajectory.observations.dtype == np.float32 and len(trajectory) > 0
        assert len(trainer.evaluate(0, 2, seed=0)) == 2
        replay = load_replay(config, trainer.checkpoint_bytes())
        np.testing.assert_allclose(
            replay.model.log_std.detach().numpy(), trainer.log_std[0].detach().numpy()
        )
    finally:
        trainer.close()


def test_normalisation_statistics_round_trip_and_are_frozen_on_replay():
    config = tiny(
        "Pendulum-v1",
        total_steps=1600,
        normalize_observations=True,
        normalize_rewards=True,
        gamma=0.9,
    )
    trainer = Trainer(config)
    try:
        while steps_of(trainer) < 800:
            trainer.step()
        blob = trainer.checkpoint_bytes()
        moments = trainer.normalizers.obs
        mean, var = moments.mean[0].copy(), moments.var[0].copy()
        return_var = float(trainer.normalizers.returns.var[0])
        replay = load_replay(config, blob)
        np.testing.assert_array_equal(replay.obs_mean, mean)
        np.testing.assert_array_equal(replay.obs_var, var)
        assert replay.value_scale == pytest.approx(math.sqrt(return_var + 1e-8))
        # Frozen: more training moves the trainer's statistics, not the replay's.
        while not trainer.done:
            trainer.step()
        assert not np.allclose(trainer.normalizers.obs.mean[0], mean)
        np.testing.assert_array_equal(load_replay(config, blob).obs_mean, mean)
        # The replay normalises exactly like gymnasium's wrapper with the saved statistics.
        wrapped = gym.wrappers.NormalizeObservation(gym.make("Pendulum-v1"))
        wrapped.obs_rms.mean, wrapped.obs_rms.var = mean, var
        wrapped.update_running_mean = False
        normalised, _ = wrapped.reset(seed=5)
        raw, _ = gym.make("Pendulum-v1").reset(seed=5)
        np.testing.assert_allclose(replay.policy_input(raw[None])[0].numpy(), normalised, rtol=1e-6)
        # Values in env reward units: the critic's output on the normalised input times σ.
        with torch.no_grad():
            scaled = replay.model.values(torch.as_tensor(normalised[None], dtype=torch.float32))
        np.testing.assert_allclose(
            replay.values(raw[None]), scaled.numpy() * replay.value_scale, rtol=1e-5
        )
        # Recordings keep the env's own observations and rewards.
        (trajectory,) = trainer.record(0, 1, seed=5)
        np.testing.assert_allclose(trajectory.observations[0], raw, rtol=1e-6)
        assert trajectory.value_scale == pytest.approx(trainer.replay().value_scale)
        assert trajectory.rewards.min() < -0.5  # Pendulum's raw costs, not unit-scaled ones
    finally:
        trainer.close()


def _normalizers(env_id: str, n: int, **fields) -> Normalizers:
    config = TrainConfig(env_id=env_id, num_envs=n, **fields)
    obs_dim = gym.make(env_id).observation_space.shape[0]
    return Normalizers([config], n, obs_dim)


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "Pendulum-v1"])
def test_normalize_clip_clips_what_the_normalisers_output_and_nothing_else(env_id):
    # Two normalisers fed one raw stream: the clip sits above the statistics, so they (and the
    # env's own rewards) are the same with and without it; only the outputs are clipped.
    clip = 0.5
    fields = dict(normalize_observations=True, normalize_rewards=True, gamma=0.9)
    pair = [_normalizers(env_id, 4, normalize_clip=c, **fields) for c in (0.0, clip)]
    env = make_vector_env(env_id, 4)
    try:
        space = env.action_space
        space.seed(1)
        raw, _ = env.reset(seed=2)
        outputs = [n.reset(raw) for n in pair]
        np.testing.assert_array_equal(outputs[1], np.clip(outputs[0], -clip, clip))
        clipped_rewards = 0
        for _ in range(30):
            raw, rewards, terminated, truncated, _ = env.step(space.sample())
            r0, r1 = (n.scale_rewards(rewards, terminated, truncated) for n in pair)
            o0, o1 = (n.observe(raw, terminated | truncated) for n in pair)
            assert o1.dtype == o0.dtype == np.float32
            np.testing.assert_array_equal(o1, np.clip(o0, -clip, clip))
            np.testing.assert_allclose(r1, np.clip(r0, -clip, clip), rtol=1e-6)
            clipped_rewards += int(np.sum(np.abs(r0) > clip))
        assert clipped_rewards > 0  # the case is not vacuous
        a, b = (n.state(0) for n in pair)
        assert a.keys() == b.keys() == {"obs_mean", "obs_var", "obs_count", "return_var"}
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "CartPole-v1"])
@pytest.mark.parametrize("episode_end", [True, False])
def test_reward_normalisation_keeps_its_return_by_the_rule_the_config_names(episode_end, env_id):
    # Random actions: MountainCar's episodes all end truncated at 200 steps, CartPole's end
    # terminated. The running variance must be that of SB3's VecNormalize return (G ← γG + r,
    # restarted after every episode end) or of gymnasium's (G ← γG(1 − terminated) + r, never
    # restarted at truncation), both computed here by hand. The row after an episode end is the
    # NEXT_STEP reset row, which neither rule counts.
    gamma, n = 0.99, 3
    rule = "episode_end" if episode_end else "termination"
    normalizers = _normalizers(
        env_id, n, normalize_rewards=True, gamma=gamma, reward_norm_reset=rule, normalize_clip=0
    )
    env = make_vector_env(env_id, n)
    try:
        env.reset(seed=4)
        env.action_space.seed(4)
        returns = {"sb3": np.zeros(n), "gymnasium": np.zeros(n)}  # as each keeps it
        seen = {"sb3": RunningMeanStd(shape=()), "gymnasium": RunningMeanStd(shape=())}
        ended = np.zeros(n, bool)
        ends = np.zeros(2, int)  # terminations, truncations
        for _ in range(1200):
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            scaled = normalizers.scale_rewards(reward, terminated, truncated)
            active = ~ended
            returns["sb3"][active] = returns["sb3"][active] * gamma + reward[active]
            kept, carried = 1.0 - terminated[active], returns["gymnasium"][active]
            returns["gymnasium"][active] = carried * gamma * kept + reward[active]
            for name in returns:
                if active.any():
                    seen[name].update(returns[name][active])
            ended = terminated | truncated
            returns["sb3"][ended] = 0.0
            ends += terminated.sum(), truncated.sum()
        if env_id == "MountainCar-v0":
            assert ends.tolist() == [0, 5 * n]  # five truncations per env, no flag reached
        else:
            assert ends[0] > 50 and ends[1] == 0  # many short terminated episodes
        variance = normalizers.returns.var[0]
        mine, other = ("sb3", "gymnasium") if episode_end else ("gymnasium", "sb3")
        assert variance == pytest.approx(seen[mine].var, rel=1e-9)
        # the rules differ here: by 0.07 % on CartPole; on MountainCar gymnasium's is 41 % lower
        assert abs(variance / seen[other].var - 1) > (1e-4 if env_id == "CartPole-v1" else 0.3)
        np.testing.assert_allclose(scaled, reward / np.sqrt(variance + 1e-8), rtol=1e-6)
    finally:
        env.close()


@pytest.mark.parametrize("reset", ["episode_end", "termination"])
def test_the_trainer_normalises_and_clips_as_its_config_names(reset):
    config = tiny(
        "MountainCar-v0",
        normalize_observations=True,
        normalize_rewards=True,
        normalize_clip=0.05,  # binds on MountainCar's first scaled rewards and observations
        reward_norm_reset=reset,
    )
    trainer = Trainer(config)
    try:
        assert trainer.normalizers.episode_reset.all() == (reset == "episode_end")
        trainer.collect([0])
        rollout = trainer._batch
        assert np.abs(rollout.rewards).max() == pytest.approx(0.05)  # clipped, not merely small
        assert np.abs(rollout.observations).max() == pytest.approx(0.05)
    finally:
        trainer.close()


def test_the_replay_clips_its_frozen_normalisation_like_training():
    """The replay's network input equals what the trainer's normaliser (its statistics frozen,
    then the clip) makes of the same raw observations, and the clip binds on them."""
    config = tiny("Pendulum-v1", total_steps=400, normalize_observations=True, normalize_clip=0.25)
    trainer = Trainer(config)
    try:
        while not trainer.done:
            trainer.step()
        replay = load_replay(config, trainer.checkpoint_bytes())
        assert replay.clip == trainer.replay().clip == 0.25
        raw = np.array([[1.0, 0.0, 8.0], [-1.0, 0.0, -8.0], [0.3, -0.9, 0.1]], np.float32)
        moments = trainer.normalizers.obs
        unclipped = (raw - moments.mean[0]) / np.sqrt(moments.var[0] + 1e-8)
        trained = np.clip(unclipped, -0.25, 0.25)
        assert np.abs(unclipped).max() > 0.25
        np.testing.assert_allclose(replay.policy_input(raw).numpy(), trained, rtol=1e-6, atol=1e-7)
    finally:
        trainer.close()


def test_episode_returns_count_the_envs_own_rewards_under_reward_normalisation():
    config = tiny("CartPole-v1", total_steps=3000, normalize_rewards=True)
    trainer = Trainer(config)
    try:
        episodes = []
        while not trainer.done:
            episodes += trainer.step()[0].episodes
        assert episodes
        for episode in episodes:  # CartPole pays 1 per step: return == length, unscaled
            assert episode.return_ == pytest.approx(episode.length)
    finally:
        trainer.close()


def test_critic_target_changes_the_target_and_leaves_advantages_unchanged():
    """Same rollout, two critic targets: the advantages are identical; the fixed λ = 1 target is
    the discounted return bootstrapped at cuts (closed form via discounted_returns), and the
    default target is the λ-return with the advantage's λ."""
    outputs = {}
    for target in ("advantage_lambda", "fixed_lambda"):
        config = tiny(lambda_=0.7, critic_target=target, critic_lambda=1.0)
        trainer = Trainer(config)
        try:
            trainer.collect([0])
            rollout = trainer._batch
            with torch.no_grad():
                values = trainer.critic(trainer.by_member(rollout.observations)).squeeze(-1)
            advantages, returns = trainer.estimate(values)
            steps = rollout.rewards.shape
            all_values = values.reshape(steps[0] + 1, steps[1]).numpy()  # member-major, M = 1
            outputs[target] = (
                advantages.reshape(steps).numpy(), returns.reshape(steps).numpy(), rollout,
                all_values,
            )  # fmt: skip
        finally:
            trainer.close()
    adv_a, returns_a, rollout, all_values = outputs["advantage_lambda"]
    adv_f, returns_f, _, _ = outputs["fixed_lambda"]
    np.testing.assert_array_equal(adv_a, adv_f)
    np.testing.assert_allclose(returns_a, adv_a + all_values[:-1], rtol=1e-6, atol=1e-6)
    discounted = gae_core.discounted_returns(
        rollout.rewards, all_values[1:], rollout.terminated, rollout.truncated, gamma=0.99
    )
    np.testing.assert_allclose(returns_f, discounted, rtol=1e-5, atol=1e-5)
    assert not np.allclose(returns_f, returns_a)


def test_linear_schedule_decays_the_learning_rate_to_zero():
    config = tiny(total_steps=640, learning_rate=1e-2, lr_schedule="linear")
    trainer = Trainer(config)
    try:
        rates, expected = [], []
        while not trainer.done:
            expected.append(1e-2 * (1 - steps_of(trainer) / 640))  # lr·(1 − spent/budget)
            rates.append(trainer.step()[0].metrics[M.LEARNING_RATE.key])
    finally:
        trainer.close()
    assert rates[0] == pytest.approx(1e-2)
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    assert all(b < a for a, b in itertools.pairwise(rates)) and rates[-1] < 1e-2 / 20
    assert trainer.optimizer.learning_rate == rates[-1]


def test_deterministic_evaluation_is_repeatable_and_leaves_training_alone():
    trainer = Trainer(tiny(total_steps=10_000))
    other = Trainer(tiny(total_steps=10_000))
    try:
        for _ in range(5):
            trainer.step()
            other.step()
        first = trainer.evaluate(0, 3, seed=11)
        assert first == trainer.evaluate(0, 3, seed=11)
        assert all(r == int(r) and 8 <= r <= 500 for r in first)  # CartPole: 1 per step
        # evaluating did not perturb training: the twin that never evaluated matches
        a, b = trainer.step()[0].metrics, other.step()[0].metrics
        assert a[M.VALUE_LOSS.key] == b[M.VALUE_LOSS.key]
    finally:
        trainer.close()
        other.close()


def test_log_std_init_sets_the_initial_exploration():
    trainer = Trainer(tiny("Pendulum-v1", log_std_init=-2.0))
    try:
        np.testing.assert_array_equal(trainer.log_std.detach().numpy(), [[-2.0]])
    finally:
        trainer.close()


def _sde_model(seed: int = 0, log_std_init: float = -1.0):
    from gae_core.agent.policy import ActorCritic

    observations = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    actions = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    return ActorCritic(observations, actions, (8, 5), seed, log_std_init, sde=True)


def test_gsde_log_prob_and_entropy_are_the_gaussians_with_state_dependent_std():
    """log π(a|s) and the entropy of gSDE's policy are those of N(μ(s), φ(s)² · σ² + ε) per
    action dimension (torch.distributions as the reference), with a per-entry log-std and
    gradients reaching it and the mean but not the features φ."""
    from gae_core.agent.policy import SDE_EPSILON

    model = _sde_model()
    assert model.log_std.shape == (5, 2)  # last hidden width × action dims
    with torch.no_grad():
        model.log_std.copy_(torch.randn(5, 2, generator=torch.Generator().manual_seed(1)))
    rng = np.random.default_rng(0)
    obs = torch.from_numpy(rng.normal(size=(6, 3)).astype(np.float32))
    actions = torch.from_numpy(rng.normal(size=(6, 2)).astype(np.float32))
    log_probs, entropy = model.log_probs_and_entropy(obs, actions)
    hidden = obs
    for layer in [m for m in model.actor if isinstance(m, torch.nn.Linear)][:-1]:
        hidden = torch.tanh(layer(hidden))
    mean = model.actor(obs)
    variance = hidden.detach().square() @ model.log_std.exp().square() + SDE_EPSILON
    reference = torch.distributions.Normal(mean, variance.sqrt())
    torch.testing.assert_close(log_probs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    (log_probs.sum() + entropy.sum()).backward()
    assert model.log_std.grad is not None and model.log_std.grad.abs().sum() > 0


def test_gsde_noise_has_the_policys_variance_and_is_fixed_within_a_rollout():
    """With a drawn matrix W per env (the trainer's own draw and sampling) the noise is
    φ(s) · W: linear in the features, so the same W gives the same noise for the same state,
    and over many W its variance per action dimension is φ(s)² · σ² (the distribution the
    log-prob uses). Without W (a replay's ``sample``) each row is drawn from that distribution
    directly."""
    config = tiny("Pendulum-v1", use_sde=True, log_std_init=-0.5, num_envs=50)
    trainer = Trainer(config)
    model = trainer.model_of(0)
    rng = np.random.default_rng(0)
    row = rng.normal(size=(1, 3)).astype(np.float32)
    obs = np.repeat(row, config.num_envs, axis=0)  # every env in the same state
    with torch.inference_mode():
        mean = model.act(torch.from_numpy(row))
        _, features = model._actor_features(torch.from_numpy(row))
        expected = (features.square() @ model.log_std.exp().square()).numpy()[0]
        drawn, again, fresh = [], [], []
        for _ in range(400):  # 20,000 matrices
            noise = trainer._sde_noise()
            drawn.append(trainer._sample(obs, trainer._rng, noise, 0, None) - mean)
            again.append(trainer._sample(obs, trainer._rng, noise, 1, None) - mean)
            fresh.append(model.sample(torch.from_numpy(obs), rng) - mean)
    drawn, again, fresh = (np.concatenate(x) for x in (drawn, again, fresh))
    trainer.close()
    assert drawn.shape == (20_000, 1)
    np.testing.assert_allclose(drawn, again, rtol=1e-6, atol=1e-7)  # same W, same noise
    for samples in (drawn, fresh):
        assert np.all(np.abs(samples.mean(axis=0)) <= 4 * np.sqrt(expected / len(samples)))
        # the sample variance's standard error is √(2/n)·σ² ≈ 1 % of it here
        np.testing.assert_allclose(samples.var(axis=0), expected, rtol=0.05)


@pytest.mark.parametrize(("freq", "per_rollout"), [(-1, 1), (0, 1), (3, 3), (4, 2)])
def test_a_gsde_run_draws_its_matrices_as_sde_sample_freq_says_and_replays_its_checkpoint(
    freq, per_rollout
):
    """One matrix per env at each rollout's start, and again at every multiple of
    ``sde_sample_freq`` steps into it (SB3's rule); 8-step rollouts here."""
    config = tiny("Pendulum-v1", use_sde=True, log_std_init=-2.0, total_steps=48,
                  sde_sample_freq=freq)  # fmt: skip
    trainer = Trainer(config)
    draws = []
    original = trainer._sde_noise

    def counted():
        noise = original()
        draws.append(tuple(noise.shape))
        return noise

    trainer._sde_noise = counted
    try:
        while not trainer.done:
            trainer.step()
        # one matrix per env, [members, envs, features, actions], per_rollout times a rollout
        assert draws == [(1, config.num_envs, 16, 1)] * (trainer.updates * per_rollout)
        replay = load_replay(config, trainer.checkpoint_bytes())
        assert replay.model.sde and replay.model.log_std.shape == (16, 1)
        obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
        with torch.inference_mode():
            mean = trainer.actor(torch.from_numpy(obs)[None])[0].numpy()
        np.testing.assert_allclose(replay.act(obs), mean, rtol=1e-6, atol=1e-7)
    finally:
        trainer.close()


def test_ortho_init_off_is_pytorchs_linear_init_from_the_runs_seed():
    """ortho_init=False: every layer's weights and biases ~ U(±1/√fan_in) (nn.Linear's own
    init, SB3's ortho_init=False), drawn from the run's seed, never the global RNG; on: the
    orthogonal recipe (W Wᵀ = gain² I for a wide-enough layer, zero biases)."""
    from gae_core.agent.policy import ActorCritic

    observations = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    actions = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    plain = ActorCritic(observations, actions, (64, 64), 7, ortho_init=False)
    torch.manual_seed(123)  # the global RNG moved: the weights come from the seed alone
    again = ActorCritic(observations, actions, (64, 64), 7, ortho_init=False)
    orthogonal = ActorCritic(observations, actions, (64, 64), 7)
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(tensor, again.state_dict()[name])  # from the seed alone
    layers = [m for m in (*plain.actor, *plain.critic) if isinstance(m, torch.nn.Linear)]
    for layer in layers:
        bound = 1.0 / math.sqrt(layer.in_features)
        for tensor in (layer.weight, layer.bias):
            assert tensor.abs().max() <= bound
            if tensor.numel() >= 64:  # and spread over the whole range
                assert tensor.abs().max() > 0.9 * bound
    # a uniform on ±b has variance b²/3
    first = layers[0].weight.detach()
    assert first.var().item() == pytest.approx(1.0 / (3 * 3), rel=0.35)
    hidden = orthogonal.actor[2].weight.detach()  # 64 × 64, gain √2
    torch.testing.assert_close(hidden @ hidden.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    assert all(not m.bias.any() for m in orthogonal.actor if isinstance(m, torch.nn.Linear))


def test_mujoco_envs_build_without_warnings_a_user_cannot_act_on():
    # MuJoCo's "settotalmass is deprecated" and gymnasium's float32 Box notes, printed dozens of
    # times by a MuJoCo run before, are silenced once at the env boundary; other warnings pass
    code = (
        "import warnings\n"
        "from gae_core.agent.envs import make_eval_env, make_vector_env\n"
        "from gae_core.lab.states import Simulator\n"
        "make_eval_env('HalfCheetah-v5').reset(seed=0)\n"
        "make_vector_env('Hopper-v5', 2).reset(seed=0)\n"
        "Simulator('Walker2d-v5', 2)\n"
        "warnings.warn('another warning still shows')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=cli_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "settotalmass" not in output and "precision lowered" not in output
    assert "another warning still shows" in output


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_use_sde_on_discrete_actions_is_idle_and_trains_the_same_numbers(algo):
    """``use_sde`` is idle on a categorical policy (``idle_fields`` says so, and a comparison
    counts such runs as one): it must not switch the gradient's route either, whose float
    rounding differs."""
    base = dict(env_id="CartPole-v1", algo=algo, num_envs=2, rollout_steps=8, seed=3,
                total_steps=400, **({"minibatch_size": 8} if algo == "ppo" else {}))  # fmt: skip
    plain, sde = TrainConfig(**base), TrainConfig(**base, use_sde=True)
    assert "use_sde" in sde.idle_fields()
    trainers = [Trainer(plain), Trainer(sde)]
    assert trainers[0].by_hand and trainers[1].by_hand
    for trainer in trainers:
        while not trainer.done:
            trainer.step()
    for mine, theirs in zip(*(t.actor.parameters() for t in trainers), strict=True):
        assert torch.equal(mine, theirs)
    for trainer in trainers:
        trainer.close()


def test_a_gsde_trainer_never_takes_the_gradient_by_hand_even_when_asked():
    """gSDE's noise scale depends on the features, which the gradients by hand leave out:
    asking such a trainer for them (a benchmark sets ``by_hand``) changes nothing."""
    trainer = Trainer(tiny("Pendulum-v1", use_sde=True))
    assert not trainer.by_hand
    trainer.by_hand = True
    assert not trainer.by_hand and not trainer._hand
    trainer.close()
    plain = Trainer(tiny("Pendulum-v1"))
    assert plain.by_hand
    plain.by_hand = False  # autograd, on request
    assert not plain.by_hand and not plain._hand
    plain.close()
