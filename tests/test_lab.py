"""The estimator lab against exact answers (the chain), and on real agents.

The chain's moments are computed exactly by enumeration (tests/test_lab_chain.py checks those);
here the lab's Monte-Carlo figures must agree with them within their own standard errors, and
with the exact critic every estimator's bias must vanish.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest

from gae_core import estimators
from gae_core.agent.config import TrainConfig
from gae_core.agent.recording import load_replay
from gae_core.agent.trainer import Trainer
from gae_core.errors import UnsupportedEnvError
from gae_core.lab import chain
from gae_core.lab.measure import (
    DEFAULT_KS,
    LabCancelled,
    LabResult,
    LabSettings,
    measure,
    trade_off_sentence,
)
from gae_core.lab.states import Simulator, state_access

GAMMA = 0.95
SEGMENT = 8
LAMBDAS = (0.0, 0.3, 0.7, 1.0)
KS = (1, 2, 3, SEGMENT)
STARTS = [(3, 1), (3, 0), (2, 1), (4, 0), (5, 1)]


class TabularPolicy:
    """π(a|s) from a ``[n_states, 2]`` matrix, acting on the chain's one-hot observations (the
    interface of a replayed checkpoint: ``sample(observations, rng)``)."""

    def __init__(self, policy: np.ndarray) -> None:
        self.policy = np.asarray(policy, float)

    def sample(self, observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        states = np.asarray(observations).argmax(axis=1)
        return (rng.random(len(states)) < self.policy[states, 1]).astype(np.int64)


class TabularCritic:
    """V̂(s) from a vector, on the chain's one-hot observations (``values(observations)``)."""

    def __init__(self, values: np.ndarray) -> None:
        self.table = np.asarray(values, float)

    def values(self, observations: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(observations).argmax(axis=1)]


def chain_setup(error_scale: float):
    spec = chain.ChainSpec()
    policy = chain.policy_matrix(spec)
    v_pi, _ = chain.exact_values(spec, policy, GAMMA)
    critic = chain.critic_with_error(v_pi, error_scale, seed=0) if error_scale else v_pi
    return spec, policy, critic


def run_chain_lab(policy, critic, samples: int):
    settings = LabSettings(
        gamma=GAMMA,
        states=len(STARTS),
        rollouts=samples,
        continuations=samples,
        segment=SEGMENT,
        lambdas=LAMBDAS,
        ks=KS,
        seed=3,
    )
    starts = [(s, chain.observation(s), a) for s, a in STARTS]
    return measure(
        chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic), settings,
        starts=starts,
    )  # fmt: skip


def exact_rows(spec, policy, critic):
    """Per start state: exact target and per estimator (delta, k-steps, lambdas) mean, var."""
    out = []
    for s, a in STARTS:
        moments = chain.exact_estimator_moments(
            spec, policy, critic, GAMMA, s, a, SEGMENT, np.array(LAMBDAS), np.array(KS)
        )
        means = np.concatenate([[moments.delta.mean], moments.k_step.mean, moments.gae.mean])
        variances = np.concatenate(
            [[moments.delta.variance], moments.k_step.variance, moments.gae.variance]
        )
        out.append((moments.target, means, variances, moments.state_offset))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("error_scale", [0.2, 0.0])
def test_monte_carlo_figures_match_the_exact_ones(error_scale):
    spec, policy, critic = chain_setup(error_scale)
    result = run_chain_lab(policy, critic, samples=3000)
    per_state = result.per_state
    for index, (target, means, variances, offset) in enumerate(exact_rows(spec, policy, critic)):
        row = result.states.iloc[index]
        assert abs(row["target"] - target) <= 4 * row["q_se"] + 1e-12
        assert abs(row["offset"] - offset) <= 0.05  # V^π by Monte Carlo, 3000 rollouts
        mine = per_state[per_state["state"] == index].reset_index(drop=True)
        exact_bias2 = (means - target) ** 2
        for e in range(len(mine)):
            assert abs(mine["mean"][e] - means[e]) <= 4 * mine["mean_se"][e] + 1e-12
            assert abs(mine["variance"][e] - variances[e]) <= 4 * mine["variance_se"][e] + 1e-12
            assert abs(mine["bias2"][e] - exact_bias2[e]) <= 4 * mine["bias2_se"][e] + 1e-12
    if error_scale == 0.0:  # the exact critic: no estimator is biased, on average either
        grouped = per_state.groupby(["kind", "param"], sort=False)
        mean_bias2 = grouped["bias2"].mean()
        se = grouped["bias2_se"].apply(lambda x: np.sqrt((x**2).sum()) / len(x))
        assert (mean_bias2.abs() <= 4 * se + 1e-12).all()


