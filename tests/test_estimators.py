"""Estimators against hand-derived fixtures, plain reference loops, closed forms and identities.

Every formula in ``gae_core.estimators``' docstrings is evaluated here: δ_t, the GAE recursion
and its finite eq.-16 form, Â^(k), λ-returns, discounted returns, the λ sweep and the weights.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gae_core
from gae_core.estimators import _numpy_loop, _torch_scan
from gae_core.estimators._numpy_loop import LOOP_MAX_STEPS

# ----------------------------------------------------------------------------- references
# Written from docs/DESIGN.md's definitions, one step and one environment at a time.


def segment_end(done, t, n):
    """Index of the last row of t's segment: the first done step at or after t, or T−1."""
    j = t
    while j < len(done) - 1 and not done[j, n]:
        j += 1
    return j


def ref_deltas(r, v, nv, term, gamma):
    out = np.zeros(r.shape)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            out[t, n] = r[t, n] + gamma * (0.0 if term[t, n] else nv[t, n]) - v[t, n]
    return out


def ref_gae(r, v, nv, term, trunc, gamma, lambda_):
    deltas = ref_deltas(r, v, nv, term, gamma)
    done = term | trunc
    out = np.zeros(r.shape)
    for n in range(r.shape[1]):
        carry = 0.0
        for t in reversed(range(r.shape[0])):
            carry = deltas[t, n] + gamma * lambda_ * (0.0 if done[t, n] else carry)
            out[t, n] = carry
    return out


def ref_k_step(r, v, nv, term, trunc, gamma, k):
    """Â^(k)_t = Σ_{l<k} γ^l δ_{t+l}, stopping after the first done step or row T−1."""
    deltas = ref_deltas(r, v, nv, term, gamma)
    done = term | trunc
    out = np.zeros(r.shape)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            last = min(segment_end(done, t, n), t + k - 1)
            out[t, n] = sum(gamma ** (j - t) * deltas[j, n] for j in range(t, last + 1))
    return out


def ref_returns(r, nv, term, trunc, gamma):
    """Σ_{l<L} γ^l r_{t+l} + γ^L (1 − terminated at the segment end) V(s_{t+L})."""
    done = term | trunc
    out = np.zeros(r.shape)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            end = segment_end(done, t, n)
            total = sum(gamma ** (j - t) * r[j, n] for j in range(t, end + 1))
            if not term[end, n]:
                total += gamma ** (end - t + 1) * nv[end, n]
            out[t, n] = total
    return out


# ----------------------------------------------------------------------------- data


def rollout(rng, steps, envs, p_term=0.1, p_trunc=0.1, dtype=np.float64, consistent=True):
    """Random rollout; with ``consistent`` next_values[t] == values[t+1] inside each segment,
    as a real critic gives (the identities that telescope need it)."""
    rewards = rng.standard_normal((steps, envs)).astype(dtype)
    values = rng.standard_normal((steps, envs)).astype(dtype)
    terminated = rng.random((steps, envs)) < p_term
    truncated = rng.random((steps, envs)) < p_trunc
    next_values = rng.standard_normal((steps, envs)).astype(dtype)  # V(final obs) at cuts
    if consistent:
        inside = ~(terminated | truncated)
        inside[-1] = False
        next_values[:-1][inside[:-1]] = values[1:][inside[:-1]]
    return rewards, values, next_values, terminated, truncated


rollouts = st.builds(
    lambda seed, steps, envs, p_term, p_trunc: rollout(
        np.random.default_rng(seed), steps, envs, p_term, p_trunc
    ),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(1, 40),
    envs=st.integers(1, 4),
    p_term=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    p_trunc=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
)
unit = st.floats(0.0, 1.0)


# ----------------------------------------------------------------------------- hand fixtures


def test_hand_fixture_terminated_truncated_and_rollout_end():
    # One env, γ = 0.5, λ = 0.5, rewards 1, V(s) = 0 everywhere except V(final obs at t=1) = 4.
    # t=0 plain, t=1 truncated (bootstrap 4), t=2 terminated, t=3 end of rollout (next value 2).
    r = np.array([1.0, 1.0, 1.0, 1.0])
    v = np.zeros(4)
    nv = np.array([0.0, 4.0, 0.0, 2.0])
    term = np.array([False, False, True, False])
    trunc = np.array([False, True, False, False])
    # δ = r + γ(1−term)V' − V = [1, 1 + 0.5·4, 1, 1 + 0.5·2] = [1, 3, 1, 2]
    np.testing.assert_allclose(gae_core.td_residuals(r, v, nv, term, gamma=0.5), [1, 3, 1, 2])
    # GAE: t=3: 2; t=2: 1 (done); t=1: 3 (done, no crossing); t=0: 1 + 0.25·3 = 1.75
    np.testing.assert_allclose(
        gae_core.gae(r, v, nv, term, trunc, gamma=0.5, lambda_=0.5), [1.75, 3, 1, 2]
    )
    # returns: t=3: 1 + 0.5·2 = 2; t=2: 1; t=1: 1 + 0.5·4 = 3; t=0: 1 + 0.5·3 = 2.5
    np.testing.assert_allclose(
        gae_core.discounted_returns(r, nv, term, trunc, gamma=0.5), [2.5, 3, 1, 2]
    )
    # Â^(2): t=0: δ0 + 0.5·δ1 = 2.5; t=1..3 stop at their own done/end: 3, 1, 2
    np.testing.assert_allclose(
        gae_core.k_step_advantages(r, v, nv, term, trunc, gamma=0.5, k=2), [2.5, 3, 1, 2]
    )


def test_hand_fixture_two_envs_time_major():
    # Two envs side by side, γ = 1, λ = 1, V = 0: GAE is the plain sum of rewards to the
    # segment end. env 0: rewards 1,2,3, no dones → 6, 5, 3. env 1: rewards 1,1,1, terminated
    # at t=0 → 1 | 2, 1.
    r = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    zeros = np.zeros((3, 2))
    term = np.array([[False, True], [False, False], [False, False]])
    trunc = np.zeros((3, 2), bool)
    out = gae_core.gae(r, zeros, zeros, term, trunc, gamma=1.0, lambda_=1.0)
    np.testing.assert_allclose(out, [[6, 1], [5, 2], [3, 1]])


