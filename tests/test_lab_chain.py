"""The exact chain anchor (``gae_core.lab.chain``): env, tabular values, exact estimator moments.

Every formula in the module docstring is checked here: the estimator definitions (hand-worked
fixture and plain Monte-Carlo loops), the infinite-horizon values (Bellman residual, Monte
Carlo), the linear-recursion means, the closed-form bias and the default-spec trade-off.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core.lab import chain
from gae_core.lab.chain import ChainSpec

GAMMA = chain.DEFAULT_GAMMA
SPEC = ChainSpec()
PI = chain.policy_matrix(SPEC)
V_PI, Q_PI = chain.exact_values(SPEC, PI, GAMMA)
LAMBDAS = np.linspace(0.0, 1.0, 11)


def moments(critic, segment, start=3, action=1, spec=SPEC, pi=PI, gamma=GAMMA, ks=None):
    ks = np.arange(1, segment + 3) if ks is None else ks
    return chain.exact_estimator_moments(
        spec, pi, critic, gamma, start, action, segment, LAMBDAS, ks
    )


# ----------------------------------------------------------------------------- env


def test_registered_env_makes_with_time_limit_and_one_hot_observations():
    chain.register()
    chain.register()  # idempotent: a second call must not raise or re-register
    env = gym.make(chain.ENV_ID)
    assert env.spec is not None and env.spec.max_episode_steps == 100
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (7,), np.float32)
    assert env.action_space == gym.spaces.Discrete(2)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (7,)
    np.testing.assert_array_equal(obs, np.eye(7, dtype=np.float32)[3])
    assert info["state"] == 3 and chain.get_state(env) == 3
    check_env(env.unwrapped, skip_render_check=True)


def test_env_kwargs_reach_the_spec():
    env = gym.make(chain.ENV_ID, n_states=5, step_reward=-0.1, start_state=1)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, chain.observation(1, 5))
    _, reward, terminated, _, _ = env.step(0)
    assert terminated and reward == pytest.approx(-0.1)  # step reward paid on the last step too


def test_env_steps_match_the_tabular_model():
    env = gym.make(chain.ENV_ID)
    env.reset(seed=0)
    nxt, reward = chain.tabular_model(SPEC)
    for s in range(1, 6):
        for a in (0, 1):
            chain.set_state(env, s)
            obs, r, terminated, truncated, info = env.step(a)
            assert chain.get_state(env) == nxt[s, a] == s + (1 if a else -1) == info["state"]
            np.testing.assert_array_equal(obs, chain.observation(nxt[s, a]))
            assert r == reward[s, a] and terminated == SPEC.terminal[nxt[s, a]] and not truncated


def test_ends_terminate_and_only_the_right_end_pays():
    env = gym.make(chain.ENV_ID)
    env.reset(seed=0)
    chain.set_state(env, 5)
    _, r, terminated, _, _ = env.step(1)
    assert (r, terminated, chain.get_state(env)) == (1.0, True, 6)
    unwrapped = env.unwrapped  # stepping on after termination is absorbing
    assert unwrapped.step(0)[1:3] == (0.0, True) and chain.get_state(env) == 6
    env.reset(seed=0)
    chain.set_state(env, 1)
    _, r, terminated, _, _ = env.step(0)
    assert (r, terminated, chain.get_state(env)) == (0.0, True, 0)
    env.reset(seed=0)
    rewards = [env.step(1)[1] for _ in range(3)]  # 3 → 4 → 5 → 6
    assert rewards == [0.0, 0.0, 1.0]


def test_set_get_state_round_trip_and_bounds():
    env = gym.make(chain.ENV_ID)
    env.reset(seed=0)
    for s in range(7):
        chain.set_state(env, s)
        assert chain.get_state(env) == s
    with pytest.raises(ValueError, match="state"):
        chain.set_state(env, 7)


def test_time_limit_truncates_a_walk_that_never_ends():
    env = gym.make(chain.ENV_ID)
    env.reset(seed=0)
    for t in range(100):
        _, _, terminated, truncated, _ = env.step(t % 2)  # 3 → 2 → 3 → …
        assert not terminated and truncated == (t == 99)


# ----------------------------------------------------------------------------- tabular values


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("spec", [SPEC, ChainSpec(9, -0.05, -1.0, 2.0, 2)])
def test_exact_values_satisfy_bellman(spec, gamma):
    pi = chain.policy_matrix(spec, np.linspace(0.3, 0.8, spec.n_states))
    V, Q = chain.exact_values(spec, pi, gamma)
    nxt, reward = chain.tabular_model(spec)
    live = ~spec.terminal
    assert np.all(V[spec.terminal] == 0.0) and np.all(Q[spec.terminal] == 0.0)
    assert np.abs(V[live] - (pi * Q).sum(1)[live]).max() < 1e-12
    assert np.abs(Q[live] - (reward + gamma * V[nxt])[live]).max() < 1e-12


def test_default_values_lie_in_unit_interval():
    assert np.all((V_PI >= 0) & (V_PI <= 1)) and np.all((Q_PI >= 0) & (Q_PI <= 1))


def test_exact_values_match_monte_carlo():
    env = chain.RandomWalkChain()  # unwrapped: infinite horizon, no time limit
    rng = np.random.default_rng(1)
    n = 20_000
    returns = {0: [], 1: []}
    for i in range(n):
        env.reset()
        a, g, discount, done = i % 2, 0.0, 1.0, False  # alternate a_0: estimates Q(3, ·)
        while not done:
            _, r, done, _, _ = env.step(a)
            g += discount * r
            discount *= GAMMA
            a = int(rng.random() < PI[env.position, 1])
        returns[i % 2].append(g)
    for a in (0, 1):
        x = np.asarray(returns[a])
        assert abs(x.mean() - Q_PI[3, a]) < 4 * x.std(ddof=1) / np.sqrt(x.size)
    both = np.concatenate([returns[0], returns[1]])
    v_mc = 0.4 * np.mean(returns[0]) + 0.6 * np.mean(returns[1])
    assert abs(v_mc - V_PI[3]) < 4 * both.std(ddof=1) / np.sqrt(n / 2)


def test_policy_matrix_and_critic():
    pi = chain.policy_matrix(SPEC)
    np.testing.assert_array_equal(pi, np.tile([0.4, 0.6], (7, 1)))
    with pytest.raises(ValueError, match="p_right"):
        chain.policy_matrix(SPEC, 1.5)
    c1, c2 = chain.critic_with_error(V_PI, 0.3, seed=4), chain.critic_with_error(V_PI, 0.3, 4)
    np.testing.assert_array_equal(c1, c2)
    assert np.all(c1[SPEC.terminal] != 0.0)  # error kept at terminal states (documented choice)
    np.testing.assert_array_equal(chain.critic_with_error(V_PI, 0.0), V_PI)


def test_critic_at_terminal_states_is_never_read():
    critic = chain.critic_with_error(V_PI, 0.3, seed=2)
    other = critic.copy()
    other[SPEC.terminal] = [50.0, -70.0]
    for segment in (1, 3, 8):
        a, b = moments(critic, segment, start=1, action=0), moments(other, segment, 1, 0)
        for x, y in [(a.delta, b.delta), (a.k_step, b.k_step), (a.gae, b.gae)]:
            np.testing.assert_array_equal(x.mean, y.mean)
            np.testing.assert_array_equal(x.variance, y.variance)


# ----------------------------------------------------------------------------- enumeration


def test_hand_worked_two_row_segment():
    critic = np.array([9.0, 0.1, 0.2, 0.3, 0.4, 0.5, 9.0])
    m = chain.exact_estimator_moments(SPEC, PI, critic, 0.9, 4, 1, 2, [0.0, 0.5, 1.0], [1, 2])
    d0 = 0.0 + 0.9 * 0.5 - 0.4  # 4 → 5
    d1_left = 0.0 + 0.9 * 0.4 - 0.5  # 5 → 4, p = 0.4
    d1_right = 1.0 + 0.0 - 0.5  # 5 → 6 terminates: no bootstrap, p = 0.6
    assert m.n_paths == 2 and m.target == pytest.approx(q_at(0.9)[4, 1] - 0.4, abs=1e-15)
    assert m.delta.mean == pytest.approx(d0, abs=1e-15) and m.delta.variance == 0.0
    for lam, mean in zip([0.0, 0.5, 1.0], m.gae.mean, strict=True):
        x = d0 + 0.9 * lam * np.array([d1_left, d1_right])
        assert mean == pytest.approx(0.4 * x[0] + 0.6 * x[1], abs=1e-15)
    x = d0 + 0.9 * np.array([d1_left, d1_right])
    assert m.k_step.variance[1] == pytest.approx(0.24 * (x[1] - x[0]) ** 2, abs=1e-15)


def q_at(gamma):
    return chain.exact_values(SPEC, PI, gamma)[1]


def test_paths_are_a_distribution_and_stop_at_termination():
    for segment in range(1, 13):
        paths = chain.enumerate_paths(SPEC, PI, 3, 1, segment)
        assert abs(paths.prob.sum() - 1.0) < 1e-12 and paths.prob.size <= 2 ** (segment - 1)
        ends = paths.terminated.sum(1)
        assert np.all(ends <= 1)
        # A row exists iff no earlier row terminated.
        np.testing.assert_array_equal(
            paths.exists[:, 1:], np.cumsum(paths.terminated, 1)[:, :-1] == 0
        )
    # A deterministic policy has one path; a_0 is used even where π(a_0|s_0) = 0.
    paths = chain.enumerate_paths(SPEC, chain.policy_matrix(SPEC, 1.0), 3, 0, 12)
    assert paths.prob.tolist() == [1.0] and paths.states[0, :4].tolist() == [3, 2, 3, 4]


def test_state_distribution_matches_enumeration():
    for segment in (1, 4, 9):
        paths = chain.enumerate_paths(SPEC, PI, 2, 0, segment)
        mu = chain.state_distribution(SPEC, PI, 2, 0, segment)
        alive = np.concatenate([paths.exists, (paths.exists & ~paths.terminated)[:, -1:]], 1)
        for t in range(segment + 1):
            occupancy = np.bincount(paths.states[:, t], paths.prob * alive[:, t], minlength=7)
            np.testing.assert_allclose(mu[t], occupancy, atol=1e-14)


@pytest.mark.parametrize("segment", range(1, 13))
def test_exact_critic_makes_every_estimator_unbiased(segment):
    for start, action in [(3, 1), (1, 0), (5, 0)]:
        m = moments(V_PI, segment, start, action)
        assert abs(m.state_offset) == 0.0
        for est in (m.delta, m.k_step, m.gae):
            assert np.abs(est.bias).max() < 1e-12


def closed_form_bias(
    critic, segment, start=3, action=1, spec=SPEC, pi=PI, gamma=GAMMA, lambdas=LAMBDAS
):
    """The module docstring's bias formulas, from ε_j = μ_j·(V̂ − V^π)."""
    V, _ = chain.exact_values(spec, pi, gamma)
    eps = chain.state_distribution(spec, pi, start, action, segment) @ (critic - V)
    L, j = segment, np.arange(1, segment)
    gae = (
        np.array([(1 - lam) * np.sum(gamma**j * lam ** (j - 1) * eps[1:L]) for lam in lambdas])
        + gamma**L * lambdas ** (L - 1) * eps[L]
    )
    m = np.minimum(np.arange(1, segment + 3), L)
    return gamma * eps[1], gamma**m * eps[m], gae, eps


