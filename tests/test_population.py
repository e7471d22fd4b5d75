"""Trainers of several members (gae_core.agent.trainer.Trainer with M > 1): each member learns
exactly what a single run with its config would learn from the same data, its normalisation
statistics are its own, members never leak into one another, and a run of several stores each
member as its own run (gae_core.runs.execute.execute_run)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import StoreSink, stored_update_metric
from gymnasium.wrappers.utils import RunningMeanStd
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core import metrics as M
from gae_core.agent import stacked as stacked_module
from gae_core.agent import update as update_module
from gae_core.agent.config import TrainConfig
from gae_core.agent.normalize import NORMALIZATION_EPSILON, Normalizers, RunningMoments
from gae_core.agent.played_together import evaluate_replays, record_replays_together
from gae_core.agent.policy import ActorCritic
from gae_core.agent.recording import evaluate_replay, load_replay, record_replay
from gae_core.agent.stacked import (
    NARROW_MAX,
    TANH_VIA_SIGMOID_MIN,
    TANH_VIA_SIGMOID_MIN_NO_GRAD,
    StackedMLP,
    clip_per_member,
    stacked_linear,
    stacked_tanh,
)
from gae_core.agent.trainer import SHARED, Rollout, Trainer, population_key
from gae_core.runs.execute import execute_run
from gae_core.runs.member_run import eval_seed, record_seed
from gae_core.storage.store import RunStore
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


#: Members that differ in every per-member field of the update.
MEMBERS = [
    dict(seed=0, lambda_=0.0, gamma=0.99),
    dict(seed=1, lambda_=0.95, gamma=0.9, value_coef=1.0, entropy_coef=0.01),
    dict(seed=2, lambda_=1.0, gamma=0.999, critic_target="fixed_lambda", critic_lambda=0.5),
    dict(seed=3, lambda_=0.5, gamma=0.95, max_grad_norm=0.0),  # no clipping
]

#: Members' normalisation: observations, rewards (clipped at 5), both (returns restarted only
#: at termination), neither; one trainer holds all four.
NORMALISED = [
    dict(normalize_observations=True),
    dict(normalize_rewards=True, normalize_clip=5.0),
    dict(normalize_observations=True, normalize_rewards=True, reward_norm_reset="termination"),
    dict(),
]


def _columns(trainer: Trainer, member: int, copy: bool = False) -> Rollout:
    """Member ``member``'s columns of the rollout the trainer just collected (views of its
    buffers, which the next rollout overwrites, unless ``copy``)."""
    per = trainer.envs_per_member
    view = trainer._batch.columns(member * per, (member + 1) * per)
    if copy:
        for name in ("observations", "actions", "rewards", "terminated", "truncated", "valid"):
            setattr(view, name, np.array(getattr(view, name)))
    return view


# -- the networks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "sde"), [("CartPole-v1", False), ("Pendulum-v1", False), ("Pendulum-v1", True)]
)
def test_members_start_from_the_single_runs_weights(env_id, sde):
    """Each member's initial weights (and log-std) are those its seed, log_std_init and
    ortho_init give a single run, whatever the other members are."""
    members = [dict(m, log_std_init=-0.5 + 0.2 * i) for i, m in enumerate(MEMBERS)]
    members[2]["ortho_init"] = False  # PyTorch's Linear init for this one
    configs = [config(env_id, use_sde=sde, **m) for m in members]
    population = Trainer(configs)
    try:
        for i, c in enumerate(configs):
            single = ActorCritic(
                population.env.single_observation_space, population.env.single_action_space,
                c.hidden_sizes, c.seed, c.log_std_init, c.use_sde, c.ortho_init,
            )  # fmt: skip
            alone = Trainer(c)
            try:
                theirs = alone.model_of(0).state_dict()
            finally:
                alone.close()
            ours = population.model_of(i).state_dict()
            assert ours.keys() == single.state_dict().keys()
            for name, tensor in single.state_dict().items():
                torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0)
                torch.testing.assert_close(theirs[name], tensor, rtol=0, atol=0)
    finally:
        population.close()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 700),
    scale=st.sampled_from([1e-4, 0.1, 1.0, 4.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
    form_on_cpu=st.booleans(),
)
def test_stacked_tanh_is_tanh_and_its_gradient_is_tanhs(rows, scale, seed, form_on_cpu):
    """tanh(x) = 2·σ(2x) − 1 (its form above TANH_VIA_SIGMOID_MIN elements with a gradient,
    TANH_VIA_SIGMOID_MIN_NO_GRAD without) agrees with torch.tanh to 4e-7 at any scale of x,
    with the gradient (1 − tanh²(x))·g, with grad enabled or not; below the threshold, and at
    any size on a CPU that does not take the form (TANH_VIA_SIGMOID_ON_CPU), it is torch.tanh
    itself. NaN and ±inf map as tanh's. Both CPU rules are checked on any CPU."""
    with mock.patch.object(stacked_module, "TANH_VIA_SIGMOID_ON_CPU", form_on_cpu):
        _check_stacked_tanh(rows, scale, seed, form_on_cpu)


def _check_stacked_tanh(rows: int, scale: float, seed: int, form_on_cpu: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, rows, 64, generator=generator) * scale
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    expected = torch.tanh(x)
    with torch.no_grad():
        got = stacked_tanh(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=4e-7, equal_nan=True)
    if x.numel() < TANH_VIA_SIGMOID_MIN_NO_GRAD or not form_on_cpu:
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    leaf = x.clone().requires_grad_(True)
    grad = torch.randn(x.shape, generator=generator)
    forward = stacked_tanh(leaf)
    torch.testing.assert_close(forward.detach(), expected, rtol=0, atol=4e-7, equal_nan=True)
    if x.numel() < TANH_VIA_SIGMOID_MIN or not form_on_cpu:
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
    form_on_cpu=st.booleans(),
)
def test_stacked_linear_is_baddbmm_with_its_gradients(
    members, rows, fan_in, fan_out, grads, seed, form_on_cpu
):
    """stacked_linear(b, x, W) = baddbmm(b, x, W) (narrow layers take transposed forms), and
    its gradients with respect to b, x and W are baddbmm's, for any shapes, whichever inputs
    need a gradient, and without one. Both CPU rules for the narrow product
    (NARROW_FORWARD_ON_CPU) are checked on any CPU; where it is not taken, the product is
    baddbmm's to the bit."""
    with mock.patch.object(stacked_module, "NARROW_FORWARD_ON_CPU", form_on_cpu):
        _check_stacked_linear(members, rows, fan_in, fan_out, grads, seed, form_on_cpu)


def _check_stacked_linear(members, rows, fan_in, fan_out, grads, seed, form_on_cpu) -> None:
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
    if not form_on_cpu:
        assert torch.equal(out, expected)
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