@pytest.mark.slow
def test_the_trade_off_shows_on_the_chain():
    """A critic with an error: δ is the most biased, λ = 1 the noisiest, and an intermediate λ
    has the least MSE — the exact figures say so, and the lab finds the same ordering."""
    _, policy, critic = chain_setup(0.2)
    result = run_chain_lab(policy, critic, samples=3000)
    gae = result.estimators[result.estimators["kind"] == "gae"].set_index("param")
    assert gae.loc[0.0, "bias2"] > gae.loc[1.0, "bias2"]
    assert gae.loc[1.0, "variance"] > gae.loc[0.0, "variance"]
    assert result.best_lambda() not in (0.0, 1.0)


def test_a_truth_cut_short_by_its_horizon_says_so():
    """The truth runs until γ^H ≤ 10⁻³; a horizon that leaves more (the 5,000-step cap at γ
    near 1, or one given) is named with what it costs, on the page and in the CLI."""
    _, policy, critic = chain_setup(0.2)
    base = dict(gamma=GAMMA, states=2, rollouts=4, continuations=4, segment=5, lambdas=(0.0, 1.0),
                ks=(1,), seed=5)  # fmt: skip
    starts = [(s, chain.observation(s), a) for s, a in STARTS[:2]]
    whole = measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic),
                    LabSettings(**base), starts=starts)  # fmt: skip
    assert whole.discount_left <= 1e-3 and whole.horizon_note() is None
    short = measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic),
                    LabSettings(**base, horizon=3), starts=starts)  # fmt: skip
    assert short.discount_left == pytest.approx(GAMMA**3)
    note = short.horizon_note()
    assert note.startswith(f"The truth stops at H = 3 steps with γ^H = {GAMMA**3:.2g}")
    assert "λ = 1's too" in note
    assert LabSettings(gamma=0.9999).truth_horizon == 5_000  # the cap: γ^H ≈ 0.61


def test_the_truths_tail_from_a_critic_removes_the_horizons_cut():
    """A truth cut at H misses γ^H V^π(s_H) wherever rollouts outlast H; ended with
    γ^H V̂(s_H) from an exact critic (``tail``) it is Q^π: on the chain at H = 3 the cut truth
    sits many standard errors below the exact Q^π, the tailed one within four of it."""
    _, policy, v_pi = chain_setup(0.0)
    _, q_pi = chain.exact_values(chain.ChainSpec(), policy, GAMMA)
    settings = LabSettings(gamma=GAMMA, states=2, rollouts=4000, continuations=4, segment=5,
                           lambdas=(0.0, 1.0), ks=(1,), seed=3, horizon=3)  # fmt: skip
    starts = [(s, chain.observation(s), a) for s, a in STARTS[:2]]
    exact = np.array([q_pi[s, a] for s, a in STARTS[:2]])
    critic = TabularCritic(v_pi)
    runs = {}
    for tail in (False, True):
        runs[tail] = measure(chain.ENV_ID, TabularPolicy(policy), critic, settings,
                             starts=starts, tail=critic if tail else None)  # fmt: skip
    for tail, result in runs.items():
        assert result.tail is tail
        gap = (result.states["q_hat"] - exact) / result.states["q_se"]
        if tail:
            assert (gap.abs() < 4).all(), gap
        else:
            assert (gap < -10).all(), gap  # the missing tail: Q^π − cut truth > 0
    note = runs[True].horizon_note()
    assert note.startswith(f"The truth stops at H = 3 steps with γ^H = {GAMMA**3:.2g}")
    assert "from the policy's own critic" in note and "λ = 1's too" in note
    assert LabResult.from_json(runs[True].to_json()).tail is True