@pytest.mark.parametrize("segment", [1, 2, 5, 8, 12])
def test_erroneous_critic_bias_matches_closed_form(segment):
    critic = chain.critic_with_error(V_PI, 0.3, seed=0)
    m = moments(critic, segment)
    delta, k_step, gae, eps = closed_form_bias(critic, segment)
    assert abs(m.delta.bias - delta) < 1e-12
    np.testing.assert_allclose(m.k_step.bias, k_step, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.gae.bias, gae, rtol=0, atol=1e-12)
    # λ = 1 and every k ≥ L: γ^L E[(V̂ − V^π)(s_L)·1{not terminated}].
    assert abs(m.gae.bias[-1] - GAMMA**segment * eps[segment]) < 1e-12
    assert np.abs(m.k_step.bias[segment - 1 :] - GAMMA**segment * eps[segment]).max() < 1e-12
    assert abs(m.state_offset - (V_PI[3] - critic[3])) < 1e-15
    assert abs(m.target - (Q_PI[3, 1] - V_PI[3] + m.state_offset)) < 1e-15


def test_lambda_one_is_unbiased_once_every_path_has_terminated():
    pi = chain.policy_matrix(SPEC, 1.0)  # 3 → 4 → 5 → 6: terminates at row 2
    critic = chain.critic_with_error(chain.exact_values(SPEC, pi, GAMMA)[0], 0.5, seed=3)
    m2, m3 = moments(critic, 2, pi=pi), moments(critic, 3, pi=pi)
    assert abs(m2.gae.bias[-1]) > 0.01  # cut before the end: γ^2 e(s_2) remains
    assert abs(m3.gae.bias[-1]) < 1e-12 and np.abs(m3.k_step.bias[2:]).max() < 1e-12