@settings(max_examples=40, deadline=None)
@given(
    members=st.integers(1, 5), shapes=st.sampled_from([[(7,)], [(3, 4), (5,), (2, 2)]]),
    scale=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 10_000),
)  # fmt: skip
def test_clip_per_member_is_clip_grad_norm_of_each_member(members, shapes, scale, seed):
    """Each member's gradient (its slice of every stack) is what ``clip_grad_norm_`` leaves of
    that member's tensors alone, with its own max norm (∞: none); a member not learning, or
    whose norm is not finite, is zeroed and reported as such; one stack (the trainer's one
    buffer) or several."""
    generator = torch.Generator().manual_seed(seed)
    params = [torch.zeros(members, *shape, requires_grad=True) for shape in shapes]
    for p in params:
        p.grad = scale * torch.randn(p.shape, generator=generator)
    rng = np.random.default_rng(seed)
    max_norm = np.where(rng.random(members) < 0.3, np.inf, rng.random(members) * 2 * scale)
    max_norm = max_norm.astype(np.float32)
    learning = rng.random(members) < 0.8
    broken = members > 1 and rng.random() < 0.5
    if broken:
        params[0].grad[-1].view(-1)[0] = float("nan")
    alone = []
    for m in range(members):
        copies = [torch.zeros_like(p[m]).requires_grad_(True) for p in params]
        for c, p in zip(copies, params, strict=True):
            c.grad = p.grad[m].clone()
        norm = torch.nn.utils.clip_grad_norm_(copies, float(max_norm[m]))
        alone.append((norm, [c.grad for c in copies]))
    norms, finite = clip_per_member(params, max_norm, learning)
    assert isinstance(finite, np.ndarray) and finite.dtype == bool
    for m, (norm, grads) in enumerate(alone):
        torch.testing.assert_close(norms[m], norm, equal_nan=True)
        assert finite[m] == bool(torch.isfinite(norm))
        for p, grad in zip(params, grads, strict=True):
            if learning[m] and finite[m]:
                torch.testing.assert_close(p.grad[m], grad)
            else:
                assert not p.grad[m].any()
    assert not broken or not finite[-1]


@pytest.mark.parametrize("form_on_cpu", [True, False])
def test_a_stacked_networks_layers_are_its_members_layers(form_on_cpu):
    """StackedMLP.layers (each layer's input and the output, no graph; its tanh in the sigmoid
    form's in-place variant where that form is taken, its last product in the narrow form where
    that is) is every member's own forward pass, layer by layer, whichever CPU rules hold."""
    observations = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    nets = [
        ActorCritic(observations, gym.spaces.Discrete(2), (64, 64), seed, 0.0).actor
        for seed in range(3)
    ]
    x = 3.0 * torch.randn(3, 300, 4, generator=torch.Generator().manual_seed(1))
    assert x.shape[0] * x.shape[1] * 64 >= TANH_VIA_SIGMOID_MIN_NO_GRAD
    with (
        mock.patch.object(stacked_module, "TANH_VIA_SIGMOID_ON_CPU", form_on_cpu),
        mock.patch.object(stacked_module, "NARROW_FORWARD_ON_CPU", form_on_cpu),
    ):
        outputs = StackedMLP(nets).layers(x)
    with torch.no_grad():
        for i, net in enumerate(nets):
            h = x[i]
            for layer, got in zip([m for m in net if isinstance(m, torch.nn.Linear)],
                                  outputs[1:], strict=True):  # fmt: skip
                h = layer(h)
                h = torch.tanh(h) if got is not outputs[-1] else h
                torch.testing.assert_close(got[i], h, rtol=1e-5, atol=2e-6)


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


# -- the update -------------------------------------------------------------------------------

_PPO = dict(algo="ppo", n_epochs=3, minibatch_size=6)
#: Each PPO member its own clip range; one stops early on its KL, one clips its values, one
#: decays its clip range. (The PPO cases' learning rates move the policies far enough in 9
#: minibatch steps for the clipping and the KL stop to happen: the test checks they did.)
_PPO_MEMBERS = [
    dict(clip_range=0.1),
    dict(clip_range=0.2, target_kl=0.002),
    dict(clip_range=0.3, clip_range_vf=0.05),
    dict(clip_range=0.05, clip_range_schedule="linear"),
]
_OWN_RATES = [
    dict(learning_rate=1e-3),
    dict(learning_rate=3e-3, lr_schedule="linear"),
    dict(learning_rate=7e-4),
    dict(learning_rate=2e-3, lr_schedule="linear", normalize_advantages=False),
]
_NONE = [{}] * 4

#: (env, what every member shares, what each member adds) of each case.
_UPDATE_CASES = {
    "a2c-rmsprop": ("CartPole-v1", dict(optimizer="rmsprop", learning_rate=7e-4), _NONE),
    "a2c-adam-standardised": (
        "CartPole-v1",
        dict(optimizer="adam", learning_rate=3e-3, normalize_advantages=True),
        _NONE,
    ),
    "a2c-pendulum-linear": (
        "Pendulum-v1",
        dict(optimizer="adam", learning_rate=1e-3, lr_schedule="linear"),
        _NONE,
    ),
    # members count different steps (CartPole's resets), so their rates decay apart
    "a2c-rmsprop-linear": (
        "CartPole-v1",
        dict(optimizer="rmsprop", learning_rate=7e-4, lr_schedule="linear"),
        _NONE,
    ),
    "a2c-adam-linear": (
        "CartPole-v1",
        dict(optimizer="adam", learning_rate=1e-3, lr_schedule="linear"),
        _NONE,
    ),
    "a2c-own-rates": ("CartPole-v1", dict(optimizer="adam"), _OWN_RATES),
    "a2c-normalised": ("CartPole-v1", dict(optimizer="adam", learning_rate=1e-3), NORMALISED),
    "a2c-pendulum-normalised": (
        "Pendulum-v1",
        dict(optimizer="rmsprop", learning_rate=7e-4),
        NORMALISED,
    ),
    "a2c-gsde": ("Pendulum-v1", dict(use_sde=True, learning_rate=1e-3), _NONE),
    "ppo": ("CartPole-v1", dict(**_PPO, learning_rate=1e-2), _PPO_MEMBERS),
    "ppo-rmsprop-own-rates": (
        "CartPole-v1",
        dict(**_PPO, optimizer="rmsprop"),
        [dict(p, **r) for p, r in zip(_PPO_MEMBERS, _OWN_RATES, strict=True)],
    ),
    "ppo-pendulum": ("Pendulum-v1", dict(**_PPO, learning_rate=1e-2), _PPO_MEMBERS),
    "ppo-normalised": (
        "CartPole-v1",
        dict(**_PPO, learning_rate=1e-2),
        [dict(p, **n) for p, n in zip(_PPO_MEMBERS, NORMALISED, strict=True)],
    ),
    "ppo-gsde": ("Pendulum-v1", dict(**_PPO, use_sde=True, learning_rate=1e-2), _PPO_MEMBERS),
    "ppo-gsde-normalised": (
        "Pendulum-v1",
        dict(**_PPO, use_sde=True, learning_rate=1e-2),
        [dict(p, **n) for p, n in zip(_PPO_MEMBERS, NORMALISED, strict=True)],
    ),
}

