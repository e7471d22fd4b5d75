"""Batched populations (gae_core.agent.population): each member learns exactly what a single run
with its config would learn from the same data, members never leak into one another, and a
population run stores each member as its own run."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import stored_update_metric
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.policy import ActorCritic
from gae_core.agent.population import PopulationTrainer, can_join, population_key
from gae_core.agent.recording import Replay, evaluate_replay, load_replay, record_replay
from gae_core.agent.stacked import (
    NARROW_MAX,
    TANH_VIA_SIGMOID_MIN,
    TANH_VIA_SIGMOID_MIN_NO_GRAD,
    StackedMLP,
    stacked_linear,
    stacked_tanh,
)
from gae_core.agent.trainer import Rollout, Trainer
from gae_core.runs.execute import StoreSink, eval_seed, record_seed
from gae_core.runs.population_run import execute_population
from gae_core.runs.store import RunStore
from gae_core.trajectory import Trajectory


def config(env_id: str = "CartPole-v1", **overrides) -> TrainConfig:
    base = dict(
        env_id=env_id,
        num_envs=3,
        rollout_steps=6,
        total_steps=400,
        hidden_sizes=(16, 16),
        checkpoint_every=0,
        record_episodes=0,
        torch_threads=1,
    )
    return TrainConfig(**{**base, **overrides})


#: Members that differ in every per-member field.
MEMBERS = [
    dict(seed=0, lambda_=0.0, gamma=0.99),
    dict(seed=1, lambda_=0.95, gamma=0.9, value_coef=1.0, entropy_coef=0.01),
    dict(seed=2, lambda_=1.0, gamma=0.999, critic_target="fixed_lambda", critic_lambda=0.5),
    dict(seed=3, lambda_=0.5, gamma=0.95, max_grad_norm=0.0),  # no clipping
]


def test_members_start_from_the_single_runs_weights():
    configs = [config(**m) for m in MEMBERS]
    population = PopulationTrainer(configs)
    try:
        for i, c in enumerate(configs):
            single = ActorCritic(
                population.env.single_observation_space, population.env.single_action_space,
                c.hidden_sizes, c.seed, c.log_std_init,
            )  # fmt: skip
            ours = population.model_of(i).state_dict()
            for name, tensor in single.state_dict().items():
                torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0)
    finally:
        population.close()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 700),
    scale=st.sampled_from([1e-4, 0.1, 1.0, 4.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_stacked_tanh_is_tanh_and_its_gradient_is_tanhs(rows, scale, seed):
    """tanh(x) = 2·σ(2x) − 1 (its form above TANH_VIA_SIGMOID_MIN elements with a gradient,
    TANH_VIA_SIGMOID_MIN_NO_GRAD without) agrees with torch.tanh to 4e-7 at any scale of x,
    with the gradient (1 − tanh²(x))·g, with grad enabled or not; below the threshold it is
    torch.tanh itself. NaN and ±inf map as tanh's."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, rows, 64, generator=generator) * scale
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    expected = torch.tanh(x)
    with torch.no_grad():
        got = stacked_tanh(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=4e-7, equal_nan=True)
    if x.numel() < TANH_VIA_SIGMOID_MIN_NO_GRAD:
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    leaf = x.clone().requires_grad_(True)
    grad = torch.randn(x.shape, generator=generator)
    forward = stacked_tanh(leaf)
    torch.testing.assert_close(forward.detach(), expected, rtol=0, atol=4e-7, equal_nan=True)
    if x.numel() < TANH_VIA_SIGMOID_MIN:
        assert torch.equal(forward.detach().nan_to_num(), expected.nan_to_num())
    (gradient,) = torch.autograd.grad(forward, leaf, grad)
    exact = (1 - expected.square()) * grad
    assert torch.equal(gradient.isnan(), exact.isnan())
    error = (gradient - exact).nan_to_num().abs()
    assert bool((error <= 1e-6 * grad.abs() + 1e-12).all())  # 1 − y² to ~2·4e-7, times g