def test_a_stored_truth_without_a_tail_says_what_it_misses():
    """A measurement stored before the truth took its tail (no ``tail`` in its JSON) at a
    horizon within the tolerance is still named where γ^H·|V^π| is large against its least
    bias²; where it is small, nothing is said."""
    _, policy, critic = chain_setup(0.2)
    settings = LabSettings(gamma=GAMMA, states=2, rollouts=4, continuations=4, segment=5,
                           lambdas=(0.0, 1.0), ks=(1,), seed=5)  # fmt: skip
    starts = [(s, chain.observation(s), a) for s, a in STARTS[:2]]
    result = measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic), settings,
                     starts=starts)  # fmt: skip
    stored = result.to_json()
    del stored["tail"]
    old = LabResult.from_json(stored)
    assert old.tail is False and old.discount_left <= 1e-3
    assert old.horizon_note() is None  # the chain's values are below 1: γ^H·V^π is tiny
    large = replace(old, states=old.states.assign(v_pi=1e4))
    missing = large.discount_left * 1e4
    note = large.horizon_note()
    assert note is not None and f"(about {missing:.2g} here)" in note, note
    assert "takes no tail from a critic" in note
    assert replace(old, states=old.states.assign(v_pi=np.nan)).horizon_note() is None  # unknown