def test_mse_is_bias_squared_plus_variance_and_delta_has_no_variance():
    critic = chain.critic_with_error(V_PI, 0.3, seed=0)
    m = moments(critic, 8)
    paths = chain.enumerate_paths(SPEC, PI, 3, 1, 8)
    values = chain.path_deltas(paths, critic, GAMMA) @ chain.gae_weights(GAMMA, LAMBDAS, 8).T
    direct = paths.prob @ (values - m.target) ** 2  # E[(Â − target)²], no decomposition
    np.testing.assert_allclose(m.gae.mse, direct, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(m.gae.mse, m.gae.bias**2 + m.gae.variance)
    # Deterministic moves and a fixed a_0: δ_0 is a constant; λ = 1 carries the walk's variance.
    assert m.delta.variance == 0.0 and m.gae.variance[0] == 0.0
    assert m.delta.variance <= m.gae.variance[-1] and m.gae.variance[-1] > 0.05


def test_default_spec_shows_the_trade_off():
    critic = chain.critic_with_error(V_PI, 0.2, seed=0)
    lambdas = np.linspace(0, 1, 101)
    m = chain.exact_estimator_moments(SPEC, PI, critic, GAMMA, 3, 1, 8, lambdas, [1])
    best = int(np.argmin(m.gae.mse))
    assert 0.25 <= lambdas[best] <= 0.35
    assert 1.5 < m.gae.mse[0] / m.gae.mse[best] < 1.9
    assert 10 < m.gae.mse[-1] / m.gae.mse[best] < 14


def live_path_count(spec, start, action, segment):
    """Continuations of (start, action) over ``segment`` rows that stop at termination, counted
    by walking positions forward (every policy probability is positive): a path ends at its
    terminating row or at the cut, one path per sequence of actions before that."""
    nxt, _ = chain.tabular_model(spec)
    first = nxt[start, action]
    counts = np.zeros(spec.n_states, dtype=np.int64)
    counts[first] = 1
    ended = 0
    for _ in range(segment - 1):
        ended += counts[spec.terminal].sum()
        counts[spec.terminal] = 0
        moved = np.zeros_like(counts)
        for a in (0, 1):
            np.add.at(moved, nxt[:, a], counts)
        counts = moved
    return int(ended + counts.sum())


def test_segment_12_with_101_lambdas_enumerates_only_the_paths_that_exist():
    """The page's longest segment (12) with 101 λ and 12 k: the work is one row of δ per
    enumerated path, and paths stop at termination, so there are fewer than the 2^11 action
    sequences a naive enumeration would walk; the moments come from exactly those paths."""
    critic = chain.critic_with_error(V_PI, 0.3, seed=0)
    lambdas, ks = np.linspace(0, 1, 101), np.arange(1, 13)
    m = chain.exact_estimator_moments(SPEC, PI, critic, GAMMA, 3, 1, 12, lambdas, ks)
    paths = chain.enumerate_paths(SPEC, PI, 3, 1, 12)
    expected = live_path_count(SPEC, 3, 1, 12)
    assert m.n_paths == paths.prob.size == expected < 2**11
    assert paths.states.shape == (expected, 13) and paths.exists.shape == (expected, 12)
    assert m.gae.mean.shape == (101,) and m.k_step.mean.shape == (12,)
    assert live_path_count(SPEC, 3, 1, 1) == chain.enumerate_paths(SPEC, PI, 3, 1, 1).prob.size
    # every path that exists is there once: each ends by termination or at the cut
    ended = paths.terminated.any(axis=1) | paths.exists[:, -1]
    assert ended.all() and abs(paths.prob.sum() - 1.0) < 1e-12


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="start_state"):
        moments(V_PI, 4, start=0)
    with pytest.raises(ValueError, match="start_action"):
        moments(V_PI, 4, action=2)
    with pytest.raises(ValueError, match="segment"):
        moments(V_PI, 0)
    with pytest.raises(ValueError, match="segment"):
        moments(V_PI, chain.MAX_SEGMENT + 1)
    with pytest.raises(ValueError, match="policy"):
        moments(V_PI, 4, pi=np.full((7, 2), 0.7))
    with pytest.raises(ValueError, match="n_states"):
        ChainSpec(n_states=2)