@settings(max_examples=40, deadline=None)
@given(
    members=st.integers(1, 6),
    rows=st.integers(1, 300),
    fan_in=st.sampled_from([1, 4, 17, 64]),
    fan_out=st.sampled_from([1, 2, 3, NARROW_MAX, NARROW_MAX + 1]),
    grads=st.sampled_from(["all", "no input", "none"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_stacked_linear_is_baddbmm_with_its_gradients(members, rows, fan_in, fan_out, grads, seed):
    """stacked_linear(b, x, W) = baddbmm(b, x, W) (narrow layers take transposed forms), and
    its gradients with respect to b, x and W are baddbmm's, for any shapes, whichever inputs
    need a gradient, and without one."""
    generator = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    bias, x, weight = (
        make(members, 1, fan_out),
        make(members, rows, fan_in),
        make(members, fan_in, fan_out),
    )
    grad = make(members, rows, fan_out)
    inputs = {"all": (bias, x, weight), "no input": (bias, weight), "none": ()}[grads]
    ours = [t.clone().requires_grad_(any(t is i for i in inputs)) for t in (bias, x, weight)]
    theirs = [t.clone().requires_grad_(any(t is i for i in inputs)) for t in (bias, x, weight)]
    out = stacked_linear(*ours)
    expected = torch.baddbmm(*theirs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.shape == (members, rows, fan_out) and out.is_contiguous()
    if inputs:
        out.backward(grad)
        expected.backward(grad)
        for mine, reference in zip(ours, theirs, strict=True):
            if reference.grad is None:
                assert mine.grad is None
            else:
                torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(stacked_linear(bias, x, weight), expected.detach())


def test_a_stacked_network_is_its_members_networks():
    """Each member's slice of a StackedMLP forward (the sigmoid form of tanh included: 300
    rows × 64 units per member is over its threshold) is that member's own nn.Sequential."""
    observations = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    nets = [
        ActorCritic(observations, gym.spaces.Discrete(2), (64, 64), seed, 0.0).actor
        for seed in range(4)
    ]
    stacked = StackedMLP(nets)
    x = torch.randn(4, 300, 4, generator=torch.Generator().manual_seed(0))
    assert x.shape[0] * x.shape[1] * 64 >= TANH_VIA_SIGMOID_MIN
    with torch.no_grad():
        out = stacked(x)
        for i, net in enumerate(nets):
            torch.testing.assert_close(out[i], net(x[i]), rtol=1e-5, atol=2e-6)
        # snapshots of single members, joined in another order, are those members' networks
        order = [2, 0, 3]
        joined = StackedMLP.concat([stacked.select([i]) for i in order])
        torch.testing.assert_close(joined(x[order]), out[order], rtol=0, atol=0)
        for p in stacked.parameters():
            p.data.add_(1.0)  # the stack trains on: a snapshot keeps the weights it was taken with
        torch.testing.assert_close(joined(x[order]), out[order], rtol=0, atol=0)


def _member_rollout(population: PopulationTrainer, member: int) -> Rollout:
    """Member ``member``'s columns of the rollout the population just collected."""
    batch, per = population._batch, population.envs_per_member
    columns = slice(member * per, (member + 1) * per)
    view = object.__new__(Rollout)
    for name in ("observations", "actions", "rewards", "terminated", "truncated", "valid"):
        setattr(view, name, np.ascontiguousarray(getattr(batch, name)[:, columns]))
    return view


@pytest.mark.parametrize(
    ("env_id", "shared"),
    [
        ("CartPole-v1", dict(optimizer="rmsprop", learning_rate=7e-4)),
        ("CartPole-v1", dict(optimizer="adam", learning_rate=3e-3, normalize_advantages=True)),
        ("Pendulum-v1", dict(optimizer="adam", learning_rate=1e-3, lr_schedule="linear")),
        # members count different steps (CartPole's resets), so their rates decay apart
        ("CartPole-v1", dict(optimizer="rmsprop", learning_rate=7e-4, lr_schedule="linear")),
        ("CartPole-v1", dict(optimizer="adam", learning_rate=1e-3, lr_schedule="linear")),
    ],
)
@pytest.mark.parametrize("autograd", [False, True], ids=["by-hand", "autograd"])
def test_each_member_takes_the_update_a_single_run_takes_on_the_same_data(env_id, shared, autograd):
    """Feed every member's slice of the population's rollout to a single Trainer with that
    member's config: after each of several updates the member's weights, losses, gradient norm
    and explained variance equal the single run's (per-member means, standardisation, GAE with
    its own γ and λ, its critic target, its clipping and its optimizer state), on both of the
    population's engines."""
    members = [dict(m, log_std_init=-0.5 + 0.1 * i) for i, m in enumerate(MEMBERS)]
    configs = [config(env_id, **shared, **m) for m in members]
    population = PopulationTrainer(configs, autograd=autograd)
    assert (population.engine is None) == autograd
    singles = [Trainer(c) for c in configs]
    try:
        for update in range(4):
            active = list(range(len(MEMBERS)))
            for state in population._members:
                state.steps_before_update = state.env_steps
            population._collect(active)
            expected = []
            for i, single in enumerate(singles):
                single._batch = _member_rollout(population, i)
                single._steps_before_update = population._members[i].steps_before_update
                expected.append(single.update(*single.estimate()))
            got = population._update(active)
            for i, single in enumerate(singles):
                ours = population.model_of(i).state_dict()
                for name, tensor in single.model.state_dict().items():
                    torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=2e-6)
                for metric in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.GRAD_NORM,
                               M.EXPLAINED_VARIANCE, M.ADVANTAGE_MEAN, M.ADVANTAGE_STD,
                               M.LEARNING_RATE):  # fmt: skip
                    assert got[i][metric.key] == pytest.approx(
                        expected[i][metric.key], rel=1e-4, abs=1e-5
                    ), (update, i, metric.key)
    finally:
        population.close()
        for single in singles:
            single.close()


def test_no_member_overshoots_its_budget_more_than_a_single_run():
    """Members count different steps per rollout (the step after an episode's end resets and is
    not counted), so the last rollout is as long as the member furthest from its budget needs.
    The others' rows end where their budgets do, with a bootstrap there: each member ends
    within num_envs − 1 steps of its budget, as a single run does, and its last rollout's
    advantages are those of a single run's shorter last rollout."""
    configs = [config(**m, total_steps=1_000, rollout_steps=64) for m in MEMBERS]
    population = PopulationTrainer(configs)
    last: dict[int, tuple] = {}  # member → (its steps before, its result, its rows) at its end
    try:
        while not population.done:
            before = [state.env_steps for state in population._members]
            results = population.step()
            for i, result in results.items():
                last[i] = (before[i], result, _member_rollout(population, i))
        ended_early = 0
        for i, c in enumerate(configs):
            steps_before, result, view = last[i]
            assert c.total_steps <= result.env_steps < c.total_steps + c.num_envs, i
            assert all(e.env_step <= result.env_steps for e in result.episodes)
            assert view.valid.sum() == result.env_steps - steps_before
            final_row = np.flatnonzero(view.valid.any(axis=1))[-1]
            if final_row < len(view.valid) - 1:  # its rollout ended early: bootstrapped there
                ended_early += 1
                assert (view.truncated[final_row] | view.terminated[final_row]).all()
                assert not view.valid[final_row + 1 :].any()
        assert ended_early  # the case this is about happened
    finally:
        population.close()


@contextlib.contextmanager
def _stepped_population(env_id: str = "CartPole-v1", updates: int = 3):
    """A population of :data:`MEMBERS` after ``updates`` updates, closed on exit."""
    population = PopulationTrainer([config(env_id, **m) for m in MEMBERS])
    try:
        for _ in range(updates):
            population.step()
        yield population
    finally:
        population.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_members_evaluation_is_the_one_it_would_have_alone(env_id):
    """Evaluated with others, in any order and company, a member's deterministic episodes are
    those of its own weights on the envs its seed gives, exactly what a single run's
    evaluation of the same weights returns (the same start states at every evaluation)."""
    with _stepped_population(env_id) as population:
        seeds = {i: 1_000 + 7 * i for i in range(len(MEMBERS))}
        alone = {
            i: evaluate_replay(Replay(population.model_of(i)), env_id, 3, seeds[i])
            for i in range(len(MEMBERS))
        }
        for due in ([0, 1, 2, 3], [3, 1], [2]):
            got = population.evaluate_members(due, 3, [seeds[i] for i in due])
            assert set(got) == set(due)
            for i in due:
                np.testing.assert_allclose(got[i], alone[i], rtol=1e-5, err_msg=str((due, i)))
        with pytest.raises(ValueError, match="seeds: one per member, got 1 for 2"):
            population.evaluate_members([0, 1], 3, [5])


def test_evaluations_in_one_joined_cartpole_env_are_those_on_envs_of_their_own(monkeypatch):
    """CartPole's evaluations step every policy's episodes in one native vector env whose
    blocks start from each policy's own seed: the returns equal those of each policy on a
    vector env of its own (the general path), for members with different episode lengths."""
    from gae_core.agent import recording

    with _stepped_population() as population:
        members, seeds = [3, 0, 2, 1], [40, 7, 7, 123]
        joined = population.evaluate_members(members, 4, seeds)
        assert recording._joined_native_env("CartPole-v1", 4, seeds) is not None
        monkeypatch.setattr(recording, "_joined_native_env", lambda *args: None)
        separate = population.evaluate_members(members, 4, seeds)
        assert joined == separate
        assert len({r for returns in separate.values() for r in returns}) > 1


def test_a_gymnasium_whose_cartpole_state_moved_gets_envs_of_their_own(monkeypatch):
    """The joined env relies on CartPole's internal ``state`` array. A gymnasium where writing
    it no longer moves the env (simulated: the write is dropped) fails the run-time check, and
    evaluations fall back to an env per policy with the same returns as that path."""
    from gae_core.agent import recording

    with _stepped_population() as population:
        members, seeds = [0, 2, 1], [3, 99, 3]
        expected = population.evaluate_members(members, 3, seeds)
        real_join = recording._join_blocks

        def join_without_state(env_id, episodes, seeds):
            joined = real_join(env_id, episodes, seeds)
            env, obs = joined
            env.reset(seed=seeds[0])  # the blocks' start states are lost
            return env, obs

        monkeypatch.setattr(recording, "_join_blocks", join_without_state)
        recording._joining_works.cache_clear()
        try:
            assert not recording._joining_works("CartPole-v1")
            assert recording._joined_native_env("CartPole-v1", 3, seeds) is None
            assert population.evaluate_members(members, 3, seeds) == expected
        finally:
            recording._joining_works.cache_clear()
        monkeypatch.undo()
        assert recording._joining_works("CartPole-v1")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_members_recorded_together_record_what_each_would_alone(env_id):
    """Recorded in lockstep with others (one stacked forward pass per step), a member's
    episodes are those record_replay of its own weights plays: the same start states,
    actions drawn from its own generator, values and log-probs under its own networks
    (discrete actions exactly; Gaussian ones up to the float32 rounding of a batched matmul,
    which Pendulum's dynamics amplify along an episode: compared closely over its first 50
    steps, and by its return over all 200)."""
    with _stepped_population(env_id) as population:
        seeds = {i: 500 + 11 * i for i in range(len(MEMBERS))}
        alone = {
            i: record_replay(Replay(population.model_of(i)), env_id, 2, seeds[i])
            for i in range(len(MEMBERS))
        }
        lengths = {len(t.rewards) for episodes in alone.values() for t in episodes}
        if env_id == "CartPole-v1":  # episodes that end at different steps (Pendulum's: 200)
            assert len(lengths) > 1
        for due in ([0, 1, 2, 3], [3, 1], [2]):
            got = population.record_members(due, 2, [seeds[i] for i in due])
            assert set(got) == set(due)
            for i in due:
                assert len(got[i]) == 2
                for ours, theirs in zip(got[i], alone[i], strict=True):
                    for name in ("terminated", "truncated"):
                        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
                    exact = ("observations", "next_observations", "actions", "rewards")
                    for name in exact if env_id == "CartPole-v1" else ():
                        np.testing.assert_array_equal(
                            getattr(ours, name), getattr(theirs, name), err_msg=f"{due} {i}"
                        )
                    steps = slice(None) if env_id == "CartPole-v1" else slice(0, 50)
                    for name in (*exact, "values", "next_values", "log_probs"):
                        np.testing.assert_allclose(
                            getattr(ours, name)[steps], getattr(theirs, name)[steps],
                            rtol=1e-5, atol=1e-6,
                        )  # fmt: skip
                    assert ours.rewards.sum() == pytest.approx(theirs.rewards.sum(), rel=1e-4)
        with pytest.raises(ValueError, match="seeds: one per member, got 1 for 2"):
            population.record_members([0, 1], 2, [5])


@pytest.mark.parametrize("autograd", [False, True], ids=["by-hand", "autograd"])
@pytest.mark.parametrize(("net", "what"), [("critic", "critic values"), ("actor", "loss")])
def test_a_member_that_blows_up_fails_alone(autograd, net, what):
    configs = [config(**m) for m in MEMBERS[:3]]
    population = PopulationTrainer(configs, autograd=autograd)
    try:
        with torch.no_grad():
            getattr(population, net).weights[-1][1].fill_(float("nan"))  # member 1's
        before = [population.model_of(i).state_dict() for i in (0, 2)]
        results = population.step()
        assert set(results) == {0, 2}
        assert population.member(1).error.startswith(f"TrainingDiverged: {what} became non-fin")
        for i, old in zip((0, 2), before, strict=True):
            new = population.model_of(i).state_dict()
            assert all(torch.isfinite(t).all() for t in new.values())
            assert any(not torch.equal(new[k], old[k]) for k in old)  # it did learn
        results = population.step()
        assert set(results) == {0, 2}
    finally:
        population.close()


def test_a_member_whose_gradient_blows_up_fails_alone_and_is_not_counted_as_stepping(
    monkeypatch,
):
    """Its loss is finite, its gradient not: it fails alone, the others step, and the
    optimizer does not count a step for it (it ended: its rows are no longer kept either)."""
    configs = [config(**m) for m in MEMBERS[:3]]
    population = PopulationTrainer(configs)
    engine, optimizer = population.engine, population.optimizer
    try:
        for _ in range(3):
            population.step()
        real = engine.gradients

        def gradients(*args, **kwargs):
            terms = real(*args, **kwargs)
            engine.grad[1] = float("nan")
            return terms

        monkeypatch.setattr(engine, "gradients", gradients)
        weights, counts = engine.flat.clone(), optimizer.row_steps.copy()
        assert set(population.step()) == {0, 2}
        assert population.member(1).error.startswith("TrainingDiverged: gradient became non-fin")
        assert optimizer.row_steps.tolist() == [counts[0] + 1, counts[1], counts[2] + 1]
        assert all(torch.isfinite(engine.flat[i]).all() for i in range(3))
        assert not torch.equal(engine.flat[0], weights[0])
        assert not torch.equal(engine.flat[2], weights[2])
    finally:
        population.close()


def test_only_configs_that_can_share_a_population_do():
    a = config(seed=0, lambda_=0.5)
    assert population_key(a) == population_key(config(seed=7, lambda_=0.99, gamma=0.9))
    assert population_key(a) != population_key(config(num_envs=4))
    assert population_key(a) != population_key(config(learning_rate=1e-2))
    # without normalisation (every population) the clip and the return rule change nothing
    loose = config(normalize_clip=0.0, reward_norm_reset="termination")
    assert population_key(a) == population_key(loose) and can_join(loose)
    assert not can_join(config(normalize_observations=True))
    assert not can_join(config("Pendulum-v1", use_sde=True))
    with pytest.raises(ValueError, match="must differ only in seed"):
        PopulationTrainer([a, config(num_envs=4)])
    for alone in (config(normalize_rewards=True), config("Pendulum-v1", use_sde=True)):
        with pytest.raises(ValueError, match="without normalisation or gSDE"):
            PopulationTrainer([alone])


def test_a_population_run_stores_each_member_as_its_own_run(tmp_path):
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=3_000, checkpoint_every=1_000, record_episodes=1, eval_every=1_500)
        for m in MEMBERS[:3]
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_population(
        [StoreSink(store, r) for r in run_ids], run_ids, configs, stops, flush_interval=0.05
    )
    assert [o.status for o in outcomes] == ["finished"] * 3
    for run_id, c in zip(run_ids, configs, strict=True):
        run = store.get_run(run_id)
        # within a single run's overshoot (under num_envs), whatever the others still need
        assert run.status == "finished" and c.total_steps <= run.env_steps < c.total_steps + 3
        steps = store.checkpoint_steps(run_id)
        assert steps[:2] == sorted(steps)[:2] and steps[-1] == run.env_steps
        assert [s // 1_000 for s in steps[:-1]] == [1, 2]  # one per 1,000 steps crossed
        replay = load_replay(c, store.load_checkpoint(run_id))
        assert replay.act(np.zeros((2, 4), np.float32)).shape == (2,)
        for step in steps:  # each checkpoint's episodes: those its weights record alone
            stored = [Trajectory.from_bytes(b) for b in store.trajectory_blobs(run_id, step)]
            replay = load_replay(c, store.load_checkpoint(run_id, step))
            alone = record_replay(replay, c.env_id, c.record_episodes, record_seed(c))
            assert len(stored) == len(alone) == 1
            np.testing.assert_array_equal(stored[0].actions, alone[0].actions)
            np.testing.assert_array_equal(stored[0].observations, alone[0].observations)
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])
        # one when 1,500 was crossed, one when the budget's last update crossed 3,000
        assert evals["env_step"].tolist()[-1] == run.env_steps and len(evals) == 2
        returns = store.metrics(run_id, [M.EPISODIC_RETURN.key])
        assert len(returns) == run.summary.episodes > 0
    store.close()


