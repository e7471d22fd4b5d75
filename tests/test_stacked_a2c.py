"""The population's hand-derived update (gae_core.agent.stacked_a2c) against torch autograd:
every gradient of its docstring, per member, over random networks, rows and masks; its clipping
rule; and the views it leaves the population's stacks holding."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core.agent.policy import ActorCritic
from gae_core.agent.stacked import StackedMLP
from gae_core.agent.stacked_a2c import StackedA2C

OBS_DIM = 3


def stacks(discrete: bool, hidden: tuple[int, ...], members: int, actions: int):
    observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,))
    action_space = (
        gym.spaces.Discrete(actions) if discrete else gym.spaces.Box(-1.0, 1.0, (actions,))
    )
    models = [
        ActorCritic(observation_space, action_space, hidden, seed, -0.3 + 0.2 * seed)
        for seed in range(members)
    ]
    actor = StackedMLP([m.actor for m in models])
    critic = StackedMLP([m.critic for m in models])
    log_std = None if discrete else torch.stack([m.log_std.detach() for m in models])
    return actor, critic, log_std


def autograd_reference(actor, critic, log_std, obs, actions, advantages, returns, mask, coefs):
    """Each member's loss, summed, by torch autograd on stacked leaves of the same weights: the
    module docstring's loss written directly (w_b / B_m weights, B_m ≥ 1)."""
    leaves = [p.detach().clone().requires_grad_(True) for p in actor.parameters()]
    critic_leaves = [p.detach().clone().requires_grad_(True) for p in critic.parameters()]
    std_leaf = None if log_std is None else log_std.detach().clone().requires_grad_(True)

    def run(params, x):
        layers = len(params) // 2
        for i in range(layers):
            x = torch.baddbmm(params[layers + i], x, params[i])
            if i < layers - 1:
                x = torch.tanh(x)
        return x

    rows = advantages.shape[1]
    weight = mask / mask.sum(1, keepdim=True).clamp(min=1.0)
    values = run(critic_leaves, obs)[:, :rows, 0]
    out = run(leaves, obs[:, :rows])
    if std_leaf is None:
        log_p = torch.log_softmax(out, -1)
        log_probs = log_p.gather(2, actions.long()[..., None])[..., 0]
        entropy = -(log_p.exp() * log_p).sum(-1)
    else:
        dist = torch.distributions.Normal(out, std_leaf[:, None, :].exp())
        log_probs = dist.log_prob(actions).sum(-1)
        entropy = dist.entropy().sum(-1)
    value_coef, entropy_coef = coefs
    policy = -(weight * advantages * log_probs).sum(1)
    value = (weight * (returns - values).square()).sum(1)
    entropy = (weight * entropy).sum(1)
    (policy + value_coef * value - entropy_coef * entropy).sum().backward()
    grads = [p.grad for p in [*leaves, *critic_leaves]]
    if std_leaf is not None:
        grads.append(std_leaf.grad)
    members = advantages.shape[0]
    flat = torch.cat([g.reshape(members, -1) for g in grads], dim=1)
    return (policy, value, entropy), flat


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    discrete=st.booleans(),
    hidden=st.sampled_from([(), (5,), (8, 6), (4, 70, 5)]),  # 70: past the narrow forms
    members=st.integers(1, 4),
    actions=st.integers(1, 4),
    steps=st.integers(1, 5),
    envs=st.integers(1, 3),
    used_steps=st.integers(1, 5),
)
def test_every_members_gradient_and_loss_terms_equal_autograds(
    seed, discrete, hidden, members, actions, steps, envs, used_steps
):
    """Rollout passes (one :meth:`act` per step), a critic pass over T+1 steps and the update
    of a possibly shorter last rollout (``used_steps``): each member's loss terms and its row of
    the flat gradient equal autograd's on the same weights, with masked rows, members without
    valid rows, and per-member value and entropy coefficients."""
    used_steps = min(used_steps, steps)
    rng = np.random.default_rng(seed)
    actor, critic, log_std = stacks(discrete, hidden, members, actions)
    engine = StackedA2C(actor, critic, log_std, steps)
    obs = torch.from_numpy(rng.normal(size=(members, used_steps + 1, envs, OBS_DIM)))
    obs = obs.float()
    for t in range(used_steps):
        engine.act(obs[:, t], t)
    rows = used_steps * envs
    flat_obs = obs.reshape(members, (used_steps + 1) * envs, OBS_DIM)
    engine.values(flat_obs)
    if discrete:
        acts = torch.from_numpy(rng.integers(0, actions, (members, rows)))
    else:
        acts = torch.from_numpy(rng.normal(size=(members, rows, actions))).float()
    advantages = torch.from_numpy(rng.normal(size=(members, rows))).float()
    returns = torch.from_numpy(rng.normal(size=(members, rows))).float()
    mask = torch.from_numpy(rng.random((members, rows)) < 0.8).float()
    mask[0] = 0.0 if members > 1 and seed % 3 == 0 else mask[0]  # a member without valid rows
    value_coef = torch.from_numpy(rng.uniform(0.0, 2.0, members)).float()
    entropy_coef = torch.from_numpy(rng.uniform(0.0, 0.5, members)).float()
    args = (flat_obs[:, :rows], acts, advantages, returns, mask)
    terms = engine.gradients(*args, value_coef, entropy_coef)
    expected_terms, expected_grad = autograd_reference(
        actor, critic, log_std, flat_obs, *args[1:], (value_coef, entropy_coef)
    )
    for got, expected in zip((terms.policy, terms.value, terms.entropy), expected_terms,
                             strict=True):  # fmt: skip
        torch.testing.assert_close(got, expected.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(engine.grad, expected_grad, rtol=1e-4, atol=1e-5)


def test_the_stacks_and_log_std_hold_views_of_the_flat_weights():
    """After construction the population's stacks read the engine's flat buffer: a step of the
    buffer (as the optimizer takes) is what the networks compute with, and gradients() fails
    loudly without a critic pass over this rollout."""
    actor, critic, log_std = stacks(False, (6, 5), 3, 2)
    x = torch.randn(3, 4, OBS_DIM)
    with torch.no_grad():
        before = actor(x)
    engine = StackedA2C(actor, critic, log_std, 2)
    torch.testing.assert_close(actor(x), before, rtol=0, atol=2e-6)  # same weights, as views
    with torch.no_grad():
        engine.flat.add_(0.25)
        assert torch.equal(actor.weights[0], engine.flat[:, : OBS_DIM * 6].view(3, OBS_DIM, 6))
        assert torch.equal(engine.log_std, engine.flat[:, -2:])
    assert not torch.allclose(actor(x), before)
    engine.act(x, 0)
    with pytest.raises(RuntimeError, match="values\\(\\) pass"):
        engine.gradients(x, torch.zeros(3, 4, 2), *(torch.zeros(3, 4),) * 3,
                         torch.ones(3), torch.ones(3))  # fmt: skip


def test_an_update_needs_its_own_rollouts_activations_and_survives_zero_grad():
    """The actor's part of the gradient reuses the activations :meth:`act` kept: an update
    without this rollout's act() passes (none, too few, or a second update of one rollout)
    fails loudly instead of using stale ones; the buffers, allocated inside inference mode,
    take a rollout outside it; and a ``.grad`` reset (``zero_grad``) does not lose the buffer
    the optimizer steps."""
    actor, critic, log_std = stacks(True, (6,), 2, 2)
    engine = StackedA2C(actor, critic, log_std, 2)
    obs = torch.randn(2, 3, 1, OBS_DIM)  # 2 steps of 1 env, and the bootstrap
    rows = obs.reshape(2, 3, OBS_DIM)
    args = (rows[:, :2], torch.zeros(2, 2), torch.ones(2, 2), torch.ones(2, 2), torch.ones(2, 2),
            torch.ones(2), torch.zeros(2))  # fmt: skip

    def update():
        engine.values(rows)
        return engine.gradients(*args)

    with pytest.raises(RuntimeError, match="needs that rollout's act"):
        update()  # no rollout yet
    with torch.inference_mode():
        engine.act(obs[:, 0], 0)
    with pytest.raises(RuntimeError, match="act\\(\\) at rollout step 2 after 1 steps"):
        engine.act(obs[:, 1], 2)  # a step skipped
    engine.act(obs[:, 1], 1)  # outside inference mode: the kept buffers are normal tensors
    engine.flat.grad = None  # what Optimizer.zero_grad does
    update()
    assert engine.flat.grad is engine.grad and torch.count_nonzero(engine.grad) > 0
    with pytest.raises(RuntimeError, match="needs that rollout's act"):
        update()  # the same rollout twice
    engine.act(obs[:, 0], 0)
    with pytest.raises(RuntimeError, match="needs that rollout's act"):
        update()  # one of its two steps


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.01, 100.0))
def test_clip_is_clip_grad_norm_per_member_and_zeroes_idle_members(seed, scale):
    """Each row is scaled as ``clip_grad_norm_`` scales that member's gradients; members not
    learning, or with a non-finite norm, get a zero row (no step); inf means no clipping."""
    actor, critic, log_std = stacks(True, (5,), 4, 2)
    engine = StackedA2C(actor, critic, log_std, 1)
    generator = torch.Generator().manual_seed(seed)
    engine.grad.copy_(torch.randn(engine.grad.shape, generator=generator) * scale)
    engine.grad[2, 0] = math.nan
    before = engine.grad.clone()
    max_norm = torch.tensor([0.5, math.inf, 0.5, 3.0])
    learning = torch.tensor([True, True, True, False])
    norms, finite = engine.clip(max_norm, learning)
    assert finite.tolist() == [True, True, False, True]
    for m in (0, 1):
        expected = before[m].clone().requires_grad_(False)
        leaf = torch.zeros_like(expected, requires_grad=True)
        leaf.grad = expected
        norm = torch.nn.utils.clip_grad_norm_([leaf], max_norm[m].item())
        torch.testing.assert_close(norms[m], norm, rtol=1e-6, atol=0)
        torch.testing.assert_close(engine.grad[m], leaf.grad, rtol=1e-6, atol=0)
    assert torch.count_nonzero(engine.grad[2:]) == 0
