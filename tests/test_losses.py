"""The losses (gae_core.agent.losses) against their docstring's formulas, closed-form PPO cases
and the trainer's use of them: each member's loss reads only its own rows, PPO's clip and KL
stop act as SB3's do, and the coefficients are combined in one place."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core import metrics as M
from gae_core.agent import update as update_module
from gae_core.agent.config import TrainConfig
from gae_core.agent.losses import (
    ADVANTAGE_EPSILON,
    Coefficients,
    Rows,
    a2c_gradients,
    a2c_loss,
    masked_mean,
    ppo_fixed,
    ppo_gradients,
    ppo_loss,
    standardize,
)
from gae_core.agent.policy import log_probs_and_entropy
from gae_core.agent.presets import PPO_PRESETS
from gae_core.agent.stacked import (
    NARROW_MAX,
    StackedMLP,
    explained_variance,
    masked_moments,
)
from gae_core.agent.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _rows(seed: int, members: int, rows: int):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    mask = (torch.rand(members, rows, generator=generator) < 0.8).double()
    mask[:, 0] = 1.0  # every member has a row
    return draw, mask


def _mean(x: torch.Tensor, mask_row: torch.Tensor) -> torch.Tensor:
    return x[mask_row.bool()].mean()


def ppo(log_probs, old, entropy, values, old_values, advantages, returns, mask, clip_range,
        clip_range_vf, value_coef, entropy_coef, fixed=None):  # fmt: skip
    """:func:`ppo_loss` with its inputs in the order of its formulas (π, π_old, H, V, V_old,
    Â, R, mask, ε, ε_v, c_v, c_e)."""
    return ppo_loss(
        log_probs,
        entropy,
        values,
        Rows(advantages, returns, mask, old, old_values),
        Coefficients(value_coef, entropy_coef, clip_range, clip_range_vf),
        fixed,
    )


def ppo_by_hand(actor, critic, log_std, actor_pass, critic_pass, actions, old, old_values,
                advantages, returns, mask, clip_range, clip_range_vf, value_coef, entropy_coef,
                fixed=None):  # fmt: skip
    """:func:`ppo_gradients` with the rows and coefficients in :func:`ppo`'s order."""
    return ppo_gradients(actor, critic, log_std, actor_pass, critic_pass, actions,
                         Rows(advantages, returns, mask, old, old_values),
                         Coefficients(value_coef, entropy_coef, clip_range, clip_range_vf),
                         fixed)  # fmt: skip


def fixed_of(advantages, mask, clip_range, value_coef, entropy_coef):
    """:func:`ppo_fixed` of these advantages, mask and coefficients."""
    rows = Rows(advantages, torch.zeros_like(advantages), mask)
    return ppo_fixed(rows, Coefficients(value_coef, entropy_coef, clip_range))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 4), rows=st.integers(1, 30))
def test_a2c_loss_is_its_formula_per_member_over_valid_rows(seed, members, rows):
    draw, mask = _rows(seed, members, rows)
    log_probs, entropy, values, advantages, returns = (draw(members, rows) for _ in range(5))
    value_coef, entropy_coef = draw(members).abs(), draw(members).abs()
    terms = a2c_loss(log_probs, entropy, values, Rows(advantages, returns, mask),
                     Coefficients(value_coef, entropy_coef))  # fmt: skip
    for m in range(members):
        policy = -_mean(advantages[m] * log_probs[m], mask[m])
        value = _mean((returns[m] - values[m]) ** 2, mask[m])
        mean_entropy = _mean(entropy[m], mask[m])
        torch.testing.assert_close(terms.policy[m], policy)
        torch.testing.assert_close(terms.value[m], value)
        torch.testing.assert_close(terms.entropy[m], mean_entropy)
        expected = policy + value_coef[m] * value - entropy_coef[m] * mean_entropy
        torch.testing.assert_close(terms.loss[m], expected)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 4), rows=st.integers(1, 30))
def test_a_members_loss_and_gradient_read_only_its_own_valid_rows(seed, members, rows):
    """Changing another member's rows, or this member's masked rows, changes nothing of its
    loss; the gradient of the members' summed losses with respect to member m's inputs is
    the gradient of m's own loss."""
    draw, mask = _rows(seed, members, rows)
    inputs = [draw(members, rows).requires_grad_(True) for _ in range(5)]
    coefs = (draw(members).abs(), draw(members).abs())

    def a2c(log_probs, entropy, values, advantages, returns, mask, value_coef, entropy_coef):
        return a2c_loss(log_probs, entropy, values, Rows(advantages, returns, mask),
                        Coefficients(value_coef, entropy_coef))  # fmt: skip

    terms = a2c(*inputs, mask, *coefs)
    terms.loss.sum().backward()
    for m in range(members):
        moved = [x.detach().clone() for x in inputs]
        noise = draw(members, rows)
        keep = torch.zeros(members, rows, dtype=torch.bool)
        keep[m] = mask[m].bool()
        for x in moved:
            x.add_(torch.where(keep, 0.0, noise))  # everything but m's valid rows moves
        again = a2c(*moved, mask, *coefs)
        torch.testing.assert_close(again.loss[m], terms.loss[m])
        alone = [x.detach()[m : m + 1].clone().requires_grad_(True) for x in inputs]
        a2c(*alone, mask[m : m + 1], coefs[0][m : m + 1], coefs[1][m : m + 1]).loss.backward()
        for x, own in zip(inputs, alone, strict=True):
            torch.testing.assert_close(x.grad[m], own.grad[0])


