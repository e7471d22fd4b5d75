"""The gradient lens (gae_core.lab.gradient): per-sample scores against autograd, the statistics
by hand, the exact chain anchor (Monte-Carlo batches against the exact mean and covariance of
the batch estimator), determinism, and the CLI's contract and one-line errors."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cli, cli_in_process, handing_to

from gae_core.agent.config import TrainConfig
from gae_core.agent.policy import ActorCritic
from gae_core.agent.recording import Replay
from gae_core.estimators import gae_lambda_sweep, k_step_advantages
from gae_core.lab import chain, chain_gradient
from gae_core.lab.gradient import (
    DEBIASED_NOTE,
    QUANTITIES,
    GradientResult,
    actor_parameters,
    batch_gradients,
    batch_problem,
    gradient_sentence,
    gradient_statistics,
    largest_batch_share,
    measure_gradient,
    per_sample_scores,
)
from gae_core.lab.settings import GradientSettings, reference_problem
from gae_core.storage.store import RunStore


@pytest.mark.parametrize(
    ("env_id", "sde"), [("CartPole-v1", False), ("Pendulum-v1", False), ("Pendulum-v1", True)]
)
def test_per_sample_scores_give_autograd_of_the_batch_loss(env_id, sde):
    env = gym.make(env_id)
    model = ActorCritic(env.observation_space, env.action_space, (16, 8), seed=3, sde=sde,
                        log_std_init=-0.3)  # fmt: skip
    rng = np.random.default_rng(0)
    n = 37
    obs = torch.as_tensor(
        rng.standard_normal((n, env.observation_space.shape[0])), dtype=torch.float32
    )
    with torch.no_grad():
        actions = torch.as_tensor(model.sample(obs, rng))
    advantages = rng.standard_normal((3, n))
    got = batch_gradients(per_sample_scores(model, obs, actions), advantages)
    params = {k.removeprefix("model."): v for k, v in actor_parameters(model).items()}
    for e in range(3):
        model.zero_grad()
        log_probs, _ = model.log_probs_and_entropy(obs, actions)
        (log_probs * torch.as_tensor(advantages[e], dtype=torch.float32)).mean().backward()
        named = dict(model.named_parameters())
        expected = torch.cat([named[k].grad.reshape(-1) for k in params]).double().numpy()
        np.testing.assert_allclose(got[e], expected, rtol=1e-4, atol=1e-6)


def test_statistics_by_hand_on_a_small_case():
    rng = np.random.default_rng(1)
    K, E, P = 5, 2, 4
    G = rng.standard_normal((K, E, P)) + 0.5
    g = rng.standard_normal(P)
    noise = 0.01
    out = gradient_statistics(G, g, noise, resamples=50)
    for e in range(E):
        X = G[:, e]
        mean = X.mean(0)
        variance = ((X - mean) ** 2).sum() / (K - 1)
        cos = [x @ g / np.linalg.norm(x) / np.linalg.norm(g) for x in X]
        pairs = [X[i] @ X[j] / np.linalg.norm(X[i]) / np.linalg.norm(X[j])
                 for i in range(K) for j in range(K) if i != j]  # fmt: skip
        bias2 = ((mean - g) ** 2).sum() - variance / K - noise
        expected = {
            "cosine": np.mean(cos),
            "pairwise_cosine": np.mean(pairs),
            "bias2": bias2,
            "variance": variance,
            "mse": bias2 + variance,
            "snr": ((mean**2).sum() - variance / K) / variance,
        }
        for name, value in expected.items():
            point, low, high = (v[e] for v in out[name])
            assert point == pytest.approx(value, rel=1e-9, abs=1e-12), name
            assert low <= high
    with pytest.raises(ValueError, match="batches must be ≥ 2"):
        gradient_statistics(G[:1], g)


def test_intervals_cover_the_truth_where_the_plug_in_bootstrap_would_not():
    # K = 32 batches of P = 500 coordinates, isotropic noise: bias² = 1, variance = P σ², and a
    # known SNR. A resample that paired a batch with itself would sit tr S/K (here 7.8) above
    # the point estimate and cover none of the 20 truths.
    K, P, sigma = 32, 500, 0.5
    g = np.zeros(P)
    mean = np.zeros(P)
    mean[0] = 1.0  # ‖E ĝ − g*‖² = 1
    truth = {"bias2": 1.0, "variance": P * sigma**2, "snr": 1.0 / (P * sigma**2)}
    covered = dict.fromkeys(truth, 0)
    for rep in range(20):
        rng = np.random.default_rng(rep)
        G = (mean + sigma * rng.standard_normal((K, P)))[:, None, :]
        out = gradient_statistics(G, g, 0.0, resamples=400, seed=rep)
        for name, value in truth.items():
            point, low, high = (float(v[0]) for v in out[name])
            assert low <= point <= high, (name, point, low, high)
            covered[name] += low <= value <= high
    assert all(n >= 16 for n in covered.values()), covered


def _chain_batches(spec, logits, critic, gamma, segment, lambdas, ks, d, batches, n, seed):
    """K Monte-Carlo batches of n iid samples on the chain: s ~ d, a ~ π, a continuation drawn
    from its exact path distribution, advantages by gae_core.estimators."""
    rng = np.random.default_rng(seed)
    pi = chain_gradient.softmax_policy(logits)
    psi = chain_gradient.score_vectors(pi)
    table = {}  # (s, a) → (path probabilities, advantages [paths, E])
    for s in range(1, spec.n_states - 1):
        for a in (0, 1):
            paths = chain.enumerate_paths(spec, pi, s, a, segment)
            v = np.asarray(critic, float)
            args = (paths.rewards.T, v[paths.states[:, :-1]].T, v[paths.states[:, 1:]].T,
                    paths.terminated.T, np.zeros_like(paths.terminated.T))  # fmt: skip
            gae = gae_lambda_sweep(*args, gamma=gamma, lambdas=list(lambdas))[:, 0, :]
            kst = [k_step_advantages(*args, gamma=gamma, k=int(k))[0] for k in ks]
            table[(s, a)] = (paths.prob, np.concatenate([gae, np.stack(kst)]).T)
    states = np.arange(spec.n_states)
    G = np.zeros((batches, len(lambdas) + len(ks), psi.shape[-1]))
    for k in range(batches):
        for s in rng.choice(states, size=n, p=d):
            a = int(rng.random() < pi[s, 1])
            prob, adv = table[(s, a)]
            G[k] += adv[rng.choice(len(prob), p=prob)][:, None] * psi[s, a] / n
    return G


@pytest.mark.slow
def test_chain_monte_carlo_gradients_agree_with_the_exact_moments():
    spec = chain.ChainSpec(n_states=5)
    gamma, segment, n, batches = 0.9, 8, 16, 400
    lambdas, ks = (0.0, 0.5, 0.9, 1.0), (1, 3)
    logits = np.array([[0.0, 0.0], [0.2, -0.1], [-0.3, 0.4], [0.1, 0.5], [0.0, 0.0]])
    pi = chain_gradient.softmax_policy(logits)
    V, _ = chain.exact_values(spec, pi, gamma)
    critic = chain.critic_with_error(V, 0.3, seed=2)
    d = np.array([0.0, 0.3, 0.5, 0.2, 0.0])
    exact = chain_gradient.exact_gradient_moments(
        spec, logits, critic, gamma, segment, lambdas, ks, d
    )
    G = _chain_batches(spec, logits, critic, gamma, segment, lambdas, ks, d, batches, n, seed=5)
    out = gradient_statistics(G, exact.true, 0.0, confidence=0.99, resamples=2000)
    cov = exact.batch_covariance(n)
    for e in range(len(lambdas) + len(ks)):
        bias2 = float(((exact.mean[e] - exact.true) ** 2).sum())
        variance = float(np.trace(cov[e]))
        _, low, high = (v[e] for v in out["bias2"])
        assert low <= bias2 <= high, (e, bias2, low, high)
        _, low, high = (v[e] for v in out["variance"])
        assert low <= variance <= high, (e, variance, low, high)
        # the mean gradient, coordinate by coordinate, within 4 standard errors
        se = np.sqrt(np.diag(cov[e]) / batches)
        assert np.all(np.abs(G[:, e].mean(0) - exact.mean[e]) <= 4 * se + 1e-12)
    # a critic with an error biases every estimator but λ = 1 over a long enough segment
    biased = ((exact.mean[: len(lambdas)] - exact.true) ** 2).sum(1)
    assert biased[0] > 100 * biased[-1] and biased[-1] < 1e-3 * (exact.true**2).sum()


def test_with_an_exact_critic_every_estimator_is_unbiased_exactly():
    spec = chain.ChainSpec(n_states=5)
    gamma, segment = 0.9, 6
    logits = np.array([[0.0, 0.0], [0.4, -0.2], [0.0, 0.3], [-0.5, 0.1], [0.0, 0.0]])
    V, _ = chain.exact_values(spec, chain_gradient.softmax_policy(logits), gamma)
    d = np.array([0.0, 1.0, 2.0, 1.0, 0.0])
    exact = chain_gradient.exact_gradient_moments(
        spec, logits, V, gamma, segment, (0.0, 0.3, 1.0), (1, 2), d
    )
    np.testing.assert_allclose(
        exact.mean, np.broadcast_to(exact.true, exact.mean.shape), atol=1e-12
    )
    assert np.linalg.norm(exact.true) > 0.01  # not trivially zero


def _replay(env_id: str = "CartPole-v1") -> Replay:
    env = gym.make(env_id)
    return Replay(ActorCritic(env.observation_space, env.action_space, (16,), seed=0).eval())


def _lens_rows(mse, cosine, half_width=0.5):
    """A gradient table of GAE rows at λ = 0, 0.5, 1 for one critic."""
    import pandas as pd

    mse = np.asarray(mse, float)
    return pd.DataFrame({"critic": "critic 1", "kind": "gae", "param": [0.0, 0.5, 1.0],
                         "mse": mse, "mse_ci_low": mse - half_width,
                         "mse_ci_high": mse + half_width, "cosine": cosine})  # fmt: skip


def test_the_gradient_sentence_names_the_least_mse_and_what_it_cannot_tell_apart():
    sentence = gradient_sentence(_lens_rows([5.0, 2.0, 2.4], [0.2, 0.5, 0.9]), "critic 1")
    assert sentence == ("critic 1: the least gradient MSE is at λ = 0.5 (MSE 2 [1.5, 2.5], "
                        "cosine to g* 0.500); λ from 0.5 to 1 cannot be told apart from it at "
                        "this number of batches")  # fmt: skip
    alone = gradient_sentence(_lens_rows([5.0, 2.0, 4.0], [0.2, 0.5, 0.9]), "critic 1")
    assert "; no other λ's interval overlaps it at" in alone and "points away" not in alone


def test_a_least_mse_gradient_that_points_away_from_g_star_is_said_to():
    """A short gradient has a small MSE whatever its direction: where the least-MSE λ's cosine
    is ≤ 0 the sentence says so and names the λ best aligned with g*."""
    sentence = gradient_sentence(_lens_rows([3.0, 2.0, 2.9], [-0.7, -0.444, 0.98]), "critic 1")
    assert "cosine to g* −0.444)" in sentence and "-" not in sentence.replace("critic 1", "")
    assert sentence.endswith(
        ". Its gradient points away from g* (cosine ≤ 0): a short gradient has a small MSE "
        "whatever its direction, so read the cosine here; the highest is at λ = 1 (0.980)"
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_largest_batch_share_is_one_batchs_part_of_the_spread(seed):
    """max_k ‖ĝ_k − ḡ‖² / Σ_l ‖ĝ_l − ḡ‖², against a loop; closed cases: two batches split the
    spread evenly, light tails give each about 1/K, one batch with a rare huge advantage holds
    nearly all, and batches that do not spread give NaN."""
    rng = np.random.default_rng(seed)
    K, E, P = 32, 3, 200
    G = rng.normal(size=(K, E, P))
    share = largest_batch_share(G)
    for e in range(E):
        spread = [float(np.sum((G[k, e] - G[:, e].mean(axis=0)) ** 2)) for k in range(K)]
        assert share[e] == pytest.approx(max(spread) / sum(spread), rel=1e-12)
    assert (share < 3 / K).all()  # light tails, many parameters: each batch about 1/K
    assert largest_batch_share(G[:2]) == pytest.approx([0.5] * E, rel=1e-12)
    G[int(rng.integers(K)), 1] += 60.0  # one batch met a termination's TD error
    heavy = largest_batch_share(G)
    assert heavy[1] > 0.9 and heavy[0] == share[0]
    assert np.isnan(largest_batch_share(np.ones((4, 2, 5)))).all()


@pytest.mark.parametrize("K", [8, 16, 32])
def test_light_tailed_batches_pass_the_heavy_share_once_in_a_thousand(K):
    """heavy_share(K): Grubbs' bound for one normal coordinate at level 10⁻³. Simulated: one
    coordinate passes it at that rate (binomial bounds at 200,000 draws), many coordinates far
    less often; and K = 3 cannot pass it (one batch of three holds at most 2/3)."""
    from gae_core.lab.gradient import HEAVY_LEVEL, heavy_share

    rng = np.random.default_rng(K)
    bound, draws = heavy_share(K), 200_000
    x = rng.normal(size=(draws, K))
    spread = (x - x.mean(axis=1, keepdims=True)) ** 2
    rate = np.mean(spread.max(axis=1) / spread.sum(axis=1) > bound)
    assert 0.6 * HEAVY_LEVEL < rate < 1.5 * HEAVY_LEVEL, rate
    many = rng.normal(size=(20_000, K, 1, 20))  # 20 coordinates, one estimator
    assert np.mean([largest_batch_share(g)[0] > bound for g in many]) < HEAVY_LEVEL
    assert heavy_share(3) == pytest.approx(2 / 3, abs=1e-6)
    with pytest.raises(ValueError, match="batches must be ≥ 3"):
        heavy_share(2)


def test_the_lens_says_where_one_batch_holds_most_of_the_spread():
    """Heavy tails: the note names how many estimators pass the bound, the largest share and
    where, and the bound itself; nothing below 3 batches, or for a measurement stored before
    the share was kept."""
    from gae_core.lab.gradient import heavy_share

    table = _lens_rows([3.0, 2.0, 2.9], [0.1, 0.5, 0.9])
    table["largest_batch_share"] = [0.3, 0.93, 0.6]

    def result(rows, batches: int) -> GradientResult:
        settings = GradientSettings(lambdas=(0.0, 0.5, 1.0), ks=(1,), batches=batches)
        return GradientResult("CartPole-v1", settings, rows, {}, {}, 1.0)

    assert f"{heavy_share(32):.0%}" == "43%"
    assert result(table, 32).tail_note() == (
        "Heavy tails: in 2 of the 3 estimators one of the 32 batches holds 93% of the "
        "batches' spread at most (at λ = 0.5, critic 1), where light-tailed batches pass 43% "
        "once in 1,000. A rare large advantage (a termination's TD error, say) landed in few "
        "batches, so the variance, MSE and their intervals rest on those batches and can move "
        "many-fold with more: measure with more batches before reading a trend over λ from "
        "them."
    )
    assert result(table, 8).tail_note().startswith("Heavy tails: in 1 of the 3 estimators")
    assert result(table, 2).tail_note() is None
    assert result(table.drop(columns="largest_batch_share"), 32).tail_note() is None
    table["largest_batch_share"] = [0.3, 0.4, 0.1]  # under 43 %
    assert result(table, 32).tail_note() is None


def test_the_lens_figure_stars_the_least_mse_on_the_mse_panel():
    from gae_core.insight.lab_figures import GRADIENT_PANELS, gradient_figure

    rows = _lens_rows([3.0, 2.0, 2.9], [0.1, 0.5, 0.9])
    for quantity in QUANTITIES:
        if quantity not in rows:
            rows[quantity] = [0.1, 0.2, 0.3]
        for end in ("_ci_low", "_ci_high"):
            if f"{quantity}{end}" not in rows:
                rows[f"{quantity}{end}"] = rows[quantity]
    figure, frame = gradient_figure(rows)
    (star,) = [t for t in figure.data if t.mode == "markers"]
    panel = 1 + [q for q, _ in GRADIENT_PANELS].index("mse")
    assert (star.x[0], star.y[0]) == (0.5, 2.0) and star.yaxis == f"y{panel}"
    assert set(frame["quantity"]) == set(QUANTITIES)


def test_measure_gradient_is_deterministic_for_a_seed_and_round_trips():
    settings = GradientSettings(gamma=0.95, lambdas=(0.0, 0.9, 1.0), ks=(1,), batches=3,
                                reference=1500, resamples=100, seed=4)  # fmt: skip
    replay = _replay()
    fractions: list[float] = []
    first = measure_gradient("CartPole-v1", replay, [replay], settings, envs=2, steps=16,
                             progress=fractions.append)  # fmt: skip
    again = measure_gradient("CartPole-v1", replay, [replay], settings, envs=2, steps=16)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0  # only grows, to the end
    assert first.table.equals(again.table) and first.reference == again.reference
    assert list(first.table["param"]) == [0.0, 0.9, 1.0, 1.0] and first.batch["envs"] == 2
    assert first.reference["samples"] >= 1500
    restored = GradientResult.from_json(json.loads(json.dumps(first.to_json())))
    assert restored.table.equals(first.table) and restored.settings == settings
    # δ and Â^(1) are the same estimator: the same gradient, the same figures
    for quantity in ("cosine", "variance", "bias2"):
        assert first.table.loc[0, quantity] == pytest.approx(first.table.loc[3, quantity])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batches": 1}, "batches K must be an integer in [2, 10000], got 1"),
        ({"lambdas": (0.5, 1.2)}, "lambdas must be values in [0, 1]"),
        (
            {"batch_size": 4096, "reference": 1000},
            "reference samples must be at least the batch size (4,096), got 1,000",
        ),
        ({"ks": (0,)}, "ks must be integers ≥ 1"),
        ({"seed": -1}, "seed must be an integer in [0, 2147483647], got -1"),
    ],
)
def test_bad_settings_name_the_field(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GradientSettings(**options)


def test_bad_settings_say_every_problem_at_once_one_a_line():
    with pytest.raises(ValueError) as caught:
        GradientSettings(gamma=1.5, batches=0, batch_size="12x", reference=-3, seed=2**40)
    assert str(caught.value).splitlines() == [
        "γ (gamma) must be in [0, 1], got 1.5",
        "batches K must be an integer in [2, 10000], got 0",
        "batch size must be an integer in [1, 1000000], got '12x'",
        "reference samples must be an integer in [1, 100000000], got -3",
        f"seed must be an integer in [0, 2147483647], got {2**40}",
    ]
    assert batch_problem(48, 8) is None and reference_problem(48, 48) is None
    assert batch_problem(33, 2) == "batch size must be a multiple of the run's num_envs (2), got 33"
    assert reference_problem(47, 48) == (
        "reference samples must be at least the batch size (48), got 47"
    )


@pytest.mark.slow
def test_cli_gradient_json_and_one_line_errors(tmp_path):
    data = tmp_path / "data"
    trained = cli(data, "train", "--env", "CartPole-v1", "--total-steps", "2000", "--num-envs",
                  "2", "--rollout-steps", "8", "--checkpoint-every", "1000", "--json")  # fmt: skip
    run_id = json.loads(trained.stdout.strip().splitlines()[-1])["run_id"]
    done = cli(data, "lab", run_id, "--gradient", "--batches", "3", "--batch-size", "32",
               "--reference", "2000", "--lambdas", "0", "0.95", "1", "--ks", "1", "--json",
               "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["lambda"] for r in report["lambdas"]] == [0.0, 0.95, 1.0]
    keys = {"cosine", "cosine_ci_low", "cosine_ci_high", "pairwise_cosine", "bias2", "variance",
            "mse", "snr"}  # fmt: skip
    assert keys <= set(report["lambdas"][0]) and report["ks"][0]["k"] == 1
    assert report["reference"]["samples"] >= 2000 and report["batch_size"] == 32
    assert report["tail_note"] is None  # (3 batches: too few to tell a tail from chance)
    # δ = Â^(1) = GAE(λ = 0): one gradient, reported alike
    assert report["ks"][0]["variance"] == pytest.approx(report["lambdas"][0]["variance"])
    # as text: what the page says under the same numbers, and why bias² and SNR can be < 0
    text = cli(data, "lab", run_id, "--gradient", "--batches", "3", "--batch-size", "32",
               "--reference", "2000", "--lambdas", "0", "1", "--ks", "1", "--states", "8",
               "--no-progress")  # fmt: skip
    assert text.returncode == 0, text.stderr
    # a flag of the other view is said to change nothing, either way
    assert "note: --states has no effect with --gradient (a setting of the other view)" in (
        text.stderr
    )
    per_state = cli_in_process(data, "lab", run_id, "--batches", "3", "--states", "0")
    assert "note: --batches has no effect without --gradient" in per_state.stderr
    assert per_state.returncode == 2 and "states N must be an integer in [1, 4096]" in (
        per_state.stderr
    )
    assert f"critic {report['critic_steps'][0]:,}: the least gradient MSE is at λ = " in text.stdout
    assert f"note: {DEBIASED_NOTE}." in text.stdout
    assert f"samples ({report['samples_per_batch']:,} each after the reset rows)" in text.stdout
    for args, words in (
        (["--batches", "1"], "batches K must be an integer in [2, 10000], got 1"),
        (["--batch-size", "33"], "batch size must be a multiple of the run's num_envs (2)"),
        (["--lambdas", "1.5"], "lambdas must be values in [0, 1]"),
    ):
        bad = cli_in_process(data, "lab", run_id, "--gradient", *args)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    with RunStore(data) as store:  # a run stored without any checkpoint
        bare_id = store.create_run(TrainConfig(env_id="CartPole-v1").to_dict())
        store.finish_run(bare_id, "stopped")
    none = cli_in_process(data, "lab", bare_id, "--gradient")
    assert none.returncode == 2 and "has no checkpoint yet" in none.stderr


@pytest.mark.slow
def test_the_lab_page_measures_the_gradient_and_draws_the_stored_result(data_dir, monkeypatch):
    from conftest import TINY, app, said, said_plain, wait_until
    from streamlit.testing.v1 import AppTest

    from pages import _ui

    handed: dict[str, object] = {}
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))
    manager = _ui.manager()
    run_id = manager.start({**TINY, "total_steps": 1200, "checkpoint_every": 600})
    assert manager.wait(run_id, 60)
    store = RunStore(data_dir)
    at = app("pages/lab.py")
    at.segmented_control(key="lab.view").set_value("policy gradient").run()
    assert not at.exception
    for key, value in {"lab.g_batches": 3, "lab.g_size": 16, "lab.g_reference": 1000}.items():
        at.text_input(key=key).set_value(str(value)).run()
    at.text_input(key="lab.g_size").set_value("15").run()  # not a multiple of the 2 envs
    assert "batch size must be a multiple of the run's num_envs (2)" in said(at.error)[0]
    assert at.button(key="lab.g_start").disabled
    at.text_input(key="lab.g_batches").set_value("1").run()  # every problem at once, a line each
    assert said(at.error) == [
        "batches K must be an integer in [2, 10000], got 1",
        "batch size must be a multiple of the run's num_envs (2), got 15",
    ]
    at.text_input(key="lab.g_batches").set_value("3").run()
    at.text_input(key="lab.g_size").set_value("16").run()
    at.button(key="lab.g_start").click().run()
    gradient_records = lambda: [r for r in store.lab_records(run_id)  # noqa: E731
                                if r.summary.get("kind") == "gradient"]  # fmt: skip
    assert wait_until(lambda: len(gradient_records()) == 1, 120)
    at.run()
    assert not at.exception
    result = GradientResult.from_json(store.load_lab_result(gradient_records()[0].id))
    assert result.settings.batches == 3
    assert (result.batch["envs"], result.batch["steps"]) == (2, 8)
    sentences = [m.value for m in at.markdown if "least gradient MSE" in m.value]
    assert len(sentences) == result.table["critic"].nunique() >= 1
    # the stored measurement's label names every critic's λ*, not the first one's alone
    (label,) = at.selectbox(key="lab.g_stored").options
    critics = list(result.table["critic"].unique())
    bests = [f"{c}: λ* = {result.best_lambda(c):g}" for c in critics]
    assert all(b in label for b in bests) if len(critics) > 1 else (
        f"· λ* = {result.best_lambda():g} ·" in label)  # fmt: skip
    frame = handed[f"{run_id}_gradient_lambda.csv"]
    mse = frame[frame["quantity"] == "mse"].sort_values("param")["value"].to_numpy()
    expected = result.table[result.table["kind"] == "gae"].sort_values("param")["mse"].to_numpy()
    np.testing.assert_allclose(mse, expected)
    assert set(frame["critic"]) == set(result.table["critic"])
    # every quantity the lens measures is drawn and in the CSV, the SNR too
    assert set(frame["quantity"]) == set(QUANTITIES)
    snr = frame[frame["quantity"] == "snr"].sort_values("param")["value"].to_numpy()
    gae = result.table[result.table["kind"] == "gae"].sort_values("param")
    np.testing.assert_allclose(snr, gae["snr"].to_numpy())
    # the CSV says which run, policy checkpoint and settings made it
    assert (frame["run_id"] == run_id).all() and (frame["batches"] == 3).all()
    assert (frame["policy_step"] == gradient_records()[0].policy_step).all()
    assert (frame["batch_size"] == 16).all()  # the batch it used (from the CLI: the run's own)
    assert not [i for i in at.info if i.value.startswith("Shown: a measurement of policy")]
    # another policy checkpoint chosen above: the stored one shown says whose it is
    first, last = store.checkpoint_steps(run_id)[0], gradient_records()[0].policy_step
    at.selectbox(key="lab.policy").set_value(first).run()
    (shown,) = [i.value for i in at.info if i.value.startswith("Shown: a measurement of policy")]
    assert shown.startswith(f"Shown: a measurement of policy {last:,}, not of the policy "
                            f"checkpoint chosen above ({first:,})")  # fmt: skip
    at.button(key="lab.g_start").click().run()  # measured: the page shows the new one
    assert wait_until(lambda: len(gradient_records()) == 2, 120)
    at.run()
    assert not [i for i in at.info if i.value.startswith("Shown: a measurement of policy")]
    assert at.selectbox(key="lab.g_stored").value == gradient_records()[0].id
    newer, older = (r.id for r in gradient_records())  # of policy `first`, of `last`
    assert at.query_params["measurement"] in ([newer], newer)
    # a link names a stored measurement: it opens that one, not the newest of its policy
    linked = AppTest.from_file("../dashboard.py", default_timeout=60)
    linked.query_params.update(run=run_id, policy=str(first), view="policy gradient",
                               measurement=older)  # fmt: skip
    linked.run()
    linked.switch_page("pages/lab.py").run()
    assert not linked.exception and linked.selectbox(key="lab.g_stored").value == older
    shown = f"Shown: a measurement of policy {last:,}"
    assert [i for i in linked.info if i.value.startswith(shown)]
    linked.selectbox(key="lab.g_stored").set_value(newer).run()  # a choice reaches the URL
    assert linked.query_params["measurement"] in ([newer], newer)
    linked = AppTest.from_file("../dashboard.py", default_timeout=60)
    linked.query_params.update(run=run_id, view="policy gradient", measurement="nope")
    linked.run()
    linked.switch_page("pages/lab.py").run()
    (said_so,) = [said_plain(i.value) for i in linked.info if i.value.startswith("The link names")]
    assert "measurement 'nope'" in said_so and "stored gradient measurements" in said_so
    assert linked.selectbox(key="lab.g_stored").value in (older, newer)
    # the per-state view does not list the gradient measurement
    at.segmented_control(key="lab.view").set_value("per state").run()
    assert not at.exception and any("No measurement of this run yet" in i.value for i in at.info)


def test_a_stored_gradient_measurements_label_names_each_critics_best_lambda():
    """Each critic's λ* where the summary keeps them all; a measurement stored before it did
    (only the first critic's ``best_lambda``) still reads, with that one."""
    import datetime as dt

    from gae_core.lab.jobs import gradient_label
    from gae_core.storage.lab_table import LabRecord

    when = dt.datetime(2026, 11, 27, 8, 0, 0).timestamp()
    base = {"kind": "gradient", "batches": 32, "batch_size": 4096, "best_lambda": 0.66}
    kept = {**base, "critic_steps": [12_228, 40_000], "best_lambdas": [0.66, 0.95]}
    both = LabRecord("a", "run", when, 40_000, 12_228, kept)
    old = LabRecord("b", "run", when, 40_000, 12_228, base)
    assert gradient_label(both) == ("policy 40,000 · 32 × 4,096 · critic 12,228: λ* = 0.66, "
                                    "critic 40,000: λ* = 0.95 · 2026-11-27 08:00:00")  # fmt: skip
    assert gradient_label(old) == "policy 40,000 · 32 × 4,096 · λ* = 0.66 · 2026-11-27 08:00:00"
    # a per-state Measure (a record per critic) says when too: two of the same read apart
    from gae_core.lab.jobs import state_label

    states = {"states": 64, "best_lambda": 0.9}
    first = LabRecord("c", "run", when, 40_000, 12_228, states)
    second = LabRecord("d", "run", when, 40_000, 40_000, {**states, "best_lambda": 1.0})
    assert state_label(first, second) == (
        "policy 40,000 · 64 states · critic 12,228: λ* = 0.9, critic 40,000: λ* = 1 · "
        "2026-11-27 08:00:00"
    )