def test_members_due_at_different_updates_play_together_with_the_weights_they_had(
    tmp_path, monkeypatch
):
    """Members cross an evaluation step at different updates (their reset rows differ). Each
    one's evaluation and checkpoint are taken when it is due and played together with the
    others' once all have passed the step: fewer calls than evaluations, and every stored
    evaluation is that of the checkpoint saved at the same step (its weights then, not the
    later ones it had when it was played), evaluated alone."""
    from gae_core.runs import population_run
    from gae_core.runs.execute import eval_seed

    calls = []
    real = population_run.evaluate_stacked

    def counted(actor, *args):
        calls.append(len(actor.weights[0]))
        return real(actor, *args)

    weights = {}  # (member, env step) -> its weights after the update that reached that step
    real_step = PopulationTrainer.step

    def step(self):
        results = real_step(self)
        for i, result in results.items():
            weights[i, result.env_steps] = self.model_of(i).state_dict()
        return results

    monkeypatch.setattr(population_run, "evaluate_stacked", counted)
    monkeypatch.setattr(PopulationTrainer, "step", step)
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=3_000, checkpoint_every=1_000, eval_every=1_000, record_episodes=1)
        for m in MEMBERS
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_population(
        [StoreSink(store, r) for r in run_ids], run_ids, configs, stops, flush_interval=0.05
    )
    assert [o.status for o in outcomes] == ["finished"] * len(configs)
    first_steps = {store.checkpoint_steps(r)[0] for r in run_ids}
    assert len(first_steps) > 1  # due at different updates
    evaluations = 0
    for run_id, c in zip(run_ids, configs, strict=True):
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])
        assert evals["env_step"].tolist() == store.checkpoint_steps(run_id)
        index = run_ids.index(run_id)
        for step, value in zip(evals["env_step"], evals["value"], strict=True):
            replay = load_replay(c, store.load_checkpoint(run_id, int(step)))
            for name, tensor in replay.model.state_dict().items():  # its weights when due
                torch.testing.assert_close(tensor, weights[index, int(step)][name], rtol=0, atol=0)
            alone = evaluate_replay(replay, c.env_id, c.eval_episodes, eval_seed(c))
            assert value == pytest.approx(np.mean(alone), rel=1e-6)
        evaluations += len(evals)
    assert sum(calls) == evaluations and len(calls) < evaluations and max(calls) > 1
    store.close()