def _ppo(ratio: float, advantage: float, epsilon: float = 0.2):
    log_probs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    one = torch.ones(1, 1, dtype=torch.float64)
    terms = ppo(
        log_probs, 0.0 * one, 0.0 * one, one, one, advantage * one, one, one,
        torch.tensor([epsilon]), torch.tensor([math.inf]), torch.ones(1), torch.zeros(1),
    )  # fmt: skip
    terms.loss.sum().backward()
    return terms, log_probs.grad.item()


@pytest.mark.parametrize(
    ("ratio", "advantage", "surrogate", "clipped"),
    [
        (1.1, 2.0, 1.1 * 2.0, False),  # inside the clip: r·Â
        (1.5, 2.0, 1.2 * 2.0, True),  # Â > 0, r > 1 + ε: (1 + ε)·Â, no gradient
        (0.5, 2.0, 0.5 * 2.0, False),  # Â > 0, r < 1 − ε: the min keeps r·Â (pessimistic)
        (0.5, -2.0, 0.8 * -2.0, True),  # Â < 0, r < 1 − ε: (1 − ε)·Â, no gradient
        (1.5, -2.0, 1.5 * -2.0, False),  # Â < 0, r > 1 + ε: the min keeps r·Â
    ],
)
def test_ppos_clipped_surrogate_in_closed_form(ratio, advantage, surrogate, clipped):
    terms, gradient = _ppo(ratio, advantage)
    assert terms.policy.item() == pytest.approx(-surrogate)
    # d(−r·Â)/d log π = −r·Â where the unclipped term is taken, 0 where the clip binds
    assert gradient == pytest.approx(0.0 if clipped else -ratio * advantage)
    assert terms.clip_fraction.item() == (1.0 if abs(ratio - 1) > 0.2 else 0.0)
    assert terms.approx_kl.item() == pytest.approx((ratio - 1) - math.log(ratio))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 3), rows=st.integers(1, 20))
def test_ppo_loss_is_its_formula_per_member(seed, members, rows):
    draw, mask = _rows(seed, members, rows)
    log_probs, old, entropy, values, old_values, advantages, returns = (
        draw(members, rows) for _ in range(7)
    )
    old = log_probs + 0.3 * draw(members, rows)
    epsilon = draw(members).abs() * 0.3 + 0.01
    epsilon_v = torch.where(draw(members) > 0, draw(members).abs(), math.inf)
    value_coef, entropy_coef = draw(members).abs(), draw(members).abs()
    terms = ppo(log_probs, old, entropy, values, old_values, advantages, returns, mask,
                epsilon, epsilon_v, value_coef, entropy_coef)  # fmt: skip
    for m in range(members):
        ratio = torch.exp(log_probs[m] - old[m])
        surrogate = torch.minimum(
            ratio * advantages[m],
            torch.clamp(ratio, 1 - epsilon[m], 1 + epsilon[m]) * advantages[m],
        )
        clipped = old_values[m] + torch.clamp(
            values[m] - old_values[m], -epsilon_v[m], epsilon_v[m]
        )
        policy = -_mean(surrogate, mask[m])
        value = _mean((returns[m] - clipped) ** 2, mask[m])
        torch.testing.assert_close(terms.policy[m], policy)
        torch.testing.assert_close(terms.value[m], value)
        if math.isinf(epsilon_v[m]):  # no value clip: the plain squared error
            torch.testing.assert_close(value, _mean((returns[m] - values[m]) ** 2, mask[m]))
        kl = _mean((ratio - 1) - torch.log(ratio), mask[m])
        torch.testing.assert_close(terms.approx_kl[m], kl)
        assert terms.approx_kl[m] >= 0  # (r − 1) − log r ≥ 0 for every r > 0
        fraction = _mean(((ratio - 1).abs() > epsilon[m]).double(), mask[m])
        torch.testing.assert_close(terms.clip_fraction[m], fraction)
        expected = policy + value_coef[m] * value - entropy_coef[m] * _mean(entropy[m], mask[m])
        torch.testing.assert_close(terms.loss[m], expected)

    # a member that does not clip (ε_v = ∞) has, bit for bit, the numbers it has alone with
    # None (V_clip = V): whether another member clips changes nothing of its own
    for m in range(members):
        if math.isinf(epsilon_v[m]):
            own = (x[m : m + 1] for x in (log_probs, old, entropy, values, old_values, advantages,
                                          returns, mask))  # fmt: skip
            alone = ppo(*own, epsilon[m : m + 1], None, value_coef[m : m + 1],
                             entropy_coef[m : m + 1])  # fmt: skip
            for name in ("loss", "policy", "value", "entropy", "approx_kl", "clip_fraction"):
                torch.testing.assert_close(getattr(alone, name)[0], getattr(terms, name)[m],
                                           rtol=0, atol=0)  # fmt: skip
    # no member clipping its value (None): V_clip = V, the plain squared error; no member
    # weighing the entropy (None): c_e = 0
    plain = ppo(log_probs, old, entropy, values, old_values, advantages, returns, mask,
                     epsilon, None, value_coef, None)  # fmt: skip
    unclipped = ppo(log_probs, old, entropy, values, old_values, advantages, returns, mask,
                         epsilon, torch.full_like(epsilon, math.inf), value_coef,
                         torch.zeros_like(value_coef))  # fmt: skip
    for name in ("loss", "policy", "value", "entropy", "approx_kl", "clip_fraction"):
        torch.testing.assert_close(getattr(plain, name), getattr(unclipped, name))
    for m in range(members):
        value = _mean((returns[m] - values[m]) ** 2, mask[m])
        torch.testing.assert_close(plain.value[m], value)
        torch.testing.assert_close(plain.loss[m], plain.policy[m] + value_coef[m] * value)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 3), rows=st.integers(1, 20),
       entropy=st.booleans())  # fmt: skip