# ----------------------------------------------------------------------------- Monte Carlo


@pytest.fixture(scope="module")
def sampled():
    """20k continuations of (3, right), L = 8, sampled through the registered env."""
    critic = chain.critic_with_error(V_PI, 0.3, seed=0)
    segment, ks, lambdas = 8, [2, 4, 8], [0.5, 0.9, 1.0]
    env = gym.make(chain.ENV_ID)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(20_000):
        env.reset()
        chain.set_state(env, 3)
        deltas, s, a = [], 3, 1
        for _ in range(segment):
            _, r, terminated, _, _ = env.step(a)
            s_next = chain.get_state(env)
            deltas.append(r + GAMMA * (0.0 if terminated else critic[s_next]) - critic[s])
            if terminated:
                break
            s, a = s_next, int(rng.random() < PI[s_next, 1])
        k_step = [sum(GAMMA**j * d for j, d in enumerate(deltas[:k])) for k in ks]
        gae = [sum((GAMMA * lam) ** j * d for j, d in enumerate(deltas)) for lam in lambdas]
        rows.append([deltas[0], *k_step, *gae])
    exact = chain.exact_estimator_moments(SPEC, PI, critic, GAMMA, 3, 1, segment, lambdas, ks)
    return np.asarray(rows), exact


def test_exact_means_match_monte_carlo(sampled):
    x, m = sampled
    exact = np.concatenate([[m.delta.mean], m.k_step.mean, m.gae.mean])
    se = x.std(0, ddof=1) / np.sqrt(len(x))
    assert np.abs(x[:, 0] - m.delta.mean).max() < 1e-12  # δ_0 is deterministic here
    assert np.all(np.abs(x.mean(0) - exact)[1:] < 4 * se[1:])