_A2C_METRICS = (
    M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.GRAD_NORM, M.EXPLAINED_VARIANCE,
    M.ADVANTAGE_MEAN, M.ADVANTAGE_STD, M.LEARNING_RATE,
)  # fmt: skip


@pytest.mark.parametrize("case", list(_UPDATE_CASES))
def test_each_member_takes_the_update_a_single_run_takes_on_the_same_data(case):
    """Feed every member's columns of the trainer's rollout to a single Trainer with that
    member's config: after each of several updates the member's weights (log-std included),
    losses, gradient norm, explained variance, advantage statistics and learning rate (and
    PPO's approximate KL and clip fraction) equal the single run's: per-member means over its
    valid rows, standardisation, GAE with its own γ and λ, its critic target, its clipping, its
    learning rate and schedule, its optimizer state, PPO's minibatch order from its own
    generator, its clip ranges and KL stop. Normalised members' rollouts hold what their
    policies saw and learned from (normalised observations, scaled rewards), so the same holds
    with normalisation, and with gSDE."""
    env_id, shared, extras = _UPDATE_CASES[case]
    members = [
        dict(m, log_std_init=-0.5 + 0.1 * i, **extra)
        for i, (m, extra) in enumerate(zip(MEMBERS, extras, strict=True))
    ]
    configs = [config(env_id, **shared, **m) for m in members]
    population = Trainer(configs)
    singles = [Trainer([c]) for c in configs]
    metrics = _A2C_METRICS + ((M.APPROX_KL, M.CLIP_FRACTION) if shared.get("algo") == "ppo" else ())
    per = population.envs_per_member
    clipped = np.zeros(len(configs))
    try:
        for update in range(4):
            active = list(range(len(configs)))
            for state in population._members:
                state.steps_before_update = state.env_steps
            population.collect(active)
            expected = []
            for i, single in enumerate(singles):
                single._batch = population._batch.columns(i * per, (i + 1) * per)
                single._members[0].steps_before_update = population._members[i].steps_before_update
                single._members[0].active = True
                expected.append(single.update([0])[0])
            got = population.update(active)
            assert set(got) == set(active)
            for i, single in enumerate(singles):
                assert population.member(i).error is None and single.member(0).error is None
                ours = population.model_of(i).state_dict()
                for name, tensor in single.model_of(0).state_dict().items():
                    torch.testing.assert_close(
                        ours[name], tensor, rtol=1e-4, atol=2e-6, msg=f"{update} {i} {name}"
                    )
                assert set(got[i]) == set(expected[i]), (update, i)
                for metric in metrics:
                    assert got[i][metric.key] == pytest.approx(
                        expected[i][metric.key], rel=1e-4, abs=1e-5
                    ), (update, i, metric.key)
                clipped[i] += got[i].get(M.CLIP_FRACTION.key, 0.0)
        assert population.optimizer.row_steps.tolist() == [
            single.optimizer.row_steps[0] for single in singles
        ]
        if shared.get("algo") == "ppo":  # the cases this is about happened
            steps = population.optimizer.row_steps
            assert steps[1] < steps[0] == steps[2]  # member 1 stopped early on its KL
            assert (clipped[[0, 3]] > 0).all()  # the tightest ranges (0.1, 0.05) clipped
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
    population = Trainer(configs)
    last: dict[int, tuple] = {}  # member → (its steps before, its result, its rows) at its end
    try:
        while not population.done:
            before = [state.env_steps for state in population._members]
            results = population.step()
            for i, result in results.items():
                last[i] = (before[i], result, _columns(population, i, copy=True))
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