def test_ppo_fixed_is_its_formulas_and_changes_no_bit_of_the_loss(seed, members, rows, entropy):
    """PPOFixed's fields are w_b = mask_b / B_m, 1 ∓ ε, −w_b Â_b, −c_e w_b (None without an
    entropy coefficient) and −2 c_v w_b; the loss and the gradients by hand given them are, to
    the bit, those that compute them."""
    draw, mask = _rows(seed, members, rows)
    advantages, returns = draw(members, rows), draw(members, rows)
    epsilon = draw(members).abs() * 0.3 + 0.01
    value_coef = draw(members).abs()
    entropy_coef = draw(members).abs() if entropy else None
    fixed = fixed_of(advantages, mask, epsilon, value_coef, entropy_coef)
    for m in range(members):  # each member's own numbers, in the order the loss takes them
        weight = mask[m] / mask[m].sum().clamp(min=1.0)
        assert torch.equal(fixed.weight[m], weight)
        assert torch.equal(fixed.low[m, 0], 1.0 - epsilon[m])
        assert torch.equal(fixed.high[m, 0], 1.0 + epsilon[m])
        assert torch.equal(fixed.policy_grad[m], -weight * advantages[m])
        assert torch.equal(fixed.value_grad[m], (-2.0 * value_coef[m]) * weight)
        if entropy:
            assert torch.equal(fixed.entropy_grad[m], -entropy_coef[m] * weight)
    assert (fixed.entropy_grad is None) == (not entropy)

    actor, _ = _stacks(seed, members, [3, 10, 4, 2])
    critic, _ = _stacks(seed + 1, members, [3, 10, 1])
    x = draw(members, rows, 3)
    actions = torch.randint(0, 2, (members, rows), generator=torch.Generator().manual_seed(seed))
    old = draw(members, rows) - 0.7
    args = (actions, old, draw(members, rows), advantages, returns, mask, epsilon, None,
            value_coef, entropy_coef)  # fmt: skip
    found = []
    for passed in (None, fixed):
        for p in (*actor.parameters(), *critic.parameters()):
            p.grad = None
        terms = ppo_by_hand(actor, critic, None, actor.layers(x), critic.layers(x), *args,
                              passed)  # fmt: skip
        found.append([terms.loss, *(p.grad.clone() for p in (*actor.parameters(),
                                                              *critic.parameters()))])  # fmt: skip
    for computed, kept in zip(*found, strict=True):
        assert torch.equal(computed, kept)


@pytest.mark.parametrize("minibatch", [64, 256])
def test_the_updates_minibatch_carries_the_fixed_part_of_its_own_rows(minibatch):
    """Learner._minibatch's PPOFixed is ppo_fixed of the rows it hands on (the standardised
    advantages, its own mask) under the update's coefficients, to the bit: for one minibatch
    of every row and for a drawn subset."""
    configs = [TrainConfig(env_id="CartPole-v1", algo="ppo", seed=s, num_envs=2,
                           rollout_steps=128, minibatch_size=minibatch,
                           normalize_advantages=s == 0, entropy_coef=0.01 * s,
                           clip_range=0.1 + 0.1 * s) for s in range(2)]  # fmt: skip
    learner = Trainer(configs).learner
    learner._spent = [0, 0]
    generator = torch.Generator().manual_seed(0)
    rows = 256
    inputs = (torch.randn(2, rows, 4, generator=generator),
              torch.randint(0, 2, (2, rows), generator=generator))  # fmt: skip
    rollout = Rows(*(torch.randn(2, rows, generator=generator) for _ in range(2)),
                   (torch.rand(2, rows, generator=generator) < 0.8).float(),
                   *(torch.randn(2, rows, generator=generator) for _ in range(2)))  # fmt: skip
    coefficients = replace(learner.coefficients, clip_range=learner._clip_ranges())
    index = None if minibatch >= rows else torch.randperm(rows, generator=generator)[:64]
    index = None if index is None else index.expand(2, -1)
    _, part, fixed, counted = learner._minibatch(inputs, rollout, coefficients, index)
    advantages, mask = part.advantages, part.mask
    assert not torch.equal(advantages[0], rollout.advantages[0] if index is None else
                           rollout.advantages[0, index[0]])  # member 0 standardises  # fmt: skip
    if index is not None:  # every field of the rows taken alike
        assert torch.equal(part.old_values, rollout.old_values.gather(1, index))
    expected = ppo_fixed(part, coefficients)
    for name in ("weight", "low", "high", "policy_grad", "entropy_grad", "value_grad"):
        assert torch.equal(getattr(fixed, name), getattr(expected, name)), name
    assert counted.tolist() == (mask.sum(1) > 0).tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 4), rows=st.integers(1, 30))