def test_exact_variances_match_monte_carlo(sampled):
    x, m = sampled
    exact = np.concatenate([[m.delta.variance], m.k_step.variance, m.gae.variance])
    n = len(x)
    var = x.var(0, ddof=1)
    m4 = ((x - x.mean(0)) ** 4).mean(0)
    se = np.sqrt(np.maximum(m4 - var**2 * (n - 3) / (n - 1), 0) / n)  # SE of the sample variance
    assert var[0] < 1e-24 and exact[0] == 0.0
    assert np.all(np.abs(var - exact)[1:] < 4 * se[1:])


# ----------------------------------------------------------------------------- hypothesis


@st.composite
def problems(draw):
    n = draw(st.integers(3, 7))
    unit = st.floats(-1.0, 1.0, allow_nan=False)
    spec = ChainSpec(n, draw(unit), draw(unit), draw(unit), draw(st.integers(1, n - 2)))
    p = draw(st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=n, max_size=n))
    critic = np.array(draw(st.lists(st.floats(-2.0, 2.0), min_size=n, max_size=n)))
    gamma = draw(st.floats(0.0, 0.95))
    lambdas = np.array([*draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4)), 0.0, 1.0])
    return spec, chain.policy_matrix(spec, np.array(p)), critic, gamma, lambdas