def test_a_members_update_metrics_are_stored_as_window_means(tmp_path, monkeypatch):
    """Each member stores its update metrics as a single run does: a row per metric each time
    it crosses a multiple of log_every or of checkpoint_every (a checkpoint closes the window
    at the update it became due, even when it is saved later), the mean of its own updates
    since the last row."""
    seen: dict[int, list] = {}
    real_step = PopulationTrainer.step

    def step(self):
        results = real_step(self)
        for i, result in results.items():
            seen.setdefault(i, []).append((result.env_steps, result.metrics.get(M.VALUE_LOSS.key)))
        return results

    monkeypatch.setattr(PopulationTrainer, "step", step)
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=1_000, log_every=150, checkpoint_every=250) for m in MEMBERS[:3]
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_population(
        [StoreSink(store, r) for r in run_ids], run_ids, configs, stops, flush_interval=0.05
    )
    assert [o.status for o in outcomes] == ["finished"] * 3
    for i, run_id in enumerate(run_ids):
        stored = store.metrics(run_id, [M.VALUE_LOSS.key])
        expected = stored_update_metric(seen[i], 150, also=250)
        assert 5 < len(expected) < len(seen[i])
        assert not {s for s, _ in expected} <= {s for s, _ in stored_update_metric(seen[i], 150)}
        assert stored["env_step"].tolist() == [s for s, _ in expected]
        np.testing.assert_allclose(stored["value"], [v for _, v in expected], rtol=1e-6)
    store.close()


