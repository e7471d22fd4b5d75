"""The NumPy engine (gae_core.agent.numpy_a2c) against torch autograd: every gradient of its
docstring, its sampling and critic passes, its clipping rule, and whole training runs."""

from __future__ import annotations

import copy
import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.numpy_a2c import NumpyA2C, supports
from gae_core.agent.policy import ActorCritic
from gae_core.agent.recording import checkpoint_bytes, load_replay
from gae_core.agent.trainer import Trainer

OBS_DIM = 3


def model_for(discrete: bool, hidden: tuple[int, ...], seed: int, actions: int = 2):
    observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,))
    action_space = (
        gym.spaces.Discrete(actions) if discrete else gym.spaces.Box(-1.0, 1.0, (actions,))
    )
    return ActorCritic(observation_space, action_space, hidden, seed, log_std_init=-0.3)


def autograd_loss(model, observations, actions, advantages, returns, rows, coefs):
    """The module docstring's loss, by torch autograd on the torch model itself."""
    value_coef, entropy_coef = coefs
    values = model.values(torch.from_numpy(observations)).reshape(-1)[torch.from_numpy(rows)]
    valid_obs = torch.from_numpy(observations.reshape(-1, OBS_DIM)[rows])
    log_probs, entropy = model.log_probs_and_entropy(valid_obs, torch.from_numpy(actions))
    advantages, returns = torch.from_numpy(advantages), torch.from_numpy(returns)
    policy = -(advantages * log_probs).mean()
    value = (returns - values).square().mean()
    loss = policy + value_coef * value - entropy_coef * entropy.mean()
    model.zero_grad()
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    terms = {"loss": loss, "policy": policy, "value": value, "entropy": entropy.mean()}
    return {k: v.item() for k, v in terms.items()}, values.detach().numpy(), grads.numpy()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    discrete=st.booleans(),
    hidden=st.sampled_from([(), (5,), (8, 6), (4, 7, 5)]),
    actions=st.integers(1, 4),
    steps=st.integers(1, 6),
    envs=st.integers(1, 4),
    value_coef=st.floats(0.0, 2.0),
    entropy_coef=st.floats(0.0, 0.5),
)
def test_gradients_equal_torch_autograd(
    seed, discrete, hidden, actions, steps, envs, value_coef, entropy_coef
):
    """For random networks, rollouts (with invalid rows), advantages and coefficients the loss
    terms, the valid rows' values and the whole flat gradient equal torch autograd's on the same
    model: the categorical and Gaussian heads, the critic and the backward through every layer."""
    rng = np.random.default_rng(seed)
    model = model_for(discrete, hidden, seed, actions)
    reference = copy.deepcopy(model)
    engine = NumpyA2C(model, threads=1)
    observations = rng.normal(size=(steps + 1, envs, OBS_DIM)).astype(np.float32)
    valid = rng.random(steps * envs) < 0.8
    valid[rng.integers(steps * envs)] = True  # at least one row
    rows = np.flatnonzero(valid)
    count = len(rows)
    if discrete:
        taken = rng.integers(0, actions, count)
    else:
        taken = rng.normal(size=(count, actions)).astype(np.float32)
    advantages = rng.normal(size=count).astype(np.float32)
    returns = (3.0 * rng.normal(size=count)).astype(np.float32)

    engine.values(observations)
    valid_obs = observations[:-1].reshape(-1, OBS_DIM)[rows]
    terms, values = engine.gradients(
        valid_obs, taken, advantages, returns, rows, value_coef, entropy_coef
    )
    expected_terms, expected_values, expected_grad = autograd_loss(
        reference, observations, taken, advantages, returns, rows, (value_coef, entropy_coef)
    )
    np.testing.assert_allclose(values, expected_values, rtol=1e-5, atol=1e-6)
    for name, value in expected_terms.items():
        assert terms[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    np.testing.assert_allclose(engine.flat.grad.numpy(), expected_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("discrete", [True, False])
def test_sampling_and_values_equal_the_torch_model(discrete):
    """Same weights, same generator state: the same actions (categorical exactly, Gaussian to
    float rounding) and the same critic values as ActorCritic's own passes."""
    model = model_for(discrete, (16, 16), seed=3)
    engine = NumpyA2C(model, threads=1)
    obs = np.random.default_rng(0).normal(size=(64, OBS_DIM)).astype(np.float32)
    ours = engine.sample(obs, np.random.default_rng(11))
    with torch.inference_mode():
        theirs = model.sample(torch.from_numpy(obs), np.random.default_rng(11))
        values = model.values(torch.from_numpy(obs)).numpy()
    if discrete:
        np.testing.assert_array_equal(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(engine.values(obs), values, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("max_norm", [0.05, 1e6, float("inf")])
def test_clip_follows_torch_clip_grad_norm(max_norm):
    model = model_for(True, (8,), seed=1)
    engine = NumpyA2C(model, threads=1)
    grad = np.random.default_rng(2).normal(size=engine.flat.numel()).astype(np.float32)
    engine.flat.grad.numpy()[:] = grad
    reference = torch.from_numpy(grad.copy()).requires_grad_()
    reference.grad = torch.from_numpy(grad.copy())
    expected = torch.nn.utils.clip_grad_norm_([reference], max_norm).item()
    assert engine.clip(max_norm) == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(engine.flat.grad.numpy(), reference.grad.numpy(), rtol=1e-6)
    assert (max_norm < expected) == (not np.array_equal(engine.flat.grad.numpy(), grad))


def test_the_model_keeps_owning_the_weights_the_engine_trains():
    """The torch parameters are views of the flat buffer: a change to the buffer is the model's
    weights, and a checkpoint of the model reads back as exactly those weights."""
    model = model_for(True, (8,), seed=0)
    engine = NumpyA2C(model, threads=1)
    engine.flat.add_(0.25)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(flat, engine.flat, rtol=0, atol=0)
    state = torch.load(io.BytesIO(checkpoint_bytes(model, {})), weights_only=True)["model"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)


def test_engines_are_chosen_by_device_and_gsde():
    assert supports(use_sde=False, device="cpu")
    assert not supports(use_sde=True, device="cpu")
    assert not supports(use_sde=False, device="cuda")


@pytest.mark.parametrize(
    ("env_id", "overrides"),
    [
        ("CartPole-v1", dict(optimizer="rmsprop", learning_rate=7e-4, entropy_coef=0.01)),
        ("CartPole-v1", dict(optimizer="adam", normalize_advantages=True, critic_lambda=1.0,
                             critic_target="fixed_lambda", max_grad_norm=0.0)),
        ("Pendulum-v1", dict(optimizer="rmsprop", lr_schedule="linear",
                             normalize_observations=True, normalize_rewards=True)),
    ],
)  # fmt: skip
def test_a_run_on_each_engine_takes_the_same_updates(env_id, overrides):
    """Two trainers with one config, one on each engine, fed the same rollouts: after every one
    of several updates the weights and every update metric agree to float rounding."""
    config = TrainConfig(
        env_id=env_id, num_envs=4, rollout_steps=8, hidden_sizes=(32, 32), total_steps=10_000,
        checkpoint_every=0, record_episodes=0, eval_every=0, **overrides,
    )  # fmt: skip
    fast, slow = Trainer(config), Trainer(config, autograd=True)
    assert fast._numpy is not None and slow._numpy is None
    try:
        for update in range(6):
            fast.collect()
            slow._batch, slow._steps_before_update = fast._batch, fast._steps_before_update
            got = fast.update(*fast.estimate())
            expected = slow.update(*slow.estimate())
            for key in (m.key for m in M.UPDATE):
                assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-5), (update, key)
            for (name, ours), theirs in zip(
                fast.model.state_dict().items(), slow.model.state_dict().values(), strict=True
            ):
                torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        fast.close()
        slow.close()


def test_checkpoints_of_a_numpy_run_replay_its_weights():
    config = TrainConfig(num_envs=2, rollout_steps=8, hidden_sizes=(16,), total_steps=256,
                         checkpoint_every=0, record_episodes=0, eval_every=0)  # fmt: skip
    trainer = Trainer(config)
    try:
        while not trainer.done:
            trainer.step()
        replay = load_replay(config, trainer.checkpoint_bytes())
        for name, tensor in trainer.model.state_dict().items():
            torch.testing.assert_close(replay.model.state_dict()[name], tensor, rtol=0, atol=0)
    finally:
        trainer.close()


def test_each_update_needs_its_own_critic_pass_and_survives_zero_grad():
    """A second gradient call on one critic pass fails loudly (autograd's graph is freed after
    one backward too), and a ``zero_grad`` that dropped ``flat.grad`` does not orphan the
    buffer the engine writes: the optimizer still sees the gradient."""
    model = model_for(True, (8,), seed=4)
    engine = NumpyA2C(model, threads=1)
    obs = np.random.default_rng(1).normal(size=(3, 2, OBS_DIM)).astype(np.float32)
    rows = np.arange(4)
    args = (obs[:-1].reshape(-1, OBS_DIM), np.array([0, 1, 1, 0]), np.ones(4, np.float32),
            np.zeros(4, np.float32), rows, 0.5, 0.0)  # fmt: skip
    engine.values(obs)
    engine.flat.grad = None  # what Optimizer.zero_grad does
    engine.gradients(*args)
    assert engine.flat.grad is not None and engine.flat.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="values"):
        engine.gradients(*args)


def test_explained_variance_closed_form():
    from gae_core.agent.trainer import explained_variance

    returns = np.array([1.0, 2.0, 3.0, 6.0])
    values = np.array([1.0, 2.5, 2.0, 6.0])
    expected = 1.0 - np.var(returns - values) / np.var(returns)
    assert explained_variance(values, returns) == pytest.approx(expected, rel=1e-12)
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(values, np.full(4, 2.0)) == 0.0  # undefined: returns constant
    tensor = torch.tensor(values, requires_grad=True)
    assert explained_variance(tensor, torch.tensor(returns)) == pytest.approx(expected)