def test_standardize_is_sb3s_per_member_over_valid_rows(seed, members, rows):
    draw, mask = _rows(seed, members, rows)
    advantages = draw(members, rows) * 3 + 1
    out = standardize(advantages, mask)
    for m in range(members):
        valid = advantages[m][mask[m].bool()]
        if len(valid) < 2:
            torch.testing.assert_close(out[m], advantages[m])  # a std of one row: unchanged
            continue
        expected = (valid - valid.mean()) / (valid.std() + ADVANTAGE_EPSILON)  # unbiased std
        torch.testing.assert_close(out[m][mask[m].bool()], expected)
    assert masked_mean(mask * 0, mask).abs().sum() == 0


def _trainer(**fields) -> Trainer:
    base = dict(algo="ppo", num_envs=4, rollout_steps=16, minibatch_size=16, n_epochs=5,
                total_steps=10_000, hidden_sizes=(16,), checkpoint_every=0, record_episodes=0,
                learning_rate=3e-3)  # fmt: skip
    return Trainer([TrainConfig(**{**base, **fields, "seed": s}) for s in range(2)])


def test_ppo_takes_every_minibatch_step_of_every_epoch_without_target_kl():
    """4 envs × 16 steps = 64 rows, minibatches of 16, 5 epochs: 5 × ⌈V / 16⌉ gradient steps
    per update for each member of V valid rows (Adam counts each member's own), as SB3's loop
    takes (20 without reset rows)."""
    trainer = _trainer()
    try:
        expected = np.zeros(2, int)
        for _ in range(2):
            trainer.step()
            valid = trainer._batch.valid.reshape(16, 2, 4).sum((0, 2))
            expected += 5 * -(-valid // 16)
            assert trainer.optimizer.row_steps.tolist() == expected.tolist()
    finally:
        trainer.close()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), members=st.integers(1, 3), rows=st.integers(1, 200),
       size=st.integers(1, 64), share=st.floats(0.0, 1.0))  # fmt: skip