@pytest.mark.parametrize("autograd", [False, True])
def test_a_member_whose_rollout_has_no_valid_row_reports_its_learning_rate_only(autograd):
    """One env per member and one step per rollout: the rollout after a member's episode ends
    is its reset row alone. That member takes no step (its weights and optimizer moments stay
    where they are) and, as a single run, reports only its learning rate (no loss was
    measured); the other members' updates are whole. On both update engines."""
    configs = [config(**m, num_envs=1, rollout_steps=1, total_steps=300) for m in MEMBERS[:2]]
    population = PopulationTrainer(configs, autograd=autograd)
    optimizer = population.optimizer
    full = {m.key for m in M.UPDATE} | {M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
    clocks = {M.LEARNING_RATE.key, M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
    before, skipped, whole = [0, 0], 0, 0
    try:
        while not population.done:
            state = [*population.params, *optimizer.first_moments, *optimizer.second_moments]
            saved = [x.detach().clone() for x in state]
            for i, result in population.step().items():
                took_no_step = result.env_steps == before[i]
                assert set(result.metrics) == (clocks if took_no_step else full)
                moved = [not torch.equal(x[i], old[i]) for x, old in zip(state, saved, strict=True)]
                assert any(moved) != took_no_step  # (Adam's momentum would move it: it is kept)
                assert result.metrics[M.LEARNING_RATE.key] == configs[i].learning_rate
                skipped, whole = skipped + took_no_step, whole + (not took_no_step)
                before[i] = result.env_steps
    finally:
        population.close()
    assert skipped >= 2 and whole == 2 * 300


def test_members_whose_joint_recording_breaks_record_alone(tmp_path, monkeypatch):
    """If recording the members due together raises, each records alone inside its own run's
    failure handling: a recording that works alone still lands, one that fails fails only its
    run."""
    from gae_core.runs import population_run

    joint = population_run.record_stacked
    configs = [config(**m, checkpoint_every=200, record_episodes=1) for m in MEMBERS[:3]]

    sizes = []

    def alone_only(models, env_id, episodes, seeds):
        sizes.append(len(models))
        if len(models) > 1:
            raise RuntimeError("joint recording broke")
        if seeds == [record_seed(configs[1])]:
            raise RuntimeError("member 1's recording broke")
        return joint(models, env_id, episodes, seeds)

    monkeypatch.setattr(population_run, "record_stacked", alone_only)
    store = RunStore(tmp_path)
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_population(
        [StoreSink(store, r) for r in run_ids], run_ids, configs, stops, flush_interval=0.05
    )
    assert [o.status for o in outcomes] == ["finished", "failed", "finished"]
    assert "member 1's recording broke" in store.get_run(run_ids[1]).error
    assert max(sizes) > 1  # they were played together first
    for run_id in (run_ids[0], run_ids[2]):
        assert len(store.trajectory_blobs(run_id)) == 1
    store.close()


def test_members_whose_joint_evaluation_breaks_evaluate_alone(tmp_path, monkeypatch):
    """If evaluating the members due together raises, each evaluates alone inside its own
    run's failure handling: what works alone still lands (every evaluation and checkpoint of
    the others), an evaluation that fails alone fails only its run."""
    from gae_core.runs import population_run

    joint = population_run.evaluate_stacked
    configs = [config(**m, eval_every=150, checkpoint_every=150) for m in MEMBERS[:3]]
    sizes = []

    def alone_only(actor, discrete, env_id, episodes, seeds):
        sizes.append(len(seeds))
        if len(seeds) > 1:
            raise RuntimeError("joint evaluation broke")
        if seeds == [eval_seed(configs[1])]:
            raise RuntimeError("member 1's evaluation broke")
        return joint(actor, discrete, env_id, episodes, seeds)

    monkeypatch.setattr(population_run, "evaluate_stacked", alone_only)
    store = RunStore(tmp_path)
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    sinks = [_CountedSink(store, r) for r in run_ids]
    outcomes = execute_population(sinks, run_ids, configs, stops, flush_interval=0.05)
    assert [o.status for o in outcomes] == ["finished", "failed", "finished"]
    assert "member 1's evaluation broke" in store.get_run(run_ids[1]).error
    assert max(sizes) > 1 and [sink.finished for sink in sinks] == [1, 1, 1]
    for run_id in (run_ids[0], run_ids[2]):
        run = store.get_run(run_id)
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])["env_step"].tolist()
        assert evals[-1] == run.env_steps and len(evals) == run.env_steps // 150 + 1
        assert store.checkpoint_steps(run_id) == evals
    store.close()