@settings(max_examples=150, deadline=None)
@given(problems(), st.integers(0, 1), st.integers(1, 8))
def test_enumeration_agrees_with_linearity_and_identities(problem, action, segment):
    spec, pi, critic, gamma, lambdas = problem
    ks = np.arange(1, segment + 3)
    args = (spec, pi, critic, gamma, spec.start, action, segment, lambdas, ks)
    m = chain.exact_estimator_moments(*args)
    delta, k_step, gae = chain.linear_means(*args)
    assert abs(m.delta.mean - delta) < 1e-12
    np.testing.assert_allclose(m.k_step.mean, k_step, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.gae.mean, gae, rtol=0, atol=1e-12)
    # GAE(λ=0) is δ; GAE(λ=1) is Â^(L), and so is every Â^(k ≥ L).
    lam0, lam1 = len(lambdas) - 2, len(lambdas) - 1
    assert abs(m.gae.mean[lam0] - m.delta.mean) < 1e-12
    assert abs(m.gae.variance[lam0] - m.delta.variance) < 1e-12
    for k in range(segment - 1, len(ks)):
        assert abs(m.gae.mean[lam1] - m.k_step.mean[k]) < 1e-12
        assert abs(m.gae.variance[lam1] - m.k_step.variance[k]) < 1e-12
    # The closed-form bias holds for any spec, policy and critic.
    d_bias, k_bias, g_bias, _ = closed_form_bias(
        critic, segment, spec.start, action, spec, pi, gamma, lambdas
    )
    assert abs(m.delta.bias - d_bias) < 1e-10
    np.testing.assert_allclose(m.k_step.bias, k_bias, rtol=0, atol=1e-10)
    np.testing.assert_allclose(m.gae.bias, g_bias, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(m.gae.mse, m.gae.bias**2 + m.gae.variance)


# ----------------------------------------------------------------------------- sampled points


@settings(max_examples=40, deadline=None)
@given(problems(), st.integers(0, 1), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_sampled_paths_are_drawn_with_the_enumerated_probabilities(problem, action, segment, seed):
    """Each continuation :func:`chain.sample_paths` draws is one that enumeration lists, drawn
    about as often as its probability (within 5 standard errors of a binomial count)."""
    spec, pi, _, _, _ = problem
    n = 4_000
    drawn = chain.sample_paths(spec, pi, spec.start, action, segment, n,
                               np.random.default_rng(seed))  # fmt: skip
    paths = chain.enumerate_paths(spec, pi, spec.start, action, segment)
    key = {tuple(row): i for i, row in enumerate(paths.states.tolist())}
    counts = np.bincount([key[tuple(row)] for row in drawn.states.tolist()], minlength=len(key))
    for column in ("rewards", "terminated", "exists"):
        index = [key[tuple(row)] for row in drawn.states.tolist()]
        np.testing.assert_array_equal(getattr(drawn, column), getattr(paths, column)[index])
    se = np.sqrt(n * paths.prob * (1 - paths.prob))
    assert np.all(np.abs(counts - n * paths.prob) <= 5 * se + 1e-9)
    assert np.all(drawn.prob == 1.0 / n)


@settings(max_examples=25, deadline=None)
@given(problems(), st.integers(0, 1), st.integers(1, 8), st.integers(0, 1000))
def test_sampled_moments_sit_on_the_exact_curves(problem, action, segment, seed):
    """The Monte-Carlo points: MSE = bias² + variance from the samples themselves, within 5
    standard errors of the exact MSE. The standard error is the exact one, from the enumerated
    distribution of (Â − target)²: a path too rare to be drawn at all (probability ≪ 1/n) moves
    the estimate by p·Δ, far inside √p·Δ/√n, while the samples' own SE would not see it."""
    spec, pi, critic, gamma, lambdas = problem
    n = 20_000
    exact = chain.exact_estimator_moments(
        spec, pi, critic, gamma, spec.start, action, segment, lambdas, np.array([1])
    )
    sampled = chain.sampled_gae_moments(
        spec, pi, critic, gamma, spec.start, action, segment, lambdas, n, seed
    )
    np.testing.assert_allclose(sampled.mse, sampled.bias2 + sampled.variance, rtol=1e-9,
                               atol=1e-12)  # fmt: skip
    paths = chain.enumerate_paths(spec, pi, spec.start, action, segment)
    values = chain.path_deltas(paths, critic, gamma) @ chain.gae_weights(gamma, lambdas, segment).T
    squared = (values - exact.target) ** 2
    spread = paths.prob @ (squared - paths.prob @ squared) ** 2
    rounding = 1e-10 * np.maximum(1.0, exact.gae.mse)  # a mean of n equal numbers, summed
    assert np.all(np.abs(sampled.mse - exact.gae.mse) <= 5 * np.sqrt(spread / n) + rounding)
    again = chain.sampled_gae_moments(
        spec, pi, critic, gamma, spec.start, action, segment, lambdas, 20_000, seed
    )
    np.testing.assert_array_equal(again.mse, sampled.mse)  # seeded: the same points


def test_sampled_moments_refuse_a_sample_count_out_of_range():
    critic = chain.critic_with_error(V_PI, 0.2)
    for samples in (1, chain.MAX_SAMPLES + 1):
        with pytest.raises(ValueError, match=r"samples must be an integer in \[2, 1,000,000\]"):
            chain.sampled_gae_moments(SPEC, PI, critic, GAMMA, 3, 1, 8, LAMBDAS, samples)


def test_sampled_moments_are_the_plain_statistics_of_the_sampled_paths():
    """bias², variance and MSE of the points, and the MSE's standard error (the error bars'
    half-width is 2 of them), are the plain sample statistics of GAE_0 on the continuations
    :func:`chain.sample_paths` draws with the same seed."""
    critic = chain.critic_with_error(V_PI, 0.2)
    got = chain.sampled_gae_moments(SPEC, PI, critic, GAMMA, 3, 1, 8, LAMBDAS, 500, seed=4)
    paths = chain.sample_paths(SPEC, PI, 3, 1, 8, 500, np.random.default_rng(4))
    x = chain.path_deltas(paths, critic, GAMMA) @ chain.gae_weights(GAMMA, LAMBDAS, 8).T
    target = Q_PI[3, 1] - critic[3]
    np.testing.assert_allclose(got.bias2, (x.mean(0) - target) ** 2, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.variance, x.var(0), rtol=1e-12, atol=1e-15)
    squared = (x - target) ** 2
    np.testing.assert_allclose(got.mse, squared.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got.mse_se, squared.std(0, ddof=1) / np.sqrt(500), rtol=1e-12)