def test_even_minibatches_split_the_valid_rows_into_as_even_parts_as_can_be(
    seed, members, rows, size, share
):
    """A PPO epoch, per member: its V valid rows, in the order ``rng.permutation(V)`` draws,
    in ⌈V / size⌉ minibatches whose sizes differ by at most one (SB3's when size divides V; no
    short tail otherwise), every valid row once, no invalid row; the slots left empty, and
    the minibatches past its own up to the most any member has."""
    valid = np.random.default_rng(seed).random((members, rows)) < share
    rngs = [np.random.default_rng([seed, m]) for m in range(members)]
    index, weight = update_module.even_minibatches(rngs, valid, size)
    counts = valid.sum(1)
    parts = -(-counts // size)
    assert index.shape == weight.shape == (members, parts.max(initial=0), size)
    for m in range(members):
        count, own = int(counts[m]), int(parts[m])
        sizes = weight[m].sum(1).astype(int)
        assert sizes[own:].sum() == 0 and sizes.sum() == count
        if count:
            assert sizes[:own].max() - sizes[:own].min() <= 1 and sizes[:own].min() >= 1
            assert count % size or (sizes[:own] == size).all()  # size divides V: all full
        taken = index[m][weight[m] > 0]  # row-major: minibatch by minibatch, slot by slot
        order = np.flatnonzero(valid[m])[np.random.default_rng([seed, m]).permutation(count)]
        assert taken.tolist() == order.tolist()


def test_each_members_ppo_minibatches_split_its_valid_rows_evenly(monkeypatch):
    """In the update, each member's minibatches are :func:`even_minibatches` of its own valid
    rows (NEXT_STEP reset rows in none), in every epoch; minibatches past every member's are
    not taken at all."""
    seen = []
    take = update_module.Learner._minibatch

    def spy(self, inputs, rollout, coefficients, index=None, weight=None):
        out = take(self, inputs, rollout, coefficients, index, weight)
        seen.append(out[1].mask.sum(1).tolist())
        return out

    monkeypatch.setattr(update_module.Learner, "_minibatch", spy)
    trainer = _trainer(n_epochs=2)
    try:
        short = 0
        for _ in range(6):
            seen.clear()
            trainer.step()
            valid = trainer._batch.valid.reshape(16, 2, 4).sum((0, 2)).tolist()  # per member
            parts = -(-max(valid) // 16)
            assert len(seen) == 2 * parts
            for epoch in (seen[:parts], seen[parts:]):
                for m in range(2):
                    own = -(-valid[m] // 16)
                    bounds = np.arange(own + 1) * valid[m] // own
                    expected = np.diff(bounds).tolist() + [0] * (parts - own)
                    assert [int(part[m]) for part in epoch] == expected
            short += sum(v < 64 for v in valid)
        assert short  # some rollouts had reset rows
    finally:
        trainer.close()


def test_ppos_target_kl_stops_only_the_member_past_it_before_its_step():
    """SB3's rule: before a minibatch's step, a member whose approximate KL exceeds 1.5 ×
    target_kl takes no more steps on this rollout. The first minibatch has KL 0 (the policy
    has not moved), so a tiny target_kl allows exactly one step; the other member (no
    target_kl) takes all 20, and its numbers are not touched by the first one's stop."""
    trainer = _trainer()
    stopping = Trainer([
        TrainConfig(**{**c.to_dict(), "target_kl": 1e-12 if c.seed == 0 else 0.0})
        for c in trainer.configs
    ])  # fmt: skip
    try:
        a = trainer.step()
        b = stopping.step()
        assert stopping.optimizer.row_steps.tolist() == [1, 20]
        for name, tensor in trainer.model_of(1).state_dict().items():
            torch.testing.assert_close(stopping.model_of(1).state_dict()[name], tensor)
        assert a[1].metrics.keys() == b[1].metrics.keys()
        assert b[0].metrics[M.APPROX_KL.key] > 0  # the KL it stopped on is reported
    finally:
        trainer.close()
        stopping.close()


def test_the_coefficients_are_combined_in_the_loss_module_only():
    """value_coef and entropy_coef weigh the loss terms in gae_core/agent/losses.py alone: a
    second place that multiplies by them is a second copy of the loss."""
    pattern = re.compile(r"(value|entropy)_coef\w*\s*\*|\*\s*[\w.\[\]]*(value|entropy)_coef")
    found = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "gae_core").rglob("*.py")
        if pattern.search(path.read_text())
    }
    assert found == {"gae_core/agent/losses.py"}


def test_a_seeded_ppo_run_repeats_itself():
    def trace():
        trainer = _trainer(n_epochs=2)
        try:
            return [np.array([r.metrics[k] for k in sorted(r.metrics) if "perf" not in k])
                    for _ in range(3) for r in trainer.step().values()]  # fmt: skip
        finally:
            trainer.close()

    for x, y in zip(trace(), trace(), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", sorted(PPO_PRESETS))
def test_every_ppo_preset_builds_and_trains_two_updates(env_id):
    """Each PPO preset as the form and the CLI start it, on a budget of two rollouts: it
    trains, its metrics are finite, and its checkpoint replays."""
    import dataclasses

    from gae_core.agent.presets import preset_config
    from gae_core.agent.recording import load_replay

    config = preset_config(env_id, "ppo")
    config = dataclasses.replace(config, total_steps=2 * config.batch_size, checkpoint_every=0,
                                 eval_every=0, record_episodes=0)  # fmt: skip
    trainer = Trainer(config)
    try:
        while not trainer.done:
            for result in trainer.step().values():
                if M.POLICY_LOSS.key in result.metrics:  # (a last rollout of one reset row
                    # takes no step and reports its learning rate only)
                    assert {M.APPROX_KL.key, M.CLIP_FRACTION.key} <= result.metrics.keys()
                assert all(math.isfinite(v) for v in result.metrics.values())
        assert trainer.member(0).error is None
        replay = load_replay(config, trainer.checkpoint_bytes())
        assert replay.model.sde == config.use_sde
    finally:
        trainer.close()


def _stacks(seed: int, members: int, sizes: list[int]) -> tuple[StackedMLP, StackedMLP]:
    """Two equal float64 stacks of ``members`` random MLPs (tanh between layers)."""
    torch.manual_seed(seed)
    nets = []
    for _ in range(members):
        layers = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(torch.nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(torch.nn.Tanh())
        nets.append(torch.nn.Sequential(*layers).double())
    return StackedMLP(nets), StackedMLP(nets)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000), members=st.integers(1, 3), rows=st.integers(1, 12),
    actions=st.integers(1, 3), discrete=st.booleans(), algo=st.sampled_from(["a2c", "ppo"]),
    value_clip=st.sampled_from(["edge", "inf", "none"]), weigh_entropy=st.booleans(),
)  # fmt: skip
def test_gradients_by_hand_equal_autograd_of_the_loss(
    seed, members, rows, actions, discrete, algo, value_clip, weigh_entropy
):
    """``a2c_gradients`` and ``ppo_gradients`` (module docstring's formulas, then
    StackedMLP.backward) against autograd of ``a2c_loss`` and ``ppo_loss`` on the same networks
    and rows: every weight, bias and log-std gradient and the loss terms, for logits and for
    Gaussian means, with members whose valid rows differ (one may have none), wide and narrow
    hidden layers (10 and 4 units). PPO's rows take the clipped surrogate's branches (ratios
    inside and outside [1 − ε, 1 + ε], ties at ratio 1; float32 ties outside the range: the
    test below) and the value clip's (ε_v one row's |V − V_old| exactly, that row on its edge,
    0 when that row's V = V_old; ε_v = ∞; or None, no member clips). ``entropy_coef`` None
    (no member weighs the entropy) leaves the entropy's gradient out."""
    sizes_actor, sizes_critic = [3, 10, 4, actions], [3, 10, 1]
    assert sizes_actor[2] <= NARROW_MAX < sizes_actor[1]
    actor, actor_ref = _stacks(seed, members, sizes_actor)
    critic, critic_ref = _stacks(seed + 1, members, sizes_critic)
    draw, mask = _rows(seed, members, rows)
    if members > 1:
        mask[-1] = 0.0  # a member without a valid row gets a zero gradient
    obs = draw(members, rows, 3)
    advantages, returns = draw(members, rows), draw(members, rows)
    value_coef, entropy_coef = draw(members).abs(), draw(members).abs()
    if not weigh_entropy:
        entropy_coef = None
    generator = torch.Generator().manual_seed(seed)
    if discrete:
        acts = torch.randint(0, actions, (members, rows), generator=generator)
        log_std = log_std_ref = None
    else:
        acts = draw(members, rows, actions)
        log_std = (0.3 * draw(members, actions)).requires_grad_(True)
        log_std_ref = log_std.detach().clone().requires_grad_(True)

    out = actor_ref(obs)
    values = critic_ref(obs).squeeze(-1)
    log_probs, entropy = log_probs_and_entropy(
        out, acts, None if discrete else log_std_ref[:, None, :]
    )
    if algo == "a2c":
        rest = (Rows(advantages, returns, mask), Coefficients(value_coef, entropy_coef))
        want = a2c_loss(log_probs, entropy, values, *rest)
    else:
        same = torch.rand(members, rows, generator=generator) < 0.3  # ratio 1, value unmoved
        old_log_probs = torch.where(same, log_probs.detach(), log_probs.detach() + 0.4 * draw(
            members, rows))  # fmt: skip
        old_values = torch.where(same, values.detach(), values.detach() + draw(members, rows))
        clip_range = 0.05 + 0.4 * torch.rand(members, generator=generator, dtype=torch.float64)
        # ε_v: one row's |V − V_old| exactly (that row on the clip's edge; 0 for a row with
        # V = V_old, where every other row is clipped), or no clip
        edge = torch.randint(0, rows, (members, 1), generator=generator)
        change = (values.detach() - old_values).abs().gather(1, edge).squeeze(1)
        clip_range_vf = {"edge": change, "inf": torch.full((members,), math.inf), "none": None}[
            value_clip
        ]
        rest = (Rows(advantages, returns, mask, old_log_probs, old_values),
                Coefficients(value_coef, entropy_coef, clip_range, clip_range_vf))  # fmt: skip
        want = ppo_loss(log_probs, entropy, values, *rest)
    want.loss.sum().backward()

    for p in actor.parameters() + critic.parameters() + ([] if discrete else [log_std]):
        p.grad = torch.full_like(p, 7.0)  # written over, never added to
    by_hand = a2c_gradients if algo == "a2c" else ppo_gradients
    got = by_hand(actor, critic, log_std, actor.layers(obs), critic.layers(obs), acts, *rest)
    for name in ("loss", "policy", "value", "entropy", "approx_kl", "clip_fraction"):
        if getattr(want, name) is not None:
            torch.testing.assert_close(getattr(got, name), getattr(want, name).detach())
    pairs = list(zip(actor.parameters() + critic.parameters(),
                     actor_ref.parameters() + critic_ref.parameters(), strict=True))  # fmt: skip
    if not discrete:
        pairs.append((log_std, log_std_ref))
    for ours, reference in pairs:
        torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-9, atol=1e-12)
    if members > 1:
        for ours, _ in pairs:
            assert not ours.grad[-1].any()