class _CountedSink(StoreSink):
    """A store sink that counts how often its run was ended (exactly once, always)."""

    finished = 0

    def finish(self, status, error):
        self.finished += 1
        return super().finish(status, error)


def test_a_stopped_member_ends_stopped_and_the_others_finish(tmp_path):
    store = RunStore(tmp_path)
    configs = [config(**m, total_steps=20_000) for m in MEMBERS[:3]]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    sinks = [StoreSink(store, r) for r in run_ids]

    class StopAfterFirstFlush(StoreSink):
        def flush(self, rows, env_steps, summary):
            stops[1].set()
            return super().flush(rows, env_steps, summary)

    sinks[1] = StopAfterFirstFlush(store, run_ids[1])
    outcomes = execute_population(sinks, run_ids, configs, stops, flush_interval=0.05)
    assert [o.status for o in outcomes] == ["finished", "stopped", "finished"]
    stopped = store.get_run(run_ids[1])
    assert stopped.status == "stopped" and 0 < stopped.env_steps < 20_000
    assert store.checkpoint_steps(run_ids[1])[-1] == stopped.env_steps  # its last checkpoint
    store.close()


@pytest.mark.parametrize(
    "breaks", ["a checkpoint mid-run", "its last checkpoint", "its last flush"]
)
def test_a_member_whose_store_writes_break_ends_failed_alone(tmp_path, breaks):
    """A member whose checkpoint or flush raises (a full disk) ends failed with the reason and
    is never left without an end (a sweep would wait for it forever); the others finish."""
    store = RunStore(tmp_path)
    every = 150 if breaks == "a checkpoint mid-run" else 0
    configs = [config(**m, checkpoint_every=every) for m in MEMBERS[:3]]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    sinks = [StoreSink(store, r) for r in run_ids]

    class FullDisk(_CountedSink):
        def checkpoint(self, env_step, blob, trajectories):
            if breaks != "its last flush":
                raise OSError(28, "No space left on device")
            super().checkpoint(env_step, blob, trajectories)

        def flush(self, rows, env_steps, summary):
            if breaks == "its last flush" and env_steps >= configs[1].total_steps:
                raise OSError(28, "No space left on device")
            return super().flush(rows, env_steps, summary)

    sinks[1] = FullDisk(store, run_ids[1])
    stops = [threading.Event() for _ in configs]
    outcomes = execute_population(sinks, run_ids, configs, stops, flush_interval=0.05)
    assert [o.status for o in outcomes] == ["finished", "failed", "finished"]
    assert sinks[1].finished == 1
    broken = store.get_run(run_ids[1])
    assert broken.status == "failed" and "No space left on device" in broken.error
    if breaks == "a checkpoint mid-run":
        assert broken.env_steps < configs[1].total_steps  # it ended there
    for run_id in (run_ids[0], run_ids[2]):
        assert store.get_run(run_id).env_steps >= configs[0].total_steps
    assert len(store.metrics(run_ids[1], [M.EPISODIC_RETURN.key])) == broken.summary.episodes
    store.close()