def test_estimator_weights_hand_values():
    # λ = 0.5, H = 4: (1−λ)λ^0, (1−λ)λ^1, (1−λ)λ^2, then the tail λ^3 = [0.5, 0.25, 0.125, 0.125]
    np.testing.assert_allclose(gae_core.estimator_weights(0.5, 4), [0.5, 0.25, 0.125, 0.125])
    np.testing.assert_allclose(gae_core.estimator_weights(0.0, 3), [1, 0, 0])  # 0^0 = 1
    np.testing.assert_allclose(gae_core.estimator_weights(1.0, 3), [0, 0, 1])
    np.testing.assert_allclose(gae_core.estimator_weights(0.3, 1), [1])


# ----------------------------------------------------------------------------- vs references


@settings(max_examples=150, deadline=None)
@given(batch=rollouts, gamma=unit, lambda_=unit)
def test_vectorised_matches_reference_loops(batch, gamma, lambda_):
    r, v, nv, term, trunc = rollout_inconsistent = batch
    del rollout_inconsistent
    np.testing.assert_allclose(
        gae_core.td_residuals(r, v, nv, term, gamma=gamma), ref_deltas(r, v, nv, term, gamma),
        rtol=1e-12, atol=1e-12,
    )  # fmt: skip
    np.testing.assert_allclose(
        gae_core.gae(r, v, nv, term, trunc, gamma=gamma, lambda_=lambda_),
        ref_gae(r, v, nv, term, trunc, gamma, lambda_), rtol=1e-10, atol=1e-10,
    )  # fmt: skip
    np.testing.assert_allclose(
        gae_core.discounted_returns(r, nv, term, trunc, gamma=gamma),
        ref_returns(r, nv, term, trunc, gamma), rtol=1e-10, atol=1e-10,
    )  # fmt: skip
    ks = [1, 2, 3, 7, 50]
    stacked = gae_core.k_step_advantages(r, v, nv, term, trunc, gamma=gamma, k=ks)
    assert stacked.shape == (len(ks), *r.shape)
    for i, k in enumerate(ks):
        np.testing.assert_allclose(
            stacked[i], ref_k_step(r, v, nv, term, trunc, gamma, k), rtol=1e-10, atol=1e-10
        )