@pytest.mark.parametrize("side", [1.0, -1.0])
def test_ppo_gradient_by_hand_splits_float32_ties_as_torch_minimum_does(side, monkeypatch):
    """In float32 a ratio a few ulps outside [1 − ε, 1 + ε] can give r·Â and clip(r)·Â that
    round to one number; ``torch.minimum`` then splits its gradient, and so must κ. The rows'
    ∂loss/∂log π by hand (captured where ``ppo_gradients`` hands them on) against autograd of
    ``ppo_loss`` on leaf log-probs, with ties among them."""
    from gae_core.agent import losses

    rows = 4000
    epsilon = torch.tensor([0.2])
    bound = 1.0 + side * epsilon
    x = torch.log(bound)  # the smallest float32 log-ratio whose exp is beyond the bound
    while not (x.exp() - bound) * side > 0:
        x = torch.nextafter(x, x + side)
    generator = torch.Generator().manual_seed(0)
    log_probs = x.expand(1, rows).clone()
    advantages = torch.randn(1, rows, generator=generator)
    entropy, values = torch.rand(1, rows), torch.randn(1, rows)
    args = (torch.zeros(1, rows), torch.randn(1, rows), advantages, torch.randn(1, rows),
            torch.ones(1, rows), epsilon, torch.tensor([math.inf]), torch.tensor([0.5]),
            torch.tensor([0.0]))  # fmt: skip
    ratio = log_probs.exp()
    ties = ratio * advantages == ratio.clamp(1 - epsilon, 1 + epsilon) * advantages
    assert 0 < int(ties.sum()) < rows  # the case this test is about happened
    captured = {}
    monkeypatch.setattr(losses, "_outputs", lambda *a: (log_probs, entropy, values, []))
    capture = lambda *a, log_prob_grad, **k: captured.update(g=log_prob_grad)  # noqa: E731
    monkeypatch.setattr(losses, "_backward", capture)
    ppo_by_hand(None, None, None, None, None, None, *args)
    leaf = log_probs.clone().requires_grad_(True)
    old, old_v, *rest = args
    ppo(leaf, old, entropy, values, old_v, *rest).loss.sum().backward()
    torch.testing.assert_close(captured["g"], leaf.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    "algo, env_id, members",
    [
        # three members (their critic pass takes StackedMLP.layers' in-place tanh form), one
        # with advantages standardised; budgets that end apart and in a cut rollout
        ("a2c", "CartPole-v1", [
            dict(seed=0, lambda_=0.9, total_steps=130),
            dict(seed=1, lambda_=1.0, total_steps=250, entropy_coef=0.01),
            dict(seed=2, lambda_=0.5, total_steps=250, normalize_advantages=True)]),
        ("a2c", "Pendulum-v1", [dict(seed=0, total_steps=400, normalize_observations=True,
                                     normalize_rewards=True)]),
        # PPO: minibatch epochs (one member stops early on its target KL), a value clip,
        # advantages standardised per minibatch
        ("ppo", "CartPole-v1", [
            dict(seed=0, lambda_=0.9, total_steps=700, n_epochs=3, minibatch_size=64),
            dict(seed=1, lambda_=1.0, total_steps=500, n_epochs=3, minibatch_size=64,
                 clip_range_vf=0.2, entropy_coef=0.01, target_kl=0.0002)]),
        ("ppo", "Pendulum-v1", [dict(seed=0, total_steps=600, n_epochs=3, rollout_steps=128,
                                     minibatch_size=64, normalize_observations=True,
                                     normalize_rewards=True)]),
    ],
)  # fmt: skip
def test_updates_by_hand_equal_autograd_updates_on_the_same_rollouts(
    algo, env_id, members, monkeypatch
):
    """A trainer whose gradient comes by hand (A2C's from the rollout's kept actor activations,
    PPO's from each minibatch's passes) and one by autograd, fed the first's rollouts until
    every member's budget is spent (members ending at different updates, the last rollout cut
    short): after each update their weights, log-std and losses agree (float32 rounding: the
    two sum in different orders)."""
    import dataclasses

    from gae_core.agent.presets import preset_config

    base = dataclasses.replace(preset_config(env_id, algo), use_sde=False, checkpoint_every=0,
                               eval_every=0, record_episodes=0)  # fmt: skip
    configs = [dataclasses.replace(base, **m) for m in members]
    by_hand, autograd = Trainer(configs), Trainer(configs)
    autograd.by_hand = False
    hand_steps = []  # PPO's minibatch steps by hand (the autograd trainer takes none)
    monkeypatch.setattr(update_module, "ppo_gradients",
                        lambda *a: hand_steps.append(1) or ppo_gradients(*a))  # fmt: skip
    stepped = {id(by_hand.learner): [], id(autograd.learner): []}  # each step's members
    gradient_step = update_module.Learner._gradient_step

    def counted_step(learner, *args, **kwargs):
        now = gradient_step(learner, *args, **kwargs)
        stepped[id(learner)].append(np.array(now))
        return now

    monkeypatch.setattr(update_module.Learner, "_gradient_step", counted_step)
    stopped_early = False
    steps_seen = set()
    try:
        while not by_hand.done:
            active = [i for i, m in enumerate(by_hand._members) if m.active]
            for state in by_hand._members:
                state.steps_before_update = state.env_steps
            by_hand.collect(active)
            steps_seen.add(by_hand._batch.rewards.shape[0])
            autograd._batch = by_hand._batch
            autograd.normalizers = by_hand.normalizers
            for mine, theirs in zip(autograd._members, by_hand._members, strict=True):
                mine.steps_before_update, mine.active = theirs.steps_before_update, theirs.active
            if algo == "a2c":  # the kept activations are this rollout's
                assert by_hand._kept_for is by_hand._batch
            for steps in stepped.values():
                steps.clear()
            want = autograd.update(active)
            got = by_hand.update(active)
            # the same members step at every minibatch on both routes (the KL stop included)
            ours, theirs = (np.stack(stepped[id(t.learner)]) for t in (by_hand, autograd))
            assert np.array_equal(ours, theirs)
            counts = ours.sum(0)[active]  # (in a full rollout every member has valid rows
            # in every minibatch, so a member that took fewer steps stopped on its KL)
            full = by_hand._batch.rewards.shape[0] == base.rollout_steps
            stopped_early |= full and bool(counts.min() < counts.max())
            for i in active:
                ours = by_hand.model_of(i).state_dict()
                for name, tensor in autograd.model_of(i).state_dict().items():
                    torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=2e-6,
                                               msg=f"member {i}: {name}")  # fmt: skip
                for metric in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.GRAD_NORM) + (
                    (M.APPROX_KL, M.CLIP_FRACTION) if algo == "ppo" else ()
                ):
                    assert got[i][metric.key] == pytest.approx(want[i][metric.key], rel=1e-4,
                                                               abs=1e-6)  # fmt: skip
            for i in active:  # budgets: as Trainer.step ends them
                if by_hand._members[i].env_steps >= configs[i].total_steps:
                    by_hand._members[i].active = False
        assert steps_seen != {base.rollout_steps}  # a last rollout of its own length too
        assert bool(hand_steps) == (algo == "ppo")
        assert stopped_early == any("target_kl" in m for m in members)
    finally:
        by_hand.close()
        autograd.close()