def test_a_member_whose_rollout_has_no_valid_row_reports_its_learning_rate_only():
    """One env per member and one step per rollout: the rollout after a member's episode ends
    is its reset row alone. That member takes no step (its weights and optimizer moments stay
    where they are) and, as a single run, reports only its learning rate (no loss was
    measured); the other members' updates are whole."""
    configs = [config(**m, num_envs=1, rollout_steps=1, total_steps=300) for m in MEMBERS[:2]]
    population = Trainer(configs)
    optimizer = population.optimizer
    full = {m.key for m in M.UPDATE} | {M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
    clocks = {M.LEARNING_RATE.key, M.STEPS_PER_SECOND.key, M.WALL_TIME.key}
    before, skipped, learnt = [0, 0], 0, 0
    try:
        while not population.done:
            state = [*optimizer.params, *optimizer.first_moments, *optimizer.second_moments]
            saved = [x.detach().clone() for x in state]
            for i, result in population.step().items():
                took_no_step = result.env_steps == before[i]
                assert set(result.metrics) == (clocks if took_no_step else full)
                moved = [not torch.equal(x[i], old[i]) for x, old in zip(state, saved, strict=True)]
                assert any(moved) != took_no_step  # (Adam's momentum would move it: it is kept)
                assert result.metrics[M.LEARNING_RATE.key] == configs[i].learning_rate
                skipped += took_no_step
                learnt += result.env_steps - before[i]  # (the last rollout may take two)
                before[i] = result.env_steps
    finally:
        population.close()
    assert skipped >= 2 and learnt == 2 * 300


# -- normalisation ----------------------------------------------------------------------------


def _normalised_stream(members: int, per: int, dim: int, steps: int, seed: int = 0):
    """Raw observations ``[steps + 1, members·per, dim]``, rewards, terminations and truncations
    ``[steps, members·per]`` as a NEXT_STEP vector env returns them: the step after an episode
    end is a reset row (reward 0, no end), and an episode's final observation is far from every
    other (so counting one would show)."""
    rng = np.random.default_rng(seed)
    columns = members * per
    centre = np.repeat(rng.normal(0, 3, (members, dim)), per, axis=0)
    scale = np.repeat(rng.uniform(0.1, 4.0, (members, dim)), per, axis=0)
    obs = (centre + scale * rng.standard_normal((steps + 1, columns, dim))).astype(np.float32)
    rewards = rng.normal(1.0, 2.0, (steps, columns))
    terminated = rng.random((steps, columns)) < 0.06
    truncated = ~terminated & (rng.random((steps, columns)) < 0.04)
    for t in range(1, steps):
        reset = terminated[t - 1] | truncated[t - 1]
        rewards[t, reset] = 0.0
        terminated[t, reset] = truncated[t, reset] = False
    ended = terminated | truncated
    obs[1:][ended] = 1e3  # final observations
    return obs, rewards, terminated, truncated


_NORMALISER_CONFIGS = [
    dict(seed=0, gamma=0.99, normalize_observations=True, normalize_rewards=True),
    dict(seed=1, gamma=0.9),  # neither: raw values, statistics untouched
    dict(seed=2, gamma=0.95, normalize_observations=True, normalize_clip=0.0),
    dict(seed=3, gamma=0.999, normalize_rewards=True, normalize_clip=1.5,
         reward_norm_reset="termination"),
    dict(seed=4, gamma=0.8, normalize_observations=True, normalize_rewards=True,
         normalize_clip=0.7),
]  # fmt: skip


def test_members_normalisers_are_those_of_single_runs_fed_their_own_columns():
    """Normalizers of M members fed the whole vector env's columns step by step give each
    member exactly what a Normalizers of that member alone, fed its own columns, gives: the
    same normalised observations and scaled rewards and the same statistics. A member that does
    not normalise gets its raw values (and keeps untouched statistics) while the others in the
    same trainer are normalised."""
    configs = [config(**c) for c in _NORMALISER_CONFIGS]
    members, per, dim, steps = len(configs), 3, 4, 300
    obs, rewards, terminated, truncated = _normalised_stream(members, per, dim, steps)
    joint = Normalizers(configs, per, dim)
    alone = [Normalizers([c], per, dim) for c in configs]
    cols = [slice(k * per, (k + 1) * per) for k in range(members)]

    moved = np.zeros((2, members), bool)  # whether a member's values ever differed from raw

    def check(ours: np.ndarray, theirs: list[np.ndarray], raw: np.ndarray, on: list[bool]):
        assert ours.dtype == np.float32
        for k in range(members):
            np.testing.assert_allclose(ours[cols[k]], theirs[k], rtol=1e-6, atol=1e-7)
            if not on[k]:
                np.testing.assert_array_equal(ours[cols[k]], raw[cols[k]].astype(np.float32))
            moved[raw.ndim - 1, k] |= not np.array_equal(
                ours[cols[k]], raw[cols[k]].astype(np.float32)
            )

    on_obs = [c.normalize_observations for c in configs]
    on_rewards = [c.normalize_rewards for c in configs]
    check(joint.reset(obs[0]), [n.reset(obs[0][cols[k]]) for k, n in enumerate(alone)], obs[0],
          on_obs)  # fmt: skip
    for t in range(steps):
        args = (rewards[t], terminated[t], truncated[t])
        scaled = joint.scale_rewards(*args)
        check(scaled, [n.scale_rewards(*(a[cols[k]] for a in args)) for k, n in enumerate(alone)],
              rewards[t], on_rewards)  # fmt: skip
        ended = terminated[t] | truncated[t]
        seen = joint.observe(obs[t + 1], ended)
        theirs = [n.observe(obs[t + 1][cols[k]], ended[cols[k]]) for k, n in enumerate(alone)]
        check(seen, theirs, obs[t + 1], on_obs)
    assert moved.tolist() == [on_rewards, on_obs]  # the normalised members were normalised
    for k, single in enumerate(alone):
        for moments in ("obs", "returns"):
            ours, theirs = getattr(joint, moments), getattr(single, moments)
            np.testing.assert_allclose(ours.mean[k], theirs.mean[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ours.var[k], theirs.var[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ours.count[k], theirs.count[0], rtol=1e-12)
        assert joint.state(k).keys() == single.state(0).keys()
    untouched = RunningMoments(1, (dim,))
    for k in (1,):  # neither: its statistics are where they started
        np.testing.assert_array_equal(joint.obs.mean[k], untouched.mean[0])
        np.testing.assert_array_equal(joint.obs.var[k], untouched.var[0])
        assert joint.obs.count[k] == untouched.count[0] and joint.returns.count[k] == 1e-4
        assert joint.state(k) == {}


def test_normalisation_counts_what_vecnormalize_counts_as_gymnasiums_running_mean_std_does():
    """Each member's statistics equal gymnasium's RunningMeanStd fed, one step at a time, the
    rows that member counts under VecNormalize's semantics, worked out here independently:
    every observation a policy acts on (the first reset's, every step's, the reset rows' reset
    observations) but never an episode's final one; the discounted return of each real
    transition (not reset rows), restarted after each episode end (or, with
    reward_norm_reset = "termination", carried on through a truncation, as gymnasium's
    NormalizeReward). Observations come out as (o − mean) / √(var + 1e-8) and rewards as
    r / √(var + 1e-8), each clipped to ±normalize_clip where that is positive."""
    configs = [config(**c) for c in _NORMALISER_CONFIGS]
    members, per, dim, steps = len(configs), 3, 4, 300
    obs, rewards, terminated, truncated = _normalised_stream(members, per, dim, steps, seed=1)
    normalizers = Normalizers(configs, per, dim)
    obs_rms = [RunningMeanStd(shape=(dim,)) for _ in configs]
    return_rms = [RunningMeanStd(shape=()) for _ in configs]
    returns = np.zeros((members, per))
    after_end = np.zeros((members, per), bool)

    def expected_obs(raw: np.ndarray) -> np.ndarray:
        out = raw.astype(np.float64).reshape(members, per, dim).copy()
        for k, c in enumerate(configs):
            if c.normalize_observations:
                out[k] = (out[k] - obs_rms[k].mean) / np.sqrt(obs_rms[k].var + 1e-8)
                if c.normalize_clip > 0:
                    out[k] = np.clip(out[k], -c.normalize_clip, c.normalize_clip)
        return out.reshape(members * per, dim).astype(np.float32)

    for k, c in enumerate(configs):
        if c.normalize_observations:
            obs_rms[k].update(obs[0].reshape(members, per, dim)[k].astype(np.float64))
    np.testing.assert_allclose(
        normalizers.reset(obs[0]), expected_obs(obs[0]), rtol=1e-5, atol=1e-6
    )
    counted_final = 0
    for t in range(steps):
        r = rewards[t].reshape(members, per)
        term, trunc = terminated[t].reshape(members, per), truncated[t].reshape(members, per)
        scaled = normalizers.scale_rewards(rewards[t], terminated[t], truncated[t])
        expected = r.copy()
        for k, c in enumerate(configs):
            if not c.normalize_rewards:
                continue
            real = ~after_end[k]
            keep = 1.0 if c.reward_norm_reset == "episode_end" else 1.0 - term[k][real]
            returns[k][real] = c.gamma * keep * returns[k][real] + r[k][real]
            if real.any():
                return_rms[k].update(returns[k][real])
            if c.reward_norm_reset == "episode_end":
                returns[k][term[k] | trunc[k]] = 0.0
            expected[k] = r[k] / np.sqrt(return_rms[k].var + 1e-8)
            if c.normalize_clip > 0:
                expected[k] = np.clip(expected[k], -c.normalize_clip, c.normalize_clip)
        np.testing.assert_allclose(
            scaled, expected.reshape(-1).astype(np.float32), rtol=1e-5, atol=1e-6
        )
        after_end = term | trunc
        raw = obs[t + 1].reshape(members, per, dim)
        for k, c in enumerate(configs):
            if c.normalize_observations and (~after_end[k]).any():
                obs_rms[k].update(raw[k][~after_end[k]].astype(np.float64))  # not the final
            counted_final += int(after_end[k].sum())
        seen = normalizers.observe(obs[t + 1], after_end.reshape(-1))
        np.testing.assert_allclose(seen, expected_obs(obs[t + 1]), rtol=1e-5, atol=1e-6)
    assert counted_final > 20 and terminated.any() and truncated.any()  # the cases happened
    for k, c in enumerate(configs):
        if c.normalize_observations:
            np.testing.assert_allclose(normalizers.obs.mean[k], obs_rms[k].mean, rtol=1e-10)
            np.testing.assert_allclose(normalizers.obs.var[k], obs_rms[k].var, rtol=1e-10)
            assert normalizers.obs.count[k] == pytest.approx(obs_rms[k].count, rel=1e-12)
            assert np.abs(normalizers.obs.mean[k]).max() < 50  # no final observation in it
        if c.normalize_rewards:
            assert normalizers.returns.var[k] == pytest.approx(return_rms[k].var, rel=1e-10)
            assert normalizers.returns.count[k] == pytest.approx(return_rms[k].count, rel=1e-12)
            state = normalizers.state(k)
            assert float(state["return_var"]) == pytest.approx(return_rms[k].var, rel=1e-10)


@settings(max_examples=30, deadline=None)
@given(
    members=st.integers(1, 5),
    rows=st.integers(1, 8),
    updates=st.integers(1, 12),
    shape=st.sampled_from([(), (3,)]),
    seed=st.integers(0, 2**31 - 1),
    share=st.sampled_from([0.6, 1.0]),
)
def test_running_moments_are_gymnasiums_running_mean_std_per_member(
    members, rows, updates, shape, seed, share
):
    """RunningMoments of M streams, each update counting any subset of each member's rows (none
    included; or, with ``share`` 1, every row: its unweighted form), is M gymnasium
    RunningMeanStd fed each member's counted rows (an update with none leaves a member as it
    was)."""
    rng = np.random.default_rng(seed)
    ours = RunningMoments(members, shape)
    theirs = [RunningMeanStd(shape=shape) for _ in range(members)]
    for _ in range(updates):
        x = rng.normal(rng.normal(0, 5), rng.uniform(0.01, 10), (members, rows, *shape))
        counted = rng.random((members, rows)) < share
        ours.update(x, counted)
        for k in range(members):
            if counted[k].any():
                theirs[k].update(x[k][counted[k]])
    for k in range(members):
        np.testing.assert_allclose(ours.mean[k], theirs[k].mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ours.var[k], theirs[k].var, rtol=1e-9, atol=1e-12)
        assert ours.count[k] == pytest.approx(theirs[k].count, rel=1e-12)


def test_a_trainer_normalises_each_member_by_its_own_rule_and_no_other():
    """In one trainer a member that normalises observations and rewards counts, as VecNormalize
    does, every observation its policy acts on (the first reset, every step's, reset rows') but
    no episode's final one, and the return of every real transition; a member that does not
    normalise sees the env's raw values, exactly what it sees when no member of its trainer
    normalises (its actions and episodes too: nothing of the other member's reaches it), and
    its replay carries no statistics."""
    normalised = config(seed=0, num_envs=3, rollout_steps=16, total_steps=100_000,
                        normalize_observations=True, normalize_rewards=True)  # fmt: skip
    plain = config(seed=1, num_envs=3, rollout_steps=16, total_steps=100_000)
    mixed = Trainer([normalised, plain])
    raw = Trainer([dataclasses.replace(normalised, normalize_observations=False,
                                       normalize_rewards=False), plain])  # fmt: skip
    per = mixed.envs_per_member
    try:
        obs_counted, returns_counted, ended = per, 0, 0  # the first reset's observations
        for update in range(6):
            results = mixed.step()
            ours = _columns(mixed, 0)
            ends = ours.terminated | ours.truncated
            obs_counted += int((~ends).sum())  # every step's observation but the final ones
            returns_counted += int(ours.valid.sum())  # real transitions
            ended += int(ends.sum())
            assert mixed.normalizers.obs.count[0] == pytest.approx(1e-4 + obs_counted)
            assert mixed.normalizers.returns.count[0] == pytest.approx(1e-4 + returns_counted)
            assert mixed.normalizers.obs.count[1] == mixed.normalizers.returns.count[1] == 1e-4
            theirs = _columns(mixed, 1)
            assert set(np.unique(theirs.rewards[theirs.valid])) == {1.0}  # CartPole's own
            if update == 0:  # the first rollout of the plain member: the same in both trainers
                raw.step()
                alone = _columns(raw, 1)
                for name in ("observations", "actions", "rewards", "terminated", "truncated",
                             "valid"):  # fmt: skip
                    np.testing.assert_array_equal(getattr(theirs, name), getattr(alone, name))
                first = _columns(raw, 0).observations[0]  # its reset observations, raw
                reference = RunningMeanStd(shape=first.shape[1:])
                reference.update(first.astype(np.float64))
                np.testing.assert_allclose(
                    ours.observations[0],
                    (first - reference.mean) / np.sqrt(reference.var + NORMALIZATION_EPSILON),
                    rtol=1e-5, atol=1e-5,
                )  # fmt: skip
                assert not np.allclose(ours.rewards[ours.valid], 1.0)
                assert set(results) == {0, 1}
        assert ended > 2 * per  # episodes ended (and reset rows followed)
        replay = mixed.replay(1)
        assert replay.obs_mean is None and replay.obs_var is None and replay.return_var is None
        replay = mixed.replay(0)
        np.testing.assert_array_equal(replay.obs_mean, mixed.normalizers.obs.mean[0])
        assert replay.return_var == mixed.normalizers.returns.var[0]
    finally:
        mixed.close()
        raw.close()


def test_a_member_whose_budget_ends_mid_rollout_counts_what_a_single_run_counts():
    """A member's last rollout ends at its budget (its rows past it are not its own), as a
    single run's shorter last rollout does: its normalisation statistics, which its last
    checkpoint and final evaluation carry, count the observations and returns of its rows up to
    its budget and none after, as the single run's do, however long the rollout runs on for
    the others."""
    kw = dict(rollout_steps=64, normalize_observations=True, normalize_rewards=True)
    short = config(seed=0, total_steps=30, **kw)  # (CartPole truncates at 500: ends terminate)
    trainers = [Trainer([short]), Trainer([short, config(seed=1, total_steps=3_000, **kw)])]
    try:
        for trainer in trainers:
            result = trainer.step()[0]
            assert trainer.member(0).done and result.env_steps == 30
            rows = _columns(trainer, 0)
            last = np.flatnonzero(rows.valid.any(axis=1))[-1]  # its budget's last row
            # the first reset, then every observation up to its last row but episodes' final ones
            # (the row that ends its budget is a bootstrap, not an episode's end: counted)
            observations = 3 + int((~rows.terminated[: last + 1]).sum())
            assert trainer.normalizers.obs.count[0] == pytest.approx(1e-4 + observations)
            assert trainer.normalizers.returns.count[0] == pytest.approx(1e-4 + rows.valid.sum())
    finally:
        for trainer in trainers:
            trainer.close()


# -- evaluations and recordings -----------------------------------------------------------------


@contextlib.contextmanager
def _stepped_population(env_id: str = "CartPole-v1", updates: int = 3, members=None):
    """A trainer of :data:`MEMBERS` (or ``members``) after ``updates`` updates, closed on exit."""
    population = Trainer([config(env_id, **m) for m in members or MEMBERS])
    try:
        for _ in range(updates):
            population.step()
        yield population
    finally:
        population.close()


#: Members of whom two normalise their observations (and one its rewards too): their replays
#: carry frozen statistics of their own.
_MIXED = [dict(m, **n) for m, n in zip(MEMBERS, NORMALISED, strict=True)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_members_evaluation_is_the_one_it_would_have_alone(env_id):
    """Evaluated with others, in any order and company, a member's deterministic episodes are
    those of its own weights and frozen normalisation on the envs its seed gives, exactly what
    a single run's evaluation of the same replay returns (the same start states at every
    evaluation); a replay taken earlier plays with the weights it was taken with."""
    with _stepped_population(env_id, members=_MIXED) as population:
        members = range(len(_MIXED))
        seeds = {i: 1_000 + 7 * i for i in members}
        replays = {i: population.replay(i) for i in members}
        assert [replays[i].obs_mean is not None for i in members] == [True, False, True, False]
        alone = {i: evaluate_replay(replays[i], env_id, 3, seeds[i]) for i in members}
        for i in members:
            np.testing.assert_allclose(population.evaluate(i, 3, seeds[i]), alone[i], rtol=1e-5)
        for due in ([0, 1, 2, 3], [3, 1], [2]):
            got = evaluate_replays([replays[i] for i in due], env_id, 3, [seeds[i] for i in due])
            assert len(got) == len(due)
            for i, returns in zip(due, got, strict=True):
                np.testing.assert_allclose(returns, alone[i], rtol=1e-5, err_msg=str((due, i)))
        population.step()  # the members train on; the replays taken before are frozen
        got = evaluate_replays([replays[i] for i in (2, 0)], env_id, 3, [seeds[2], seeds[0]])
        np.testing.assert_allclose(got, [alone[2], alone[0]], rtol=1e-5)
        with pytest.raises(ValueError, match="seeds: one per member, got 1 for 2"):
            evaluate_replays([replays[0], replays[1]], env_id, 3, [5])


def test_evaluations_in_one_joined_cartpole_env_are_those_on_envs_of_their_own(monkeypatch):
    """CartPole's evaluations step every policy's episodes in one native vector env whose
    blocks start from each policy's own seed: the returns equal those of each policy on a
    vector env of its own (the general path), for members with different episode lengths."""
    from gae_core.agent import recording

    with _stepped_population(members=_MIXED) as population:
        members, seeds = [3, 0, 2, 1], [40, 7, 7, 123]
        replays = [population.replay(i) for i in members]
        joined = evaluate_replays(replays, "CartPole-v1", 4, seeds)
        assert recording._joined_native_env("CartPole-v1", 4, seeds) is not None
        monkeypatch.setattr(recording, "_joined_native_env", lambda *args: None)
        separate = evaluate_replays(replays, "CartPole-v1", 4, seeds)
        assert joined == separate
        assert len({r for returns in separate for r in returns}) > 1


def test_a_gymnasium_whose_cartpole_state_moved_gets_envs_of_their_own(monkeypatch):
    """The joined env relies on CartPole's internal ``state`` array. A gymnasium where writing
    it no longer moves the env (simulated: the write is dropped) fails the run-time check, and
    evaluations fall back to an env per policy with the same returns as that path."""
    from gae_core.agent import recording

    with _stepped_population() as population:
        members, seeds = [0, 2, 1], [3, 99, 3]
        replays = [population.replay(i) for i in members]
        expected = evaluate_replays(replays, "CartPole-v1", 3, seeds)
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
            assert evaluate_replays(replays, "CartPole-v1", 3, seeds) == expected
        finally:
            recording._joining_works.cache_clear()
        monkeypatch.undo()
        assert recording._joining_works("CartPole-v1")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_members_recorded_together_record_what_each_would_alone(env_id):
    """Recorded in lockstep with others (one stacked forward pass per step), a member's
    episodes are those record_replay of its replay plays alone: the same start states,
    actions drawn from its own generator, values and log-probs under its own networks and
    frozen normalisation (discrete actions exactly; Gaussian ones up to the float32 rounding of
    a batched matmul, which Pendulum's dynamics amplify along an episode: compared closely over
    its first 50 steps, and by its return over all 200). Trainer.record of one member is
    record_replay of its replay."""
    with _stepped_population(env_id, members=_MIXED) as population:
        members = range(len(_MIXED))
        seeds = {i: 500 + 11 * i for i in members}
        replays = {i: population.replay(i) for i in members}
        alone = {i: record_replay(replays[i], env_id, 2, seeds[i]) for i in members}
        lengths = {len(t.rewards) for episodes in alone.values() for t in episodes}
        if env_id == "CartPole-v1":  # episodes that end at different steps (Pendulum's: 200)
            assert len(lengths) > 1

        def check(got: list[Trajectory], expected: list[Trajectory], where) -> None:
            assert len(got) == len(expected) == 2
            for ours, theirs in zip(got, expected, strict=True):
                for name in ("terminated", "truncated"):
                    np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
                exact = ("observations", "next_observations", "actions", "rewards")
                for name in exact if env_id == "CartPole-v1" else ():
                    np.testing.assert_array_equal(
                        getattr(ours, name), getattr(theirs, name), err_msg=str(where)
                    )
                steps = slice(None) if env_id == "CartPole-v1" else slice(0, 50)
                for name in (*exact, "values", "next_values", "log_probs"):
                    np.testing.assert_allclose(
                        getattr(ours, name)[steps], getattr(theirs, name)[steps],
                        rtol=1e-5, atol=1e-6, err_msg=str(where),
                    )  # fmt: skip
                assert ours.rewards.sum() == pytest.approx(theirs.rewards.sum(), rel=1e-4)
                assert ours.value_scale == theirs.value_scale

        for due in ([0, 1, 2, 3], [3, 1], [2]):
            got = record_replays_together(
                [replays[i] for i in due], env_id, 2, [seeds[i] for i in due]
            )
            assert len(got) == len(due)
            for i, episodes in zip(due, got, strict=True):
                check(episodes, alone[i], (due, i))
        for i in (0, 3):
            check(population.record(i, 2, seeds[i]), alone[i], ("record", i))
        with pytest.raises(ValueError, match="seeds: one per member, got 1 for 2"):
            record_replays_together([replays[0], replays[1]], env_id, 2, [5])


# -- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
@pytest.mark.parametrize(("net", "what"), [("critic", "critic values"), ("actor", "loss")])
def test_a_member_that_blows_up_fails_alone(algo, net, what):
    extra = _PPO if algo == "ppo" else {}
    configs = [config(**m, **extra) for m in MEMBERS[:3]]
    population = Trainer(configs)
    try:
        with torch.no_grad():
            getattr(population, net).weights[-1][1].fill_(float("nan"))  # member 1's
        before = [population.model_of(i).state_dict() for i in (0, 2)]
        results = population.step()
        assert set(results) == {0, 2}
        assert population.member(1).error.startswith(f"TrainingDiverged: {what} became non-fin")
        assert not population._members[1].active
        for i, old in zip((0, 2), before, strict=True):
            new = population.model_of(i).state_dict()
            assert all(torch.isfinite(t).all() for t in new.values())
            assert any(not torch.equal(new[k], old[k]) for k in old)  # it did learn
        results = population.step()
        assert set(results) == {0, 2}
    finally:
        population.close()


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_a_member_whose_rewards_are_not_finite_fails_alone_naming_them(monkeypatch, algo):
    """GAE takes the trainer's rollout unchecked: a NaN reward in member 1's columns ends
    member 1 with "rewards" as the cause, and the others learn on."""
    extra = _PPO if algo == "ppo" else {}
    population = Trainer([config(**m, **extra) for m in MEMBERS[:3]])
    try:
        population.step()
        real, per = population.normalizers.scale_rewards, population.envs_per_member

        def scale_rewards(*args, **kwargs):
            scaled = np.array(real(*args, **kwargs), np.float32)
            scaled[per : 2 * per] = float("nan")  # member 1's columns
            return scaled

        monkeypatch.setattr(population.normalizers, "scale_rewards", scale_rewards)
        assert set(population.step()) == {0, 2}
        assert population.member(1).error == (
            "TrainingDiverged: rewards became non-finite at update 1"
        )
        monkeypatch.undo()
        assert set(population.step()) == {0, 2}
    finally:
        population.close()


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_a_member_whose_gradient_blows_up_fails_alone_and_is_not_counted_as_stepping(
    monkeypatch, algo
):
    """Its loss is finite, its gradient not: it fails alone, the others step, and the
    optimizer does not count a step for it; its weights and moments stay as they were."""
    extra = _PPO if algo == "ppo" else {}
    configs = [config(**m, **extra) for m in MEMBERS[:3]]
    population = Trainer(configs)
    optimizer = population.optimizer
    try:
        for _ in range(3):
            population.step()
        real = update_module.clip_per_member

        def clip_per_member(params, max_norm, learning):
            params[0].grad[1] = float("nan")  # member 1's gradient
            return real(params, max_norm, learning)

        monkeypatch.setattr(update_module, "clip_per_member", clip_per_member)
        state = [*optimizer.params, *optimizer.first_moments, *optimizer.second_moments]
        saved = [x.detach().clone() for x in state]
        counts = optimizer.row_steps.copy()
        assert set(population.step()) == {0, 2}
        assert population.member(1).error.startswith("TrainingDiverged: gradient became non-fin")
        steps = optimizer.row_steps - counts
        assert steps[1] == 0 and steps[0] >= 1 and steps[2] >= 1
        if algo == "a2c":
            assert steps.tolist() == [1, 0, 1]
        for x, old in zip(state, saved, strict=True):
            assert torch.isfinite(x).all()
            assert torch.equal(x[1], old[1])  # kept as it was
        for i in (0, 2):
            assert any(not torch.equal(x[i], old[i]) for x, old in zip(state, saved, strict=True))
        assert set(population.step()) == {0, 2}
    finally:
        population.close()


# -- who can share a trainer ----------------------------------------------------------------------

#: A value other than :func:`config`'s for every per-member field.
_PER_MEMBER_CHANGES = dict(
    total_steps=1_234, gamma=0.9, lambda_=0.5, learning_rate=1e-2, lr_schedule="linear",
    value_coef=1.0, entropy_coef=0.01, max_grad_norm=0.0, normalize_advantages=False,
    normalize_observations=True, normalize_rewards=True, reward_norm_reset="termination",
    normalize_clip=0.0, critic_target="fixed_lambda", critic_lambda=0.5, clip_range=0.1,
    clip_range_schedule="linear", clip_range_vf=0.2, target_kl=0.01, log_std_init=-1.0,
    sde_sample_freq=4,
    ortho_init=False, seed=7, checkpoint_every=100, eval_every=100, log_every=10,
)  # fmt: skip
#: A value other than a PPO Pendulum :func:`config`'s for every shared field (device: below).
_SHARED_CHANGES = dict(
    algo="a2c", env_id="MountainCarContinuous-v0", num_envs=4, rollout_steps=5,
    hidden_sizes=(8,), optimizer="rmsprop", use_sde=True, n_epochs=4, minibatch_size=5,
    torch_threads=2, eval_episodes=3, record_episodes=1,
)  # fmt: skip


def test_only_configs_that_can_share_a_trainer_do():
    """Configs share a trainer when their :data:`SHARED` fields are equal: every other field,
    normalisation and the learning rate included, may differ per member; a trainer of
    configs that differ in a shared field is refused."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(_PER_MEMBER_CHANGES) | set(_SHARED_CHANGES) | {"device"} == fields
    assert not set(_PER_MEMBER_CHANGES) & set(SHARED)
    assert set(_SHARED_CHANGES) | {"device"} == set(SHARED)
    base = config()
    for name, value in _PER_MEMBER_CHANGES.items():
        assert population_key(base) == population_key(dataclasses.replace(base, **{name: value}))
    everything = dataclasses.replace(base, **_PER_MEMBER_CHANGES)
    assert population_key(base) == population_key(everything)
    ppo = config("Pendulum-v1", **_PPO)
    for name, value in _SHARED_CHANGES.items():
        assert population_key(ppo) != population_key(dataclasses.replace(ppo, **{name: value}))
    elsewhere = dataclasses.replace(ppo)
    object.__setattr__(elsewhere, "device", "cuda")  # (a field check would need a GPU)
    assert population_key(ppo) != population_key(elsewhere)
    with pytest.raises(ValueError, match="members of one trainer must share"):
        Trainer([base, config(num_envs=4)])
    with pytest.raises(ValueError, match="members of one trainer must share"):
        Trainer([ppo, config("Pendulum-v1", **_PPO, use_sde=True)])
    with pytest.raises(ValueError, match="at least one member"):
        Trainer([])
    # normalised and plain members, or gSDE members, share one
    for configs in (
        [base, everything],
        [config("Pendulum-v1", use_sde=True, normalize_observations=True),
         config("Pendulum-v1", use_sde=True, seed=1, normalize_rewards=True)],
    ):  # fmt: skip
        trainer = Trainer(configs)
        try:
            assert set(trainer.step()) == {0, 1}
        finally:
            trainer.close()


# -- the run loop --------------------------------------------------------------------------------


def test_a_population_run_stores_each_member_as_its_own_run(tmp_path):
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=3_000, checkpoint_every=1_000, record_episodes=1, eval_every=1_500)
        for m in _MIXED[:3]
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_run(
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
        assert (replay.obs_mean is not None) == c.normalize_observations
        assert (replay.return_var is not None) == c.normalize_rewards
        for step in steps:  # each checkpoint's episodes: those its replay records alone
            stored = [Trajectory.from_bytes(b) for b in store.trajectory_blobs(run_id, step)]
            replay = load_replay(c, store.load_checkpoint(run_id, step))
            alone = record_replay(replay, c.env_id, c.record_episodes, record_seed(c))
            assert len(stored) == len(alone) == 1
            np.testing.assert_array_equal(stored[0].actions, alone[0].actions)
            np.testing.assert_array_equal(stored[0].observations, alone[0].observations)
            np.testing.assert_allclose(stored[0].values, alone[0].values, rtol=1e-5, atol=1e-6)
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
    one's evaluation and checkpoint are taken when it is due (a replay: its weights and
    normalisation then) and played together with the others' once all have passed the step:
    fewer calls than evaluations, and every stored evaluation is that of the checkpoint saved
    at the same step (its weights and statistics then, not the later ones it had when it was
    played), evaluated alone."""
    from gae_core.runs import execute

    calls = []
    real = execute.evaluate_replays

    def counted(replays, *args):
        calls.append(len(replays))
        return real(replays, *args)

    snapshots = {}  # (member, env step) -> its weights and statistics after that update
    real_step = Trainer.step

    def step(self):
        results = real_step(self)
        for i, result in results.items():
            snapshots[i, result.env_steps] = (
                self.model_of(i).state_dict(),
                self.normalizers.state(i),
            )
        return results

    monkeypatch.setattr(execute, "evaluate_replays", counted)
    monkeypatch.setattr(Trainer, "step", step)
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=3_000, checkpoint_every=1_000, eval_every=1_000, record_episodes=1)
        for m in _MIXED
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_run(
        [StoreSink(store, r) for r in run_ids], run_ids, configs, stops, flush_interval=0.05
    )
    assert [o.status for o in outcomes] == ["finished"] * len(configs)
    first_steps = {store.checkpoint_steps(r)[0] for r in run_ids}
    assert len(first_steps) > 1  # due at different updates
    evaluations = 0
    for index, (run_id, c) in enumerate(zip(run_ids, configs, strict=True)):
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])
        assert evals["env_step"].tolist() == store.checkpoint_steps(run_id)
        for step, value in zip(evals["env_step"], evals["value"], strict=True):
            replay = load_replay(c, store.load_checkpoint(run_id, int(step)))
            weights, statistics = snapshots[index, int(step)]
            for name, tensor in replay.model.state_dict().items():  # its weights when due
                torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)
            if c.normalize_observations:  # and its statistics then
                np.testing.assert_array_equal(replay.obs_mean, statistics["obs_mean"])
                np.testing.assert_array_equal(replay.obs_var, statistics["obs_var"])
            if c.normalize_rewards:
                assert replay.return_var == float(statistics["return_var"])
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
    real_step = Trainer.step

    def step(self):
        results = real_step(self)
        for i, result in results.items():
            seen.setdefault(i, []).append((result.env_steps, result.metrics.get(M.VALUE_LOSS.key)))
        return results

    monkeypatch.setattr(Trainer, "step", step)
    store = RunStore(tmp_path)
    configs = [
        config(**m, total_steps=1_000, log_every=150, checkpoint_every=250) for m in MEMBERS[:3]
    ]
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_run(
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


def test_members_whose_joint_recording_breaks_record_alone(tmp_path, monkeypatch):
    """If recording the members due together raises, each records alone inside its own run's
    failure handling: a recording that works alone still lands, one that fails fails only its
    run."""
    from gae_core.runs import execute

    joint = execute.record_replays_together
    configs = [config(**m, checkpoint_every=200, record_episodes=1) for m in MEMBERS[:3]]

    sizes = []

    def alone_only(replays, env_id, episodes, seeds):
        sizes.append(len(replays))
        if len(replays) > 1:
            raise RuntimeError("joint recording broke")
        if seeds == [record_seed(configs[1])]:
            raise RuntimeError("member 1's recording broke")
        return joint(replays, env_id, episodes, seeds)

    monkeypatch.setattr(execute, "record_replays_together", alone_only)
    store = RunStore(tmp_path)
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    outcomes = execute_run(
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
    from gae_core.runs import execute

    joint = execute.evaluate_replays
    configs = [config(**m, eval_every=150, checkpoint_every=150) for m in MEMBERS[:3]]
    sizes = []

    def alone_only(replays, env_id, episodes, seeds):
        sizes.append(len(seeds))
        if len(seeds) > 1:
            raise RuntimeError("joint evaluation broke")
        if seeds == [eval_seed(configs[1])]:
            raise RuntimeError("member 1's evaluation broke")
        return joint(replays, env_id, episodes, seeds)

    monkeypatch.setattr(execute, "evaluate_replays", alone_only)
    store = RunStore(tmp_path)
    run_ids = [store.create_run(c.to_dict()) for c in configs]
    stops = [threading.Event() for _ in configs]
    sinks = [_CountedSink(store, r) for r in run_ids]
    outcomes = execute_run(sinks, run_ids, configs, stops, flush_interval=0.05)
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


@pytest.mark.slow
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
    outcomes = execute_run(sinks, run_ids, configs, stops, flush_interval=0.05)
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
    outcomes = execute_run(sinks, run_ids, configs, stops, flush_interval=0.05)
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
    outcomes = execute_run(sinks, run_ids, configs, stops, flush_interval=0.0)
    assert stops[0].is_set() and [o.status for o in outcomes] == ["finished", "finished"]
    for run_id in run_ids:
        run = store.get_run(run_id)
        evals = store.metrics(run_id, [M.EVAL_RETURN.key])["env_step"].tolist()
        assert evals[-1] == run.env_steps and len(evals) == 2, (run_id, evals)
    store.close()


@pytest.mark.slow
def test_population_members_learn_cartpole_like_single_runs():
    """On the task: 8 members with the CartPole preset (seeds 0-7) at 60k steps. Single runs
    with those seeds ended at 84-500 (median 182) in their last 20 episodes, the members at
    59-433 (median 235), measured on this 2-core machine; a random policy gets about 22."""
    from gae_core.agent.presets import preset_config

    base = dataclasses.replace(
        preset_config("CartPole-v1"), total_steps=60_000, checkpoint_every=0, eval_every=0
    )
    population = Trainer([dataclasses.replace(base, seed=s) for s in range(8)])
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


@pytest.mark.slow  # two fresh interpreters importing torch: about 3 s
def test_a_population_process_keeps_freed_memory_mapped():
    """glibc gives an update's freed 9 MB blocks back to the OS (in a fresh process: its
    mmap threshold starts at 128 KB), so the next update maps and faults them in again; with
    keep_freed_memory (set by every trainer of several members) the memory stays mapped for
    the next update. Each case runs in a fresh process (the setting is process-wide); Linux
    only (/proc, glibc). What it saves is measured by benchmarks/bench_population.py."""
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