def test_a_stop_on_the_last_update_still_ends_finished_with_its_evaluation(tmp_path):
    """A stop that arrives with the budget's last update (the UI's Stop, a cancelled sweep)
    ends the run finished, with the final evaluation a finished run always has."""
    store = RunStore(tmp_path)
    configs = [config(**m, eval_every=300) for m in MEMBERS[:2]]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]

    class StopAtTheEnd(StoreSink):
        def flush(self, rows, env_steps, summary):
            if env_steps >= configs[0].total_steps:
                stops[0].set()
            return super().flush(rows, env_steps, summary)

    sinks = [StopAtTheEnd(store, run_ids[0]), StoreSink(store, run_ids[1])]
    outcomes = execute_population(sinks, run_ids, configs, stops, flush_interval=0.0)
    assert stops[0].is_set() and [o.status for o in outcomes] == ["finished", "finished"]
    for run_id in run_ids:
        run = store.get_run(run_id)
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])["env_step"].tolist()
        assert evals[-1] == run.env_steps and len(evals) == 2, (run_id, evals)
    store.close()


def test_population_members_learn_cartpole_like_single_runs():
    """On the task: 8 members with the CartPole preset (seeds 0-7) at 60k steps. Single runs
    with those seeds ended at 84-500 (median 182) in their last 20 episodes, the members at
    59-433 (median 235), measured on this 2-core machine; a random policy gets about 22."""
    from gae_core.agent.presets import preset_config

    base = dataclasses.replace(
        preset_config("CartPole-v1"), total_steps=60_000, checkpoint_every=0, eval_every=0
    )
    population = PopulationTrainer([dataclasses.replace(base, seed=s) for s in range(8)])
    returns: dict[int, list[float]] = {i: [] for i in range(8)}
    try:
        while not population.done:
            for i, result in population.step().items():
                returns[i] += [e.return_ for e in result.episodes]
    finally:
        population.close()
    late = [np.mean(r[-20:]) for r in returns.values()]
    assert min(late) > 2 * 22 and np.median(late) > 100, late