def test_a_ppo_epoch_of_one_minibatch_takes_the_rows_in_any_order(monkeypatch):
    """Where one minibatch holds every row (CartPole's Zoo row: 8 envs × 32 steps, minibatches
    of 256), the update draws no order and gathers nothing, because each member's loss is a
    mean over its rows: fed the same rollout with its rows permuted (each member its own
    permutation), two trainers end every update at the same weights (to float32 rounding),
    member by member, with advantages standardised and a value clip."""
    import dataclasses

    from gae_core.agent.presets import preset_config

    base = dataclasses.replace(preset_config("CartPole-v1", "ppo"), n_epochs=4, checkpoint_every=0,
                               eval_every=0, record_episodes=0, clip_range_vf=0.2)  # fmt: skip
    assert base.minibatch_size == base.rollout_steps * base.num_envs
    configs = [dataclasses.replace(base, seed=s, total_steps=10**6) for s in range(2)]
    ordered, permuted = Trainer(configs), Trainer(configs)
    gathered = []
    from gae_core.agent import losses as losses_module

    for module in (update_module, losses_module):  # the inputs' gather and the rows'
        monkeypatch.setattr(module, "take_rows", lambda *a: gathered.append(1))
    generator = torch.Generator().manual_seed(0)
    learn = permuted.learner.learn

    def learn_permuted(batch, *args, **kwargs):
        members, rows = batch.mask.shape
        order = torch.stack([torch.randperm(rows, generator=generator) for _ in range(members)])
        assert not torch.equal(order[0], torch.arange(rows))
        batch = update_module.Batch(*(
            x.gather(1, order if x.dim() == 2 else order[..., None].expand_as(x))
            for x in (batch.observations, batch.actions, batch.advantages, batch.returns,
                      batch.values, batch.mask)
        ))  # fmt: skip
        return learn(batch, *args, **kwargs)

    permuted.learner.learn = learn_permuted
    try:
        for _ in range(3):
            active = [0, 1]
            for state in ordered._members:
                state.steps_before_update = state.env_steps
            ordered.collect(active)
            permuted._batch, permuted.normalizers = ordered._batch, ordered.normalizers
            for mine, theirs in zip(permuted._members, ordered._members, strict=True):
                mine.steps_before_update = theirs.steps_before_update
            want, got = ordered.update(active), permuted.update(active)
            for i in active:
                ours = permuted.model_of(i).state_dict()
                for name, tensor in ordered.model_of(i).state_dict().items():
                    torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=2e-6,
                                               msg=f"member {i}: {name}")  # fmt: skip
                assert got[i][M.POLICY_LOSS.key] == pytest.approx(want[i][M.POLICY_LOSS.key],
                                                                  rel=1e-4, abs=1e-6)  # fmt: skip
        assert not gathered
    finally:
        ordered.close()
        permuted.close()