def test_deterministic_progress_and_cancel():
    _, policy, critic = chain_setup(0.2)
    settings = LabSettings(gamma=GAMMA, states=4, rollouts=20, continuations=20, segment=5,
                           lambdas=(0.0, 1.0), ks=(1,), seed=5)  # fmt: skip
    seen = []
    first = measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic),
                    settings, progress=seen.append)  # fmt: skip
    again = measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic),
                    settings)  # fmt: skip
    assert first.estimators.equals(again.estimators) and first.states.equals(again.states)
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    stop = threading.Event()
    stop.set()
    with pytest.raises(LabCancelled):
        measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic),
                settings, cancel=stop)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_id",
    ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
     "Pendulum-v1", "HalfCheetah-v5", "Hopper-v5", chain.ENV_ID],
)  # fmt: skip
def test_a_restored_state_replays_the_same_steps(env_id):
    """Save states mid-episode, restore them into fresh copies: the same actions give the same
    observations and rewards (the whole state is saved, not just the observation)."""
    space = gym.make(env_id).action_space
    space.seed(0)
    actions = [np.stack([space.sample() for _ in range(3)]) for _ in range(30)]
    first = Simulator(env_id, 3, seed=1)
    first.reset(7)
    alive = np.ones(3, bool)
    for step in actions[:10]:
        alive &= ~first.step(step)[2]
    saved = first.get_states()
    second = Simulator(env_id, 3, seed=2)
    second.set_states(saved)
    compared = 0
    for step in actions[10:]:
        obs_a, rew_a, term_a = first.step(step)
        obs_b, rew_b, term_b = second.step(step)
        # copies that terminated are masked by the lab (the vectorised CartPole resets them)
        np.testing.assert_allclose(obs_a[alive], obs_b[alive], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rew_a[alive], rew_b[alive], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(term_a[alive], term_b[alive])
        compared += alive.sum()
        alive &= ~term_a
    assert compared > 0


class _Stateless(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_an_env_whose_state_cannot_be_restored_gets_a_clear_message():
    if "GAETest/Stateless-v0" not in gym.envs.registry:
        gym.register("GAETest/Stateless-v0", entry_point=_Stateless, max_episode_steps=5)
    with pytest.raises(UnsupportedEnvError, match="cannot be saved and restored"):
        state_access("GAETest/Stateless-v0")


def test_settings_name_the_field_and_range():
    with pytest.raises(ValueError, match=r"states N must be an integer in \[1, 4096\], got 0"):
        LabSettings(states=0)
    with pytest.raises(ValueError, match=r"γ \(gamma\) must be in \[0, 1\)"):
        LabSettings(gamma=1.0)
    # every problem at once, one a line, named as the lab's boxes name them
    with pytest.raises(ValueError) as caught:
        LabSettings(states=-1, rollouts=10**9, continuations=1, segment=0, seed=-2)
    assert str(caught.value).splitlines() == [
        "states N must be an integer in [1, 4096], got -1",
        "truth rollouts M (rollouts) must be an integer in [2, 4096], got 1000000000",
        "continuations K must be an integer in [2, 4096], got 1",
        "segment L must be an integer in [1, 10000], got 0",
        "seed must be an integer in [0, 2147483647], got -2",
    ]
    with pytest.raises(ValueError, match="lambdas must be 1 or more values in"):
        LabSettings(lambdas=(0.5, 1.5))
    with pytest.raises(ValueError, match=r"^ks may not repeat a value, got 1, 5 more than once$"):
        LabSettings(ks=(5, 1, 3, 1, 5))
    with pytest.raises(ValueError, match=r"^lambdas may not repeat a value, got 0\.9 more than"):
        LabSettings(lambdas=(0.9, 1.0, 0.9))


def test_the_default_ks_stop_at_the_segment_where_larger_k_are_one_estimator():
    """Â^(k) for every k ≥ L reads the whole segment and bootstraps at its end: the default k
    grid ends at L instead of listing 64, 128 and 256 as three estimators (the lab named
    "least MSE at k = 64" for L = 50); measured, the capped k equals a larger one."""
    assert LabSettings().ks == DEFAULT_KS  # L = 500: every default k is below it
    assert LabSettings(segment=50).ks == (1, 2, 4, 8, 16, 32, 50)
    assert LabSettings(segment=1).ks == (1,)
    assert LabSettings(segment=50, ks=(64, 3)).ks == (64, 3)  # given ks are kept as given
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(8, 3)), rng.normal(size=(9, 3))
    done = np.zeros((8, 3))
    at_l, past_l = (
        estimators.k_step_advantages(rewards, values[:-1], values[1:], done, done, gamma=0.9, k=k)
        for k in (8, 64)
    )
    np.testing.assert_allclose(at_l, past_l)
    assert LabSettings(gamma=0.99).truth_horizon == 688  # 0.99^688 ≤ 1e-3 < 0.99^687


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_the_lab_measures_a_trained_cartpole_checkpoint(algo):
    config = TrainConfig(num_envs=4, rollout_steps=8, total_steps=3000, hidden_sizes=(16,),
                         checkpoint_every=0, record_episodes=0, algo=algo, minibatch_size=16,
                         n_epochs=2)  # fmt: skip
    trainer = Trainer(config)
    while not trainer.done:
        trainer.step()
    replay = load_replay(config, trainer.checkpoint_bytes())
    trainer.close()
    settings = LabSettings(gamma=0.99, states=6, rollouts=8, continuations=8, segment=50,
                           lambdas=(0.0, 0.5, 1.0), ks=(1, 10), seed=1)  # fmt: skip
    result = measure("CartPole-v1", replay, replay, settings)
    assert list(result.estimators["kind"]) == ["delta", "k_step", "k_step", "gae", "gae", "gae"]
    assert len(result.states) == 6 and len(result.per_state) == 6 * 6
    assert result.horizon == 688 and result.env_steps <= settings.env_steps()
    gae = result.estimators.set_index(["kind", "param"])
    # δ = Â^(1) = GAE(λ=0) on every continuation: identical figures
    for column in ("bias2", "variance", "mse"):
        assert gae.loc[("delta", 1.0), column] == pytest.approx(gae.loc[("gae", 0.0), column])
        assert gae.loc[("k_step", 1.0), column] == pytest.approx(gae.loc[("gae", 0.0), column])
    frame = result.estimators
    np.testing.assert_allclose(frame["mse"], frame["bias2"] + frame["variance"], rtol=1e-12)
    assert result.best_lambda() in (0.0, 0.5, 1.0)


@pytest.mark.slow
def test_the_lab_measures_a_mujoco_checkpoint_through_qpos_and_qvel():
    """End to end on Hopper-v5 (state restored through qpos/qvel, normalised observations and
    rewards frozen from the checkpoint): every figure finite, MSE = bias² + variance, within the
    env-step budget the settings promise."""
    from gae_core.agent.presets import preset_config

    config = preset_config("Hopper-v5", total_steps=640, num_envs=2, rollout_steps=8,
                           hidden_sizes=(16,), checkpoint_every=0, record_episodes=0,
                           eval_every=0)  # fmt: skip
    trainer = Trainer(config)
    while not trainer.done:
        trainer.step()
    replay = load_replay(config, trainer.checkpoint_bytes())
    trainer.close()
    assert replay.obs_mean is not None and replay.return_var is not None  # frozen statistics
    settings = LabSettings(gamma=0.99, states=4, rollouts=4, continuations=4, segment=20,
                           lambdas=(0.0, 1.0), ks=(1, 5), seed=0)  # fmt: skip
    result = measure("Hopper-v5", replay, replay, settings)
    frame = result.estimators
    assert np.isfinite(frame[["bias2", "variance", "mse"]].to_numpy()).all()
    np.testing.assert_allclose(frame["mse"], frame["bias2"] + frame["variance"], rtol=1e-12)
    assert len(result.states) == 4 and result.env_steps <= settings.env_steps()


@pytest.mark.slow
def test_cli_lab_json_contract_and_stored_result(tmp_path):
    import json

    from gae_core.storage.store import RunStore

    cli = _cli(tmp_path)
    trained = cli(
        *("train", "--total-steps", "4000", "--num-envs", "4", "--rollout-steps", "8"),
        *("--hidden-sizes", "16", "--checkpoint-every", "2000", "--json", "--no-progress"),
    )
    assert trained.returncode == 0, trained.stderr
    run_id = json.loads(trained.stdout.splitlines()[-1])["run_id"]
    with RunStore(tmp_path) as store:
        steps = store.checkpoint_steps(run_id)
    small = ["--states", "4", "--rollouts", "4", "--continuations", "4", "--segment", "20"]
    done = cli("lab", run_id, *small, "--lambdas", "0", "0.5", "1", "--ks", "1", "5",
               "--critic-step", str(steps[0]), "--json", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert [row["lambda"] for row in report["lambdas"]] == [0.0, 0.5, 1.0]
    assert [row["k"] for row in report["ks"]] == [1, 5]
    for row in report["lambdas"] + report["ks"]:
        assert set(row) >= {"bias2", "variance", "mse", "ci_low", "ci_high"}
        assert row["ci_low"] <= row["mse"] <= row["ci_high"]
        assert row["bias2_ci_low"] <= row["bias2"] <= row["bias2_ci_high"]
        assert row["variance_ci_low"] <= row["variance"] <= row["variance_ci_high"]
        assert row["mse"] == pytest.approx(row["bias2"] + row["variance"])
    assert report["critic_step"] == steps[0] and report["policy_step"] == steps[-1]
    assert report["confidence"] == 0.95  # the level its intervals were computed at
    assert report["discount_left"] <= 1e-3 and report["horizon_note"] is None  # γ 0.99: whole
    assert report["tail"] is True  # at the run's γ the policy's critic ends the truth's rollouts
    with RunStore(tmp_path) as store:  # kept with the run, for the page and after a restart
        (record,) = store.lab_records(run_id)
        assert record.id == report["result_id"] and record.critic_step == steps[0]
        stored = store.load_lab_result(record.id)
        assert stored["estimators"]["mse"][-1] == pytest.approx(report["lambdas"][-1]["mse"])
        # V^π − V̂ per state, reported apart as the README says
        assert report["state_offsets"] == pytest.approx(stored["states"]["offset"])
        assert len(report["state_offsets"]) == report["states"] == 4
    # two critics: the first one's figures on top, both under "critics"
    both = cli("lab", run_id, *small, "--critic-step", str(steps[0]), "--critic-step",
               str(steps[-1]), "--json", "--no-progress")  # fmt: skip
    assert both.returncode == 0, both.stderr
    pair = json.loads(both.stdout.splitlines()[-1])
    assert [c["critic_step"] for c in pair["critics"]] == [steps[0], steps[-1]]
    assert pair["critic_step"] == steps[0] and pair["lambdas"] == pair["critics"][0]["lambdas"]
    assert pair["ks"] and pair["critics"][1]["lambdas"] != pair["lambdas"]
    bad = cli("lab", run_id, "--states", "0")
    assert bad.returncode == 2 and "states N must be an integer in [1, 4096], got 0" in bad.stderr
    wrong = cli("lab", run_id, "--policy-step", "123")
    assert (
        wrong.returncode == 2 and "policy_step must be one of the run's checkpoints" in wrong.stderr
    )
    # at another γ the critic learned another sum: the truth stops at H, and says so if it matters
    other = cli("lab", run_id, *small, "--lambdas", "0", "1", "--ks", "1", "--gamma", "0.9",
                "--json", "--no-progress")  # fmt: skip
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout.splitlines()[-1])["tail"] is False


@pytest.mark.slow
def test_the_lab_says_what_it_measures_for_a_gsde_run(tmp_path):
    """A gSDE run's rollouts held their noise for a rollout; the lab draws it per step, and
    the CLI (and the page, from the same GSDE_NOTE) says so."""
    import json

    from gae_core.lab.measure import BIAS2_NOTE, GSDE_NOTE

    cli = _cli(tmp_path)
    trained = cli(
        *("train", "--env", "Pendulum-v1", "--use-sde", "--total-steps", "400", "--num-envs"),
        *("2", "--rollout-steps", "8", "--checkpoint-every", "200", "--json", "--no-progress"),
    )
    assert trained.returncode == 0, trained.stderr
    run_id = json.loads(trained.stdout.splitlines()[-1])["run_id"]
    small = ["--states", "2", "--rollouts", "2", "--continuations", "2", "--segment", "5"]
    done = cli("lab", run_id, *small, "--lambdas", "0", "1", "--ks", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert GSDE_NOTE in done.stderr and "Least MSE at λ = " in done.stdout
    assert "V^π(s) − V̂(s), a state-only offset that does not bias the policy" in done.stdout
    assert f"note: {BIAS2_NOTE}." in done.stdout


def _cli(data_dir):
    """``python -m gae_core --data-dir DATA_DIR ARGS…`` in a subprocess, as a user runs it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "gae_core", "--data-dir", str(data_dir), *args],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip

    return cli


# ----------------------------------------------------------------------------- memory bound


class RandomPolicy:
    """Uniform actions of a discrete env (``sample(observations, rng)``), numpy only."""

    def __init__(self, actions: int = 2) -> None:
        self.actions = actions

    def sample(self, observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.actions, size=len(observations))


class ZeroCritic:
    def values(self, observations: np.ndarray) -> np.ndarray:
        return np.zeros(len(observations), np.float32)


def traced_peak(work) -> int:
    """Bytes ``work()`` allocated at its peak above what was held before (tracemalloc sees
    numpy's buffers and every Python object)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def chain_lab(segment: int, **fields):
    """The lab on the chain from given starts (no sampling), the estimator grid fixed."""
    _, policy, critic = chain_setup(0.2)
    base = dict(gamma=GAMMA, states=2, rollouts=4, continuations=128, segment=segment,
                lambdas=LAMBDAS, ks=(1, 5), seed=1)  # fmt: skip
    settings = LabSettings(**{**base, **fields})
    starts = [(s, chain.observation(s), a) for s, a in STARTS[:2]]
    return lambda: measure(chain.ENV_ID, TabularPolicy(policy), TabularCritic(critic), settings,
                           starts=starts)  # fmt: skip


def test_the_lab_keeps_only_row_zero_so_its_memory_does_not_grow_with_the_segment():
    """Only the estimates at row 0 of each continuation are kept: the longest segment the
    settings allow (10,000, where every chain walk ends within a few dozen rows) takes no more
    memory than a short one. (Before: [L+1, N·K, d] observations, [L, N·K] rewards and values,
    and Â^(k) as [K, L, N·K], all built to keep row 0.)"""
    chain_lab(10)()  # first calls allocate for good (caches, compiled kernels): not counted
    short, long = traced_peak(chain_lab(10)), traced_peak(chain_lab(10_000))
    assert long <= 1.5 * short + 2**20, (short, long)


@pytest.mark.slow
def test_the_memory_estimate_bounds_the_measured_peak():
    """The estimate the lab refuses by is an upper bound of what a measurement allocates, and
    not a wild one: CartPole (vectorised copies) with a numpy policy and critic, sized so the
    lab's own arrays dominate."""
    from gae_core.lab.measure import memory_estimate

    settings = LabSettings(gamma=0.9, states=8, rollouts=256, continuations=2048, segment=30,
                           seed=2)  # fmt: skip
    peak = traced_peak(lambda: measure("CartPole-v1", RandomPolicy(), ZeroCritic(), settings))
    estimate = memory_estimate("CartPole-v1", settings).bytes
    assert peak <= estimate <= 3 * peak, (peak, estimate)
    # the chain (an env object per copy): same bound
    chain_settings = LabSettings(gamma=GAMMA, states=2, rollouts=1024, continuations=1024,
                                 segment=20, lambdas=LAMBDAS, ks=(1, 5), seed=1)  # fmt: skip
    peak = traced_peak(chain_lab(20, rollouts=1024, continuations=1024))
    estimate = memory_estimate(chain.ENV_ID, chain_settings).bytes
    assert peak <= estimate <= 3 * peak, (peak, estimate)


def test_settings_past_the_memory_limit_are_refused_before_any_work(monkeypatch):
    """N·K = 16.7 M continuations with 111 estimators each (15 GiB of estimates): refused at
    once, in one line naming the fields to lower and the limit, with nothing allocated and no
    env stepped."""
    from gae_core.lab import measure as lab_measure
    from gae_core.lab.states import Simulator

    def started(*args, **kwargs):
        raise AssertionError("the lab started work it cannot finish")

    monkeypatch.setattr(lab_measure, "sample_starts", started)
    monkeypatch.setattr(Simulator, "__init__", started)
    settings = LabSettings(gamma=0.99, states=4096, continuations=4096, segment=2000)
    caught = []

    def refuse():
        with pytest.raises(ValueError) as info:
            measure("CartPole-v1", RandomPolicy(), ZeroCritic(), settings)
        caught.append(info.value)

    assert traced_peak(refuse) < 16 * 2**20  # nothing built
    (error,) = caught
    message = str(error)
    limit = f"{lab_measure.MEMORY_LIMIT / 2**30:g} GiB"
    assert "\n" not in message and limit in message, message
    for part in ("states 4,096", "continuations 4,096", "111 estimators", "lower states"):
        assert part in message, message
    estimate = lab_measure.memory_estimate("CartPole-v1", settings)
    assert estimate.bytes > lab_measure.MEMORY_LIMIT
    assert f"about {estimate.bytes / 2**30:.1f} GiB" in message
    # the in-range example now fits: nothing of L·N·K size is built
    fits = LabSettings(gamma=0.99, states=64, continuations=4096, segment=2000)
    assert lab_measure.memory_estimate("CartPole-v1", fits).bytes < lab_measure.MEMORY_LIMIT


def test_row_zero_sums_equal_gae_core_at_row_zero():
    """The lab sums each estimator at row 0 as rows arrive (δ_l = 0 past a termination); on
    random segments with terminations and a cut at L, that is what gae_core.estimators gives
    at row 0."""
    from gae_core.lab.rollouts import _RowZero

    rng = np.random.default_rng(4)
    length, width, gamma = 37, 50, 0.97
    lambdas, ks = (0.0, 0.4, 0.95, 1.0), (1, 3, 36, 37, 80)
    settings = LabSettings(gamma=gamma, segment=length, lambdas=lambdas, ks=ks)
    rewards = rng.normal(size=(length, width))
    values = rng.normal(size=(length + 1, width))
    ends = rng.integers(1, 3 * length, size=width)  # the row each continuation terminates at
    rows = np.arange(length)[:, None]
    exists, terminated = rows <= ends, rows >= ends
    truncated = np.zeros_like(exists)
    truncated[-1] = exists[-1] & ~terminated[-1]
    current = np.where(exists, values[:-1], 0.0)
    following = np.where(exists & ~terminated, values[1:], 0.0)
    rewards = np.where(exists, rewards, 0.0)
    inputs = (rewards, current, following, terminated, truncated)
    deltas = np.where(exists, rewards + gamma * following - current, 0.0)
    summed = _RowZero(settings, critics=2, width=width, batch=16)
    for start in range(0, width, 16):
        cols = slice(start, min(start + 16, width))
        summed.start(cols)
        alive = exists[:, cols].any(axis=1)
        for row in np.flatnonzero(alive):
            summed.add(np.stack([deltas[row, cols], 2 * deltas[row, cols]]))
        summed.finish()
    expected = np.vstack([
        estimators.td_residuals(*inputs[:3], terminated, gamma=gamma)[:1],
        estimators.k_step_advantages(*inputs, gamma=gamma, k=list(ks))[:, 0],
        estimators.gae_lambda_sweep(*inputs, gamma=gamma, lambdas=list(lambdas))[:, 0],
    ])  # fmt: skip
    np.testing.assert_allclose(summed.table[0], expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(summed.table[1], 2 * expected, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_the_lab_page_refuses_settings_past_the_memory_limit_with_the_same_message(data_dir):
    """The page shows the lab's own refusal and its Measure button stays disabled."""
    from conftest import TINY, app, said

    from gae_core.storage.store import RunStore
    from pages import _ui

    manager = _ui.manager()
    run_id = manager.start({**TINY, "total_steps": 800, "checkpoint_every": 400})
    assert manager.wait(run_id, 60)
    at = app("pages/lab.py")
    at.text_input(key="lab.states").set_value("4096").run()
    at.text_input(key="lab.k").set_value("4096").run()
    assert not at.exception
    assert len(at.error) == 1, "no refusal shown"
    assert at.button(key="lab.start").disabled
    from gae_core.lab.measure import check_memory

    critics = len(at.multiselect(key="lab.critics").value)
    settings = LabSettings(gamma=0.99, states=4096, continuations=4096)
    with pytest.raises(ValueError) as info:
        check_memory("CartPole-v1", settings, critics=critics)
    assert said(at.error) == [str(info.value)]
    with RunStore(data_dir) as store:
        assert store.lab_records(run_id) == []


@pytest.mark.parametrize(
    "blob",
    ["garbage", "empty", "truncated", "a tensor", "another network"],
)
def test_a_checkpoint_that_cannot_be_read_is_one_line_naming_the_run_and_step(blob):
    """Garbage in a checkpoint blob is named in one line (a StoreError: the CLI and the pages
    show it as is) with the run and the step, never torch's advice to load with
    ``weights_only=False``."""
    import io

    import torch

    from gae_core.errors import StoreError

    def saved(obj) -> bytes:
        out = io.BytesIO()
        torch.save(obj, out)
        return out.getvalue()

    config = TrainConfig(hidden_sizes=(16,))
    data = {
        "garbage": b"\x80\x04garbage, not a checkpoint" * 40,
        "empty": b"",
        "truncated": saved({"model": {"w": torch.zeros(64)}})[:100],
        "a tensor": saved(torch.zeros(3)),
        "another network": saved({"model": {"w": torch.zeros(3)}}),
    }[blob]
    with pytest.raises(StoreError, match=r"^the checkpoint cannot be read"):
        load_replay(config, data)  # no run named: the message still says what failed
    with pytest.raises(StoreError) as info:
        load_replay(config, data, run_id="abc123", step=2_000)
    message = str(info.value)
    assert "\n" not in message and "weights_only" not in message, message
    assert message.startswith("run abc123's checkpoint at env step 2,000 cannot be read"), message


def test_the_trade_off_sentence_names_the_least_mse_and_the_term_that_puts_it_there():
    """Where the least MSE = bias² + variance is, and for each side which term rises from it
    to that end, from the numbers alone: at λ = 1 when the bias the critic brings outweighs the
    rewards' variance (CartPole's case), at 0 when the variance does, in between when they
    cross; a segment cut short can make bias² rise towards λ = 1 instead; a flat MSE is said."""
    lam = np.linspace(0.0, 1.0, 11)
    falling, rising = np.linspace(4.0, 0.0, 11), np.linspace(0.0, 4.0, 11)
    one = trade_off_sentence(lam, 10 * falling, 0.01 * rising)  # deterministic dynamics
    assert one == (
        "Least MSE at λ = 1: towards smaller λ the critic's bootstrap bias grows (bias² 40 at "
        "λ = 0, 0 at λ = 1), the larger cost here: the rewards that follow (s, a) vary little, "
        "as on near-deterministic dynamics"
    ), one
    zero = trade_off_sentence(lam, 0.01 * falling, 10 * rising)  # a nearly exact critic
    assert zero.startswith(
        "Least MSE at λ = 0: towards larger λ the sampled rewards' variance grows (variance 40"
    ), zero
    middle = trade_off_sentence(lam, falling**2, rising**2)  # bias² + variance least at 0.5
    assert middle == (
        "Least MSE at λ = 0.5: below it the critic's bootstrap bias grows (bias² 16 at λ = 0, "
        "4 at λ = 0.5); above it the sampled rewards' variance grows (variance 16 at λ = 1, 4 "
        "at λ = 0.5)"
    ), middle
    # a short segment: past the least, λ = 1's own bootstrap bias rises, its variance falls
    cut = trade_off_sentence([0.0, 0.5, 0.9, 1.0], [4.0, 1.0, 0.5, 2.0], [0.0, 0.1, 0.2, 0.1])
    assert cut.endswith(
        "above it bias² (the bootstrap at the segment's end) grows (bias² 2 at λ = 1, 0.5 at "
        "λ = 0.9)"
    ), cut
    flat = trade_off_sentence(lam, np.full(11, 0.25), np.zeros(11))  # a segment of one step
    assert flat == "λ makes no difference here: every λ gives the same estimate (MSE 0.25)"
    # whatever the curves, each clause's term is larger at its end than at the least
    rng = np.random.default_rng(0)
    for _ in range(200):
        b, v = rng.random(11) ** 3, rng.random(11) ** 3
        said = trade_off_sentence(lam, b, v)
        for number_at_end, number_at_best in re.findall(r"\(\S+ ([0-9.e+-]+) at λ = [0-9.]+, "
                                                        r"([0-9.e+-]+) at λ", said):  # fmt: skip
            assert float(number_at_end) >= float(number_at_best), said