_MEMORY = """
import os, sys, torch
from gae_core.agent.memory import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "on" else None
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def update():  # an update's activations at the field defaults: 35 members x 1,024 rows x 64
    before = rss()
    blocks = [torch.ones(35, 1024, 64) for _ in range(4)]
    grew = rss() - before
    del blocks
    return before, grew
start, first = update()
print(took, (rss() - start) / first)  # of the first update's memory, still mapped after it
"""


def test_a_population_process_keeps_freed_memory_mapped():
    """glibc gives an update's freed 9 MB blocks back to the OS (in a fresh process: its
    mmap threshold starts at 128 KB), so the next update maps and faults them in again; with
    keep_freed_memory (set by every population) the memory stays mapped for the next update.
    Each case runs in a fresh process (the setting is process-wide); Linux only (/proc, glibc).
    What it saves is measured by benchmarks/bench_population.py."""
    import subprocess
    import sys

    if sys.platform != "linux":
        from gae_core.agent.memory import keep_freed_memory

        keep_freed_memory()  # no glibc mallopt: nothing changes, nothing breaks
        return

    def run(mode: str) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", _MEMORY, mode], capture_output=True, text=True, check=True
        ).stdout.split()

    took, kept = run("off")
    assert float(kept) < 0.2  # handed back: the next update maps and faults it in again
    took, kept = run("on")
    assert took == "True" and float(kept) > 0.8  # kept for the next update