@settings(max_examples=60, deadline=None)
@given(batch=rollouts, gamma=unit, lambdas=st.lists(unit, min_size=1, max_size=6))
def test_lambda_sweep_equals_one_gae_per_lambda(batch, gamma, lambdas):
    sweep = gae_core.gae_lambda_sweep(*batch, gamma=gamma, lambdas=lambdas)
    assert sweep.shape == (len(lambdas), *batch[0].shape)
    for i, lambda_ in enumerate(lambdas):
        np.testing.assert_allclose(
            sweep[i], gae_core.gae(*batch, gamma=gamma, lambda_=lambda_), rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_column_kernels_agree_across_chunks_and_four_step_links(dtype):
    """The one-column kernels work in chunks of ``CHUNK`` steps, four steps per link of the
    chain (x_k = D + C x_{k+4}, ``_kernels._chain``): every length around those edges, with a
    done at every position of a link, against the one-step reference loop, for GAE and the
    λ-returns; the sweep equals one ``gae`` per λ bit for bit."""
    from gae_core.estimators._kernels import CHUNK

    rng = np.random.default_rng(7)
    lengths = [1, 2, 3, 4, 5, 7, 8, 9, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK + 5, 2 * CHUNK + 3]
    for steps in lengths:
        for p_done in (0.0, 0.3):  # no done at all: the chain runs the whole column
            r, v, nv, term, trunc = rollout(rng, steps, 1, p_done / 2, p_done / 2, dtype=dtype)
            for gamma, lambda_ in ((0.99, 0.95), (1.0, 1.0), (0.9, 0.0)):
                got = gae_core.gae(r, v, nv, term, trunc, gamma=gamma, lambda_=lambda_)
                want = ref_gae(r, v, nv, term, trunc, gamma, lambda_)
                tol = 1e-5 if dtype == np.float32 else 1e-12
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
                returns = gae_core.lambda_returns(
                    r, v, nv, term, trunc, gamma=gamma, lambda_=lambda_
                )  # its own chain, G_t = δ_t + V(s_t) − c_t V(s_{t+1}) + c_t G_{t+1}
                want = want + v
                np.testing.assert_allclose(returns, want, rtol=tol, atol=tol * np.abs(want).max())
            lambdas = [0.0, 0.5, 0.95, 1.0]
            sweep = gae_core.gae_lambda_sweep(r, v, nv, term, trunc, gamma=0.99, lambdas=lambdas)
            for i, lambda_ in enumerate(lambdas):
                one = gae_core.gae(r, v, nv, term, trunc, gamma=0.99, lambda_=lambda_)
                np.testing.assert_array_equal(sweep[i], one)


@pytest.mark.parametrize("columns", [1, 3])
def test_one_non_finite_input_anywhere_is_named(columns):
    """The kernels learn of a NaN or inf from the chains' values at t = 0 (``_finite``): one
    bad element at any step (first, last, a chunk's edge), under a done, with γ or λ zero,
    still makes gae, lambda_returns and the sweep raise naming its array."""
    from gae_core.estimators._kernels import CHUNK

    steps = CHUNK + 10
    names = ["rewards", "values", "next_values"]
    for position in (0, 1, CHUNK + 9 - CHUNK // 2, 9, 10, steps - 1):
        for index, name in enumerate(names):
            for bad in (np.nan, np.inf, -np.inf):
                batch = list(rollout(np.random.default_rng(position), steps, columns))
                batch[index] = batch[index].copy()
                batch[index][position, columns - 1] = bad
                batch[3][position, :] = True  # terminated there: γ(1 − terminated) is 0
                for gamma, lambda_ in ((0.0, 0.0), (0.99, 1.0)):
                    for fn, params in (
                        (gae_core.gae, {"lambda_": lambda_}),
                        (gae_core.lambda_returns, {"lambda_": lambda_}),
                        (gae_core.gae_lambda_sweep, {"lambdas": [lambda_]}),
                    ):
                        with pytest.raises(ValueError, match=f"^{name} must be finite"):
                            fn(*batch, gamma=gamma, **params)


def test_finite_inputs_that_overflow_give_inf_not_an_error():
    r, v, nv, term, trunc = rollout(np.random.default_rng(9), 50, 1)
    r[20, 0], nv[20, 0], term[20, 0] = 1e308, 1e308, False
    out = gae_core.gae(r, v, nv, term, trunc, gamma=1.0, lambda_=1.0)
    assert np.isposinf(out[20, 0])


def test_lambda_returns_of_many_columns_equal_gae_plus_values_bit_for_bit():
    for dtype in (np.float32, np.float64):
        batch = rollout(np.random.default_rng(8), 300, 5, dtype=dtype)
        got = gae_core.lambda_returns(*batch, gamma=0.97, lambda_=[0.1, 0.5, 0.9, 0.95, 1.0])
        advantages = gae_core.gae(*batch, gamma=0.97, lambda_=[0.1, 0.5, 0.9, 0.95, 1.0])
        np.testing.assert_array_equal(got, advantages + batch[1])


# ----------------------------------------------------------------------------- identities


@settings(max_examples=100, deadline=None)
@given(batch=rollouts, gamma=unit)
def test_identities(batch, gamma):
    r, v, nv, term, trunc = batch
    deltas = gae_core.td_residuals(r, v, nv, term, gamma=gamma)
    # GAE(λ=0) = δ
    np.testing.assert_allclose(gae_core.gae(*batch, gamma=gamma, lambda_=0.0), deltas, atol=1e-12)
    # GAE(λ=1) = discounted return to the segment end plus bootstrap, minus V
    returns = gae_core.discounted_returns(r, nv, term, trunc, gamma=gamma)
    np.testing.assert_allclose(
        gae_core.gae(*batch, gamma=gamma, lambda_=1.0), returns - v, rtol=1e-9, atol=1e-9
    )
    # Â^(1) = δ ; Â^(k) for k ≥ segment length (T covers every segment) = GAE(λ=1)
    np.testing.assert_allclose(
        gae_core.k_step_advantages(*batch, gamma=gamma, k=1), deltas, atol=1e-12
    )
    steps = r.shape[0]
    np.testing.assert_allclose(
        gae_core.k_step_advantages(*batch, gamma=gamma, k=steps),
        gae_core.gae(*batch, gamma=gamma, lambda_=1.0), rtol=1e-9, atol=1e-9,
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(batch=rollouts, gamma=unit, lambda_=unit)
def test_lambda_returns_and_k_step_telescoping(batch, gamma, lambda_):
    r, v, _, term, trunc = batch
    advantages = gae_core.gae(*batch, gamma=gamma, lambda_=lambda_)
    np.testing.assert_allclose(
        gae_core.lambda_returns(*batch, gamma=gamma, lambda_=lambda_), advantages + v, atol=1e-12
    )
    # Inside a segment Â^(k) telescopes: −V(s_t) + Σ_{l<k} γ^l r_{t+l} + γ^k V(s_{t+k})
    done = term | trunc
    k = 3
    a3 = gae_core.k_step_advantages(*batch, gamma=gamma, k=k)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            if segment_end(done, t, n) >= t + k:  # the k steps stay inside the segment
                expected = -v[t, n] + sum(gamma**i * r[t + i, n] for i in range(k))
                expected += gamma**k * v[t + k, n]
                assert a3[t, n] == pytest.approx(expected, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(batch=rollouts, gamma=unit, lambda_=unit)
def test_finite_form_of_equation_16(batch, gamma, lambda_):
    """GAE_t = (1−λ)Σ_{k=1}^{L_t−1} λ^{k−1} Â^(k)_t + λ^{L_t−1} Â^(L_t)_t, L_t = steps left."""
    r, _, _, term, trunc = batch
    steps, envs = r.shape
    done = term | trunc
    advantages = gae_core.gae(*batch, gamma=gamma, lambda_=lambda_)
    table = gae_core.k_step_advantages(*batch, gamma=gamma, k=list(range(1, steps + 1)))
    for t in range(steps):
        for n in range(envs):
            horizon = segment_end(done, t, n) - t + 1  # L_t
            weights = gae_core.estimator_weights(lambda_, horizon)
            assert weights.sum() == pytest.approx(1.0)
            combined = float(weights @ table[:horizon, t, n])
            assert advantages[t, n] == pytest.approx(combined, rel=1e-9, abs=1e-9)


@given(lambda_=unit, horizon=st.integers(1, 500))
def test_estimator_weights_sum_to_one_and_match_formula(lambda_, horizon):
    weights = gae_core.estimator_weights(lambda_, horizon)
    assert weights.shape == (horizon,)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert (weights >= 0).all()
    k = np.arange(1, horizon)
    np.testing.assert_allclose(weights[:-1], (1 - lambda_) * lambda_ ** (k - 1.0), atol=1e-15)
    assert weights[-1] == pytest.approx(lambda_ ** (horizon - 1.0) if horizon > 1 else 1.0)


# ----------------------------------------------------------------------------- time limits


def test_time_limit_bootstrap_recovers_infinite_horizon_values():
    """Reward 1 per step forever, cut by a time limit every 20 steps. The true value of every
    state is 1/(1−γ); with those values the λ-returns must equal them exactly for every λ when
    truncation bootstraps, and fall visibly short when truncation is treated as termination."""
    gamma, steps, limit, envs = 0.9, 100, 20, 3
    true_value = 1.0 / (1.0 - gamma)  # Σ γ^l = 10
    rewards = np.ones((steps, envs))
    values = np.full((steps, envs), true_value)
    next_values = np.full((steps, envs), true_value)
    truncated = np.zeros((steps, envs), bool)
    truncated[limit - 1 :: limit] = True
    terminated = np.zeros((steps, envs), bool)
    for lambda_ in (0.0, 0.5, 0.95, 1.0):
        right = gae_core.lambda_returns(
            rewards, values, next_values, terminated, truncated, gamma=gamma, lambda_=lambda_
        )
        np.testing.assert_allclose(right, true_value, rtol=1e-12)
        # The classic bug: the time limit passed as termination.
        wrong = gae_core.lambda_returns(
            rewards, values, next_values, truncated, truncated, gamma=gamma, lambda_=lambda_
        )
        # At the last step of each episode the target collapses to r = 1 instead of 10.
        np.testing.assert_allclose(wrong[limit - 1 :: limit], 1.0)
        assert (true_value - wrong).max() == pytest.approx(true_value - 1.0)
    # λ = 1 on the wrong path gives the truncated geometric sum (1 − γ^L)/(1 − γ), L = steps left
    wrong_mc = gae_core.discounted_returns(rewards, next_values, truncated, truncated, gamma=gamma)
    left = limit - (np.arange(steps) % limit)
    np.testing.assert_allclose(wrong_mc[:, 0], (1 - gamma**left) / (1 - gamma), rtol=1e-12)


# ----------------------------------------------------------------------------- backends, dtypes


def as_tensors(batch):
    return [torch.from_numpy(np.ascontiguousarray(x)) for x in batch]


@settings(max_examples=40, deadline=None)
@given(batch=rollouts, gamma=unit, lambda_=unit)
def test_numpy_torch_and_accelerator_path_agree(batch, gamma, lambda_):
    tensors = as_tensors(batch)
    r, v, nv, term, trunc = tensors
    cases = {
        "gae": (
            gae_core.gae(*batch, gamma=gamma, lambda_=lambda_),
            gae_core.gae(*tensors, gamma=gamma, lambda_=lambda_),
            _torch_scan.gae(*tensors, gamma=gamma, lambda_=lambda_),
        ),
        "td": (
            gae_core.td_residuals(*batch[:4], gamma=gamma),
            gae_core.td_residuals(r, v, nv, term, gamma=gamma),
            _torch_scan.td_residuals(r, v, nv, term, gamma=gamma),
        ),
        "returns": (
            gae_core.discounted_returns(batch[0], batch[2], batch[3], batch[4], gamma=gamma),
            gae_core.discounted_returns(r, nv, term, trunc, gamma=gamma),
            _torch_scan.discounted_returns(r, nv, term, trunc, gamma=gamma),
        ),
        "sweep": (
            gae_core.gae_lambda_sweep(*batch, gamma=gamma, lambdas=[0.0, lambda_, 1.0]),
            gae_core.gae_lambda_sweep(*tensors, gamma=gamma, lambdas=[0.0, lambda_, 1.0]),
            _torch_scan.gae_lambda_sweep(*tensors, gamma=gamma, lambdas=[0.0, lambda_, 1.0]),
        ),
        "k_step": (
            gae_core.k_step_advantages(*batch, gamma=gamma, k=[4, 1, 60]),
            gae_core.k_step_advantages(*tensors, gamma=gamma, k=[4, 1, 60]),
            _torch_scan.k_step_advantages(*tensors, gamma=gamma, ks=[4, 1, 60]),
        ),
    }
    for name, (numpy_out, torch_out, scan_out) in cases.items():
        assert isinstance(numpy_out, np.ndarray), name
        assert isinstance(torch_out, torch.Tensor) and torch_out.dtype == torch.float64, name
        np.testing.assert_allclose(torch_out.numpy(), numpy_out, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(scan_out.numpy(), numpy_out, rtol=1e-9, atol=1e-9)


@given(batch=rollouts, data=st.data())
def test_one_gamma_and_lambda_per_column_equal_one_call_per_column(batch, data):
    """γ and λ given one per column (a population of agents in one call) give, column by
    column, exactly what a call for that column alone gives: kernels, torch, and the
    reference loops."""
    columns = batch[0].shape[1]
    gammas = data.draw(st.lists(unit, min_size=columns, max_size=columns))
    lambdas = data.draw(st.lists(unit, min_size=columns, max_size=columns))
    tensors = as_tensors(batch)
    for inputs, convert in ((batch, np.asarray), (tensors, lambda x: x.numpy())):
        advantages = convert(gae_core.gae(*inputs, gamma=gammas, lambda_=lambdas))
        deltas = convert(gae_core.td_residuals(*inputs[:4], gamma=np.array(gammas)))
        targets = convert(gae_core.lambda_returns(*inputs, gamma=gammas, lambda_=lambdas))
        for n in range(columns):
            one = [x[:, n] for x in batch]
            alone = gae_core.gae(*one, gamma=gammas[n], lambda_=lambdas[n])
            np.testing.assert_allclose(advantages[:, n], alone, rtol=1e-12, atol=1e-12)
            reference = ref_gae(*[x[:, n : n + 1] for x in batch], gammas[n], lambdas[n])
            np.testing.assert_allclose(advantages[:, n], reference[:, 0], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(
                deltas[:, n], gae_core.td_residuals(*one[:4], gamma=gammas[n]), rtol=1e-12
            )
            np.testing.assert_allclose(targets[:, n], alone + one[1], rtol=1e-12, atol=1e-12)


def test_per_column_parameters_keep_float32_and_work_on_one_dim_data():
    r, v, nv, term, trunc = rollout(np.random.default_rng(3), 9, 3, dtype=np.float32)
    for inputs in ((r, v, nv, term, trunc), as_tensors((r, v, nv, term, trunc))):
        out = gae_core.gae(*inputs, gamma=[0.9, 0.99, 1.0], lambda_=torch.tensor([0.0, 0.5, 1]))
        assert out.dtype in (np.float32, torch.float32)
    one = [x[:, 0] for x in (r, v, nv, term, trunc)]
    np.testing.assert_allclose(
        gae_core.gae(*one, gamma=[0.9], lambda_=[0.5]),
        gae_core.gae(*one, gamma=0.9, lambda_=0.5),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": [0.9, 0.9, 0.9]}, "gamma has 3 values but the data has 2 column(s)"),
        ({"lambda_": [0.5]}, "lambda_ has 1 values but the data has 2 column(s)"),
        ({"lambda_": [0.5, 1.5]}, "lambda_ must be in [0, 1], got 1.5 at index 1"),
        ({"gamma": [0.5, float("nan")]}, "gamma must be in [0, 1], got nan at index 1"),
        ({"gamma": [[0.5, 0.5]]}, "gamma must be a real number in [0, 1] or a non-empty 1-D"),
        ({"gamma": []}, "gamma must be a real number in [0, 1] or a non-empty 1-D"),
        ({"lambda_": ["a", "b"]}, "lambda_ must be a real number in [0, 1] or a non-empty 1-D"),
        ({"lambda_": {0.5, 0.6}}, "lambda_ must be a real number in [0, 1] or one per column"),
    ],
)
def test_per_column_parameters_bad_input(kwargs, message):
    params = {"gamma": 0.9, "lambda_": 0.9, **kwargs}
    for inputs in (good(), as_tensors(good())):
        with pytest.raises(ValueError, match=_escape(message)):
            gae_core.gae(*inputs, **params)


def test_large_cpu_tensors_take_the_compiled_kernels_and_agree():
    steps = gae_core.estimators.TORCH_CPU_MAX_ELEMENTS + 7  # one env: just over the threshold
    batch = rollout(np.random.default_rng(9), steps, 1)
    tensors = as_tensors(batch)
    expected = gae_core.gae(*batch, gamma=0.99, lambda_=0.95)
    got = gae_core.gae(*tensors, gamma=0.99, lambda_=0.95)
    assert isinstance(got, torch.Tensor) and got.shape == (steps, 1)
    np.testing.assert_array_equal(got.numpy(), expected)  # same kernel, bit for bit
    scan = _torch_scan.gae(*tensors, gamma=0.99, lambda_=0.95)
    np.testing.assert_allclose(scan.numpy(), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.slow
def test_small_torch_batches_do_not_load_numba():
    """A training process (torch rollouts) never pays numba's ~125 MB; numpy callers do."""
    code = (
        "import sys, torch, gae_core; z = torch.zeros(64, 16); f = torch.zeros(64, 16, "
        "dtype=torch.bool); gae_core.gae(z, z, z, f, f, gamma=0.9, lambda_=0.9); "
        "print('numba' in sys.modules); gae_core.gae(z.numpy(), z.numpy(), z.numpy(), "
        "f.numpy(), f.numpy(), gamma=0.9, lambda_=0.9); print('numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("steps", [1, 2, LOOP_MAX_STEPS, LOOP_MAX_STEPS + 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_cpu_tensors_take_the_numpy_loop_and_agree(steps, dtype, monkeypatch):
    """CPU tensors of at most LOOP_MAX_STEPS rows run gae as a NumPy loop (float64
    accumulation, the caller's dtype out), longer ones the torch scan; both equal the compiled
    kernels, with one γ and λ or one per column."""
    calls = []
    loop = _numpy_loop.gae
    monkeypatch.setattr(_numpy_loop, "gae", lambda *a, **k: calls.append(1) or loop(*a, **k))
    batch = [x.astype(dtype) if x.dtype.kind == "f" else x
             for x in rollout(np.random.default_rng(steps), steps, 3, 0.2, 0.1)]  # fmt: skip
    for gamma, lambda_ in ((0.99, 0.95), ([0.9, 0.99, 1.0], [0.0, 0.5, 0.97])):
        expected = gae_core.gae(*batch, gamma=gamma, lambda_=lambda_)
        got = gae_core.gae(*as_tensors(batch), gamma=gamma, lambda_=lambda_)
        assert got.dtype == (torch.float32 if dtype == np.float32 else torch.float64)
        tolerance = 1e-6 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got.numpy(), expected, rtol=tolerance, atol=tolerance)
    assert len(calls) == (2 if steps <= LOOP_MAX_STEPS else 0)


@settings(max_examples=40, deadline=None)
@given(batch=rollouts, data=st.data(), dtype=st.sampled_from([np.float32, np.float64]))
def test_gae_unchecked_equals_gae_checked_on_a_trainers_rollout(batch, data, dtype):
    """``validate=False`` on what a trainer passes (2-D CPU tensors of one float dtype, bool
    flags, one float64 γ and λ a column) gives exactly the checked result, dtype included;
    the short-rollout loop runs whenever the rollout is short enough."""
    columns = batch[0].shape[1]
    gamma = np.array(data.draw(st.lists(unit, min_size=columns, max_size=columns)))
    lambda_ = np.array(data.draw(st.lists(unit, min_size=columns, max_size=columns)))
    tensors = as_tensors([x.astype(dtype) if x.dtype.kind == "f" else x for x in batch])
    checked = gae_core.gae(*tensors, gamma=gamma, lambda_=lambda_)
    unchecked = gae_core.gae(*tensors, gamma=gamma, lambda_=lambda_, validate=False)
    assert unchecked.dtype == checked.dtype == tensors[0].dtype
    np.testing.assert_array_equal(unchecked.numpy(), checked.numpy())


def test_gae_unchecked_skips_the_checks_on_a_trainers_rollout(monkeypatch):
    """On the trainer's rollout ``validate=False`` runs no check (none of ``prepare``, nor the
    parameter checks), and a non-finite reward gives non-finite advantages where the checked
    call names it."""
    from gae_core.estimators import advantages as module

    tensors = as_tensors(rollout(np.random.default_rng(4), 5, 3, dtype=np.float32))
    tensors[0][2, 1] = float("nan")
    with pytest.raises(ValueError, match="rewards must be finite"):
        gae_core.gae(*tensors, gamma=0.99, lambda_=0.95)

    def no_check(*args, **kwargs):
        raise AssertionError("checked")

    for name in ("prepare", "check_unit_columns", "column_parameter"):
        monkeypatch.setattr(module, name, no_check)
    out = gae_core.gae(*tensors, gamma=np.full(3, 0.99), lambda_=np.full(3, 0.95), validate=False)
    assert np.isnan(out[:3, 1].numpy()).all() and np.isfinite(out[:, [0, 2]].numpy()).all()


def _float_flags(b):
    tensors = as_tensors(b)
    return [*tensors[:3], *(x.to(torch.float32) for x in tensors[3:])]


def _mixed_floats(b):
    tensors = as_tensors(b)
    return [tensors[0].float(), *tensors[1:]]


def _with_graph(b):
    tensors = as_tensors(b)
    return [tensors[0], tensors[1].requires_grad_(True), *tensors[2:]]


@pytest.mark.parametrize(
    "inputs",
    [
        lambda b: b,  # NumPy arrays
        lambda b: [x[:, 0] for x in as_tensors(b)],  # 1-D tensors
        lambda b: as_tensors([np.concatenate([x] * 6) for x in b]),  # longer than the loop's
        _float_flags,  # 0/1 float flags
        _mixed_floats,  # float32 rewards, float64 values
        _with_graph,  # values that carry a graph
    ],
)
def test_gae_unchecked_checks_anything_but_a_trainers_short_rollout(inputs):
    """``validate=False`` skips the checks only on the trainer's short 2-D CPU tensors of one
    float dtype, bool flags and no graph: any other input is checked all the same (a γ out of
    range is still named) and gives the checked result, dtype included."""
    batch = inputs(good())
    with pytest.raises(ValueError, match=_escape("gamma must be in [0, 1], got 1.5")):
        gae_core.gae(*batch, gamma=1.5, lambda_=0.9, validate=False)
    unchecked = gae_core.gae(*batch, gamma=0.9, lambda_=0.8, validate=False)
    checked = gae_core.gae(*batch, gamma=0.9, lambda_=0.8)
    assert unchecked.dtype == checked.dtype
    np.testing.assert_array_equal(np.asarray(unchecked), np.asarray(checked))


@pytest.mark.parametrize("steps", [0, 3])
def test_the_numpy_loop_takes_one_dim_and_empty_rollouts(steps):
    rng = np.random.default_rng(5)
    rewards = rng.normal(size=steps).astype(np.float32)
    values, next_values = rng.normal(size=steps), rng.normal(size=steps)
    flags = np.zeros(steps, bool), np.arange(steps) == 1
    arrays = (rewards.astype(np.float64), values, next_values, *flags)
    expected = gae_core.gae(*arrays, gamma=0.9, lambda_=0.8)
    got = gae_core.gae(*as_tensors(arrays), gamma=0.9, lambda_=0.8)
    assert got.shape == (steps,) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    empty = torch.zeros(steps, 0)
    no_envs = gae_core.gae(empty, empty, empty, empty.bool(), empty.bool(), gamma=0.9, lambda_=1.0)
    assert no_envs.shape == (steps, 0)


@pytest.mark.parametrize("steps", [1, 2, 3, 64, 1000, 1025])
def test_affine_scan_matches_loop_on_many_lengths(steps):
    rng = np.random.default_rng(steps)
    b = rng.standard_normal((steps, 2))
    c = rng.random((steps, 2)) * (rng.random((steps, 2)) > 0.1)
    expected = np.zeros_like(b)
    carry = np.zeros(2)
    for t in reversed(range(steps)):
        carry = b[t] + c[t] * carry
        expected[t] = carry
    got = _torch_scan.reverse_affine_scan(torch.from_numpy(b), torch.from_numpy(c)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_float32_kept_and_close_to_float64():
    batch64 = rollout(np.random.default_rng(3), 500, 8)
    batch32 = [x.astype(np.float32) if x.dtype == np.float64 else x for x in batch64]
    for fn, kwargs in [
        (gae_core.gae, {"lambda_": 0.95}),
        (gae_core.lambda_returns, {"lambda_": 0.95}),
        (gae_core.k_step_advantages, {"k": 5}),
        (gae_core.gae_lambda_sweep, {"lambdas": [0.5, 0.99]}),
    ]:
        out32 = fn(*batch32, gamma=0.99, **kwargs)
        out64 = fn(*batch64, gamma=0.99, **kwargs)
        assert out32.dtype == np.float32 and out64.dtype == np.float64, fn.__name__
        # float64 accumulation: float32 differs by input rounding, not chain-length error
        np.testing.assert_allclose(out32, out64, rtol=1e-5, atol=1e-5)
    t32 = gae_core.gae(*as_tensors(batch32), gamma=0.99, lambda_=0.95)
    assert t32.dtype == torch.float32


def test_mixed_float_dtypes_promote_to_the_wider():
    r, v, nv, term, trunc = rollout(np.random.default_rng(0), 10, 2)
    out = gae_core.gae(r.astype(np.float32), v, nv, term, trunc, gamma=0.9, lambda_=0.9)
    assert out.dtype == np.float64


def test_one_dim_in_one_dim_out_and_equal_to_a_column():
    r, v, nv, term, trunc = rollout(np.random.default_rng(1), 30, 1)
    column = gae_core.gae(r, v, nv, term, trunc, gamma=0.9, lambda_=0.8)
    flat = gae_core.gae(r[:, 0], v[:, 0], nv[:, 0], term[:, 0], trunc[:, 0], gamma=0.9, lambda_=0.8)
    assert flat.shape == (30,)
    np.testing.assert_array_equal(flat, column[:, 0])
    stacked = gae_core.k_step_advantages(
        r[:, 0], v[:, 0], nv[:, 0], term[:, 0], trunc[:, 0], gamma=0.9, k=[1, 2]
    )
    assert stacked.shape == (2, 30)


def test_integer_and_float_flags_equal_bool_flags():
    r, v, nv, term, trunc = rollout(np.random.default_rng(2), 50, 3)
    expected = gae_core.gae(r, v, nv, term, trunc, gamma=0.9, lambda_=0.9)
    for dtype in (np.int64, np.uint8, np.float32):
        got = gae_core.gae(
            r, v, nv, term.astype(dtype), trunc.astype(dtype), gamma=0.9, lambda_=0.9
        )
        np.testing.assert_array_equal(got, expected)


def test_inputs_are_not_modified_and_non_contiguous_inputs_work():
    rng = np.random.default_rng(4)
    batch = rollout(rng, 40, 6)
    strided = [x[:, ::2] for x in batch]  # non-contiguous views
    copies = [x.copy() for x in batch]
    expected = gae_core.gae(*[np.ascontiguousarray(x) for x in strided], gamma=0.9, lambda_=0.7)
    got = gae_core.gae(*strided, gamma=0.9, lambda_=0.7)
    np.testing.assert_array_equal(got, expected)
    tensors = as_tensors(batch)
    tensor_copies = [t.clone() for t in tensors]
    for fn in (gae_core.gae, gae_core.lambda_returns):
        fn(*batch, gamma=0.9, lambda_=0.7)
        fn(*tensors, gamma=0.9, lambda_=0.7)
    gae_core.k_step_advantages(*tensors, gamma=0.9, k=3)
    for before, after in zip(copies, batch, strict=True):
        np.testing.assert_array_equal(before, after)
    for before, after in zip(tensor_copies, tensors, strict=True):
        assert torch.equal(before, after)


def test_tensor_with_grad_gives_detached_result():
    r, v, nv, term, trunc = as_tensors(rollout(np.random.default_rng(5), 12, 2))
    v = v.clone().requires_grad_(True)
    out = gae_core.lambda_returns(r, v, nv, term, trunc, gamma=0.9, lambda_=0.9)
    assert not out.requires_grad


def test_empty_rollout_gives_empty_result():
    empty = np.zeros((0, 3))
    flags = np.zeros((0, 3), bool)
    assert gae_core.gae(empty, empty, empty, flags, flags, gamma=0.9, lambda_=0.9).shape == (0, 3)


# ----------------------------------------------------------------------------- bad input


def good():
    return list(rollout(np.random.default_rng(0), 6, 2))


@pytest.mark.parametrize(
    ("mutate", "kwargs", "message"),
    [
        (lambda b: b.__setitem__(1, b[1][:5]), {}, "values must have the same shape"),
        (lambda b: b.__setitem__(3, b[3][:, :1]), {}, "terminated must have the same shape"),
        (
            lambda b: b.__setitem__(0, b[0].astype(np.int64)),
            {},
            "rewards must be float32 or float64",
        ),
        (lambda b: b.__setitem__(2, b[2].astype(np.float16)), {}, "next_values must be float32"),
        (
            lambda b: b.__setitem__(4, b[4].astype(float) + 2),
            {},
            "truncated must be boolean or 0/1, got 2.0 at index (0, 0)",
        ),
        (
            lambda b: b.__setitem__(3, np.full((6, 2), "x")),
            {},
            "terminated must be an array of numbers or booleans, got dtype <U1",
        ),
        (
            lambda b: b.__setitem__(3, [[0, 1]] * 5 + [[0, 7]]),
            {},
            "terminated must be boolean or 0/1, got 7 at index (5, 1)",
        ),
        (
            lambda b: b.__setitem__(1, [[0.0, 1.0], [2.0]] + [[0.0, 0.0]] * 4),
            {},
            "values must be a rectangular array of numbers",
        ),
        (lambda b: b[0].__setitem__((2, 1), np.nan), {}, "rewards must be finite"),
        (lambda b: b[1].__setitem__((0, 0), np.inf), {}, "values must be finite"),
        (lambda b: b[2].__setitem__((5, 1), -np.inf), {}, "next_values must be finite"),
        (lambda b: b.__setitem__(0, np.zeros((2, 3, 1))), {}, "rewards must be 1-D [T] or 2-D"),
        (lambda b: None, {"gamma": 1.5}, "gamma must be in [0, 1]"),
        (lambda b: None, {"gamma": -0.1}, "gamma must be in [0, 1]"),
        (lambda b: None, {"gamma": float("nan")}, "gamma must be in [0, 1]"),
        (lambda b: None, {"lambda_": 1.01}, "lambda_ must be in [0, 1]"),
        (lambda b: None, {"lambda_": "0.9"}, "lambda_ must be a real number in [0, 1]"),
        (lambda b: None, {"lambda_": True}, "lambda_ must be a real number"),
    ],
)
def test_gae_bad_input(mutate, kwargs, message):
    batch = good()
    mutate(batch)
    params = {"gamma": 0.9, "lambda_": 0.9, **kwargs}
    with pytest.raises(ValueError, match=_escape(message)):
        gae_core.gae(*batch, **params)


def _escape(text):
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    ("k", "message"),
    [
        (0, "k must be in [1, 9223372036854775807] (int64), got 0"),
        (-3, "k must be in [1, 9223372036854775807] (int64), got -3"),
        (2**63, f"k must be in [1, 9223372036854775807] (int64), got {2**63}"),
        (2.0, "k must be an integer"),
        (True, "k must be an integer"),
        ("5", "k must be an integer"),
        ([], "k must be a non-empty sequence"),
        ([1, 0], "k must be in [1, 9223372036854775807] (int64), got 0"),
        ([1, 2.5], "k must be an integer"),
    ],
)
def test_k_step_bad_k(k, message):
    with pytest.raises(ValueError, match=_escape(message)):
        gae_core.k_step_advantages(*good(), gamma=0.9, k=k)


@pytest.mark.parametrize(
    ("lambdas", "message"),
    [
        ([], "lambdas must be a non-empty sequence"),
        (np.array([]), "lambdas must be a non-empty sequence"),
        ([0.5, 1.2], "lambdas must be in [0, 1]"),
        (0.5, "lambdas must be a sequence"),
    ],
)
def test_sweep_bad_lambdas(lambdas, message):
    with pytest.raises(ValueError, match=_escape(message)):
        gae_core.gae_lambda_sweep(*good(), gamma=0.9, lambdas=lambdas)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1.5, 3), "lambda_ must be in [0, 1]"),
        ((0.5, 0), "horizon must be in [1, 10000000], got 0"),
        ((0.5, 10_000_001), "horizon must be in [1, 10000000], got 10000001"),
        ((0.5, 2.0), "horizon must be an integer in [1, 10000000], got 2.0"),
    ],
)
def test_estimator_weights_bad_input(args, message):
    with pytest.raises(ValueError, match=_escape(message)):
        gae_core.estimator_weights(*args)


def test_other_functions_validate_too():
    r, v, nv, term, trunc = good()
    with pytest.raises(ValueError, match="gamma must be in"):
        gae_core.td_residuals(r, v, nv, term, gamma=2.0)
    with pytest.raises(ValueError, match="terminated must be boolean"):
        gae_core.discounted_returns(r, nv, term + 2, trunc, gamma=0.9)
    with pytest.raises(ValueError, match="rewards must be finite"):
        gae_core.lambda_returns(r * np.nan, v, nv, term, trunc, gamma=0.9, lambda_=0.5)


def test_mixing_numpy_and_torch_is_rejected():
    r, v, nv, term, trunc = good()
    with pytest.raises(ValueError, match=r"pass all numpy arrays .or lists. or all torch tensors"):
        gae_core.gae(torch.from_numpy(r), v, nv, term, trunc, gamma=0.9, lambda_=0.9)


def test_python_lists_are_converted_like_numpy_arrays():
    batch = good()
    as_lists = [x.tolist() for x in batch]
    np.testing.assert_array_equal(
        gae_core.gae(*as_lists, gamma=0.9, lambda_=0.8),
        gae_core.gae(*batch, gamma=0.9, lambda_=0.8),
    )
    np.testing.assert_array_equal(
        gae_core.k_step_advantages(*as_lists, gamma=0.9, k=[1, 3]),
        gae_core.k_step_advantages(*batch, gamma=0.9, k=[1, 3]),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_tensors_behave_like_empty_arrays(dtype):
    empty = [torch.zeros(0, dtype=dtype)] * 3 + [torch.zeros(0, dtype=torch.bool)] * 2
    as_numpy = [x.numpy() for x in empty]
    for name, kwargs in [
        ("gae", {"gamma": 0.9, "lambda_": 0.5}),
        ("k_step_advantages", {"gamma": 0.9, "k": [1, 4]}),
        ("gae_lambda_sweep", {"gamma": 0.9, "lambdas": [0.0, 1.0]}),
        ("lambda_returns", {"gamma": 0.9, "lambda_": 0.5}),
    ]:
        out = getattr(gae_core, name)(*empty, **kwargs)
        expected = getattr(gae_core, name)(*as_numpy, **kwargs)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype, name
        assert tuple(out.shape) == expected.shape, name
    out = gae_core.td_residuals(*empty[:4], gamma=0.9)
    assert tuple(out.shape) == (0,)
    out = gae_core.discounted_returns(empty[0], empty[2], empty[3], empty[4], gamma=0.9)
    assert tuple(out.shape) == (0,)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_k_step_is_linear_in_t_for_any_k(backend):
    """Â^(k) costs O(T) whatever k: one segment of a million steps with k up to 2**62 finishes
    (a sum of k terms per step would take T·min(k, T) = 10^12 operations) and equals GAE(λ=1)
    for k ≥ the segment length, S_t − γ^k S_{t+k} below it."""
    steps = 1_000_000 if backend == "numpy" else 60_000  # the torch path serves small tensors
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=steps)
    values = rng.normal(size=steps)
    next_values = np.append(values[1:], 0.0)
    flags = np.zeros(steps, bool)
    batch = [rewards, values, next_values, flags, flags]
    if backend == "torch":
        batch = [torch.from_numpy(x) for x in batch]
    ks = [1, 7, steps - 1, steps, 2**62]
    out = gae_core.k_step_advantages(*batch, gamma=0.999, k=ks)
    full = gae_core.gae(*batch, gamma=0.999, lambda_=1.0)
    out, full = np.asarray(out), np.asarray(full)
    deltas = np.asarray(gae_core.td_residuals(*batch[:4], gamma=0.999))
    np.testing.assert_allclose(out[0], deltas, rtol=1e-9, atol=1e-9)
    for i in (3, 4):  # k ≥ T: the whole segment
        np.testing.assert_allclose(out[i], full, rtol=1e-9, atol=1e-9)
    # k = 7 against the direct sum on a stretch
    direct = sum(0.999**j * deltas[j : j + 1000] for j in range(7))
    np.testing.assert_allclose(out[1][:1000], direct, rtol=1e-7, atol=1e-7)


@pytest.mark.slow
def test_package_modules_do_not_import_streamlit():
    """Every module of the library (walked, not just gae_core/__init__) imports without
    Streamlit being loaded."""
    code = (
        "import importlib, pkgutil, sys, gae_core\n"
        "names = [m.name for m in pkgutil.walk_packages(gae_core.__path__, 'gae_core.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names), 'streamlit' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, imported_streamlit = out.stdout.split()
    assert int(count) >= 30
    assert imported_streamlit == "False"