def test_gradient_buffers_made_in_inference_mode_stay_usable_outside_it():
    """The update's gradients by hand run in inference mode; a ``.grad`` they create there is
    a normal tensor: zeroed in place and accumulated into by autograd outside the mode."""
    actor, _ = _stacks(0, 2, [3, 10, 4, 2])
    critic, _ = _stacks(1, 2, [3, 10, 1])
    draw, mask = _rows(0, 2, 6)
    log_std = (0.1 * draw(2, 2)).requires_grad_(True)
    obs, actions = draw(2, 6, 3), draw(2, 6, 2)
    with torch.inference_mode():
        rows = Rows(draw(2, 6), draw(2, 6), mask)
        a2c_gradients(actor, critic, log_std, actor.layers(obs), critic.layers(obs), actions,
                      rows, Coefficients(draw(2).abs(), None))  # fmt: skip
    params = [*actor.parameters(), *critic.parameters(), log_std]
    assert all(p.grad is not None and not p.grad.is_inference() for p in params)
    for p in params:
        p.grad.zero_()
    (actor(obs).sum() + critic(obs).sum() + log_std.sum()).backward()
    assert all(bool(p.grad.abs().sum() > 0) for p in params)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    members=st.integers(1, 4),
    rows=st.integers(1, 12),
    spread=st.sampled_from([0.0, 1e-3, 1.0, 100.0]),
)
def test_masked_moments_and_explained_variance_are_their_formulas_per_member(
    seed, members, rows, spread
):
    """Each member's mean and variance over its valid rows, and 1 − Var(G − V) / Var(G),
    equal NumPy's on those rows alone; 0 for a member without a valid row (its mean) or
    whose returns do not vary (its explained variance)."""
    rng = np.random.default_rng(seed)
    returns = (spread * rng.standard_normal((members, rows))).astype(np.float32)
    values = returns + rng.standard_normal((members, rows)).astype(np.float32)
    mask = (rng.random((members, rows)) < 0.7).astype(np.float32)
    mean, var = masked_moments(returns, mask)
    explained = explained_variance(values, returns, mask)
    assert mean.dtype == var.dtype == explained.dtype == np.float64
    for m in range(members):
        kept = mask[m] == 1
        if not kept.any():
            assert mean[m] == var[m] == explained[m] == 0.0
            continue
        g, v = returns[m, kept].astype(np.float64), values[m, kept].astype(np.float64)
        np.testing.assert_allclose(mean[m], g.mean(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(var[m], g.var(), rtol=1e-9, atol=1e-12)
        expected = 1.0 - (g - v).var() / g.var() if g.var() > 0 else 0.0
        np.testing.assert_allclose(explained[m], expected, rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), members=st.integers(1, 4), keys=st.integers(1, 4))
def test_an_updates_metric_is_each_members_mean_over_the_steps_it_took(seed, members, keys):
    """``_Sums``: a key's value for a member is the mean of what was added for it over the
    steps where its ``rows`` was true (tensors of either float dtype and NumPy arrays mixed);
    a member with no such step has no value for that key."""
    rng = np.random.default_rng(seed)
    sums, added = update_module._Sums(members), {}
    for k in range(keys):
        for _ in range(int(rng.integers(1, 5))):
            value = rng.standard_normal(members)
            rows = rng.random(members) < 0.6
            kind = int(rng.integers(3))
            stored = (torch.tensor(value, dtype=torch.float32) if kind == 0
                      else torch.tensor(value) if kind == 1 else value)  # fmt: skip
            sums.add(f"key{k}", stored, rows)
            exact = np.float32(value).astype(np.float64) if kind == 0 else value
            added.setdefault(f"key{k}", []).append((exact, rows))
    means = sums.means()
    for m in range(members):
        for key, entries in added.items():
            taken = [value[m] for value, rows in entries if rows[m]]
            if taken:
                np.testing.assert_allclose(means[m][key], np.mean(taken), rtol=1e-12)
            else:
                assert key not in means[m]
