"""The insight pages' pure data builders against hand-computed values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from conftest import runs_of_three_widths
from hypothesis import given
from hypothesis import strategies as st

import gae_core
from gae_core.agent.config import FIELD_SPECS
from gae_core.errors import ConfigError
from gae_core.insight import compare, compare_notes, explorer, views


def small_trajectory():
    # γ = 0.5, rewards 1, V = 0, a truncation at t=1 with V(final obs) = 4, then two more steps
    # and the rollout end with V(next) = 2 (the fixture of test_estimators, hand-derived there).
    return (
        np.array([1.0, 1.0, 1.0, 1.0]),
        np.zeros(4),
        np.array([0.0, 4.0, 0.0, 2.0]),
        np.array([False, False, True, False]),
        np.array([False, True, False, False]),
    )


def test_advantage_table_columns_and_hand_values():
    table = explorer.advantage_table(*small_trajectory(), gamma=0.5, lambdas=[0.5, 1.0], ks=[1, 2])
    assert list(table.columns) == [
        "t", "reward", "value", "next_value", "terminated", "truncated", "end_of_rollout",
        "steps_left", "delta", "k_step[k=1]", "k_step[k=2]", "gae[lambda=0.5]", "gae[lambda=1]",
    ]  # fmt: skip
    # segments: {0, 1} (truncated at 1), {2} (terminated), {3} (end of rollout)
    assert table["steps_left"].tolist() == [2, 1, 1, 1]
    assert table["end_of_rollout"].tolist() == [False, False, False, True]
    assert table["delta"].tolist() == [1, 3, 1, 2]
    assert table["k_step[k=2]"].tolist() == [2.5, 3, 1, 2]
    assert table["gae[lambda=0.5]"].tolist() == [1.75, 3, 1, 2]  # 1 + 0.25·3
    assert table["gae[lambda=1]"].tolist() == [2.5, 3, 1, 2]  # 1 + 0.5·3


def test_advantage_table_rejects_batches():
    with pytest.raises(ValueError, match="1-D trajectory"):
        explorer.advantage_table(*(np.zeros((3, 2)),) * 5, gamma=0.9, lambdas=[0.9])


def test_heatmap_matches_one_gae_per_lambda():
    trajectory = small_trajectory()
    heat = explorer.gae_heatmap(*trajectory, gamma=0.5, lambdas=[0.0, 0.5, 1.0])
    assert len(heat) == 3 * 4
    for lambda_ in (0.0, 0.5, 1.0):
        row = heat[heat["lambda_"] == lambda_].sort_values("t")["gae"].to_numpy()
        np.testing.assert_allclose(row, gae_core.gae(*trajectory, gamma=0.5, lambda_=lambda_))
    assert explorer.gae_heatmap(*trajectory, gamma=0.5)["lambda_"].nunique() == 101


def test_gae_columns_from_a_cached_sweep_equal_direct_gae():
    trajectory = small_trajectory()
    base = explorer.advantage_table(*trajectory, gamma=0.5, lambdas=[], ks=[1])
    assert not any(c.startswith("gae[") for c in base.columns)
    sweep = gae_core.gae_lambda_sweep(*trajectory, gamma=0.5, lambdas=explorer.LAMBDA_GRID)
    table = explorer.with_gae_columns(base, sweep, [0.37, 1.0])
    np.testing.assert_allclose(
        table["gae[lambda=0.37]"], gae_core.gae(*trajectory, gamma=0.5, lambda_=0.37)
    )
    assert "gae[lambda=0.37]" not in base  # the cached base table is not modified
    with pytest.raises(ValueError, match="not on the grid"):
        explorer.with_gae_columns(base, sweep, [0.375])
    heat = explorer.heatmap_from_sweep(sweep)
    assert heat[heat["lambda_"] == 0.37]["gae"].tolist() == table["gae[lambda=0.37]"].tolist()


def test_weights_table_hand_values():
    table = explorer.weights_table(0.5, 3)
    # (1−λ)λ^0 = 0.5, (1−λ)λ^1 = 0.25, tail λ^2 = 0.25
    assert table["weight"].tolist() == [0.5, 0.25, 0.25]
    assert table["geometric_weight"].tolist() == [0.5, 0.25, 0.125]
    assert table["tail"].tolist() == [False, False, True]


@given(lambda_=st.floats(0, 1), horizon=st.integers(1, 300))
def test_weights_sum_to_one_for_every_lambda_and_horizon(lambda_, horizon):
    assert explorer.weights_table(lambda_, horizon)["weight"].sum() == pytest.approx(1.0)


def test_running_mean():
    np.testing.assert_allclose(compare.running_mean([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])


def test_align_curve_takes_last_episode_at_or_before_each_grid_step():
    grid = np.array([0.0, 5.0, 10.0, 15.0, 20.0])
    # episodes finish at steps 5 (return 1), 12 (return 3), 20 (return 5)
    aligned = compare.align_curve([5, 12, 20], [1.0, 3.0, 5.0], grid)
    np.testing.assert_array_equal(aligned, [np.nan, 1, 1, 3, 5])
    smoothed = compare.align_curve([5, 12, 20], [1.0, 3.0, 5.0], grid, window=2)
    np.testing.assert_array_equal(smoothed, [np.nan, 1, 1, 2, 4])


def episodes_frame():
    # λ = 0.9: seeds 0 and 1 with constant returns 10 and 20; λ = 1.0: one seed, returns 5.
    rows = []
    for lambda_, seed, value in [(0.9, 0, 10.0), (0.9, 1, 20.0), (1.0, 0, 5.0)]:
        for step in (10, 20, 30, 40):
            rows.append(
                {
                    "lambda_": lambda_,
                    "seed": seed,
                    "run_id": f"{lambda_}/{seed}",
                    "env_step": step,
                    "return": value,
                }
            )
    return pd.DataFrame(rows)


def test_aggregate_curves_band_by_hand():
    bands, aligned = compare.aggregate_curves(
        episodes_frame(), points=5, window=1, statistic="mean"
    )
    # grid from 0 to the shortest curve's end (40): 0, 10, 20, 30, 40 — whole env steps
    np.testing.assert_array_equal(bands["env_step"].unique(), [0, 10, 20, 30, 40])
    assert bands["env_step"].dtype.kind == "i"
    lam09 = bands[bands["lambda_"] == 0.9].set_index("env_step")
    assert math.isnan(lam09.loc[0, "center"])  # no episode finished at step 0
    # two seeds 10 and 20: mean 15; a bootstrap resample is (10,10), (10,20), (20,10) or
    # (20,20): the 95 % percentile band is exactly the data's range [10, 20]
    assert lam09.loc[20, "center"] == pytest.approx(15.0)
    assert (lam09.loc[20, "ci_low"], lam09.loc[20, "ci_high"]) == (10.0, 20.0)
    assert lam09.loc[20, "seeds"] == 2 and (bands["statistic"] == "mean").all()
    lam1 = bands[bands["lambda_"] == 1.0].set_index("env_step")
    assert lam1.loc[40, "center"] == lam1.loc[40, "ci_low"] == 5.0  # one seed: the value
    assert set(aligned.columns) == {"lambda_", "seed", "env_step", "return"}
    assert len(aligned) == 3 * 5
    with pytest.raises(ValueError, match="statistic must be one of"):
        compare.aggregate_curves(episodes_frame(), statistic="median")


def test_aggregate_curves_grid_stops_at_the_shortest_run():
    frame = episodes_frame()
    frame = frame[~((frame["lambda_"] == 1.0) & (frame["env_step"] > 20))]
    bands, _ = compare.aggregate_curves(frame, points=3, window=1)
    assert bands["env_step"].max() == 20


def test_aggregate_curves_bad_input():
    with pytest.raises(ValueError, match="missing columns"):
        compare.aggregate_curves(pd.DataFrame({"seed": [0]}))
    with pytest.raises(ValueError, match="empty"):
        compare.aggregate_curves(episodes_frame().iloc[0:0])


def test_area_under_curve_by_hand():
    # a ramp 0 → 10 over steps 0..100: area 500, normalised by span 100 → 5
    assert compare.area_under_curve([0, 50, 100], [0, 5, 10]) == pytest.approx(5.0)
    assert compare.area_under_curve([0, 50, 100], [np.nan, 4, 4]) == pytest.approx(4.0)


def test_steps_to_solve_needs_a_full_window():
    steps = np.arange(1, 11) * 100
    returns = np.array([0, 0, 0, 10, 10, 10, 10, 10, 10, 10], float)
    # window 3: means at episodes 3.. are 0, 3.33, 6.67, 10 → first ≥ 10 at episode 6 (step 600)
    assert compare.steps_to_solve(steps, returns, 10.0, window=3) == 600
    assert math.isnan(compare.steps_to_solve(steps, returns, 11.0, window=3))
    assert math.isnan(compare.steps_to_solve(steps[:2], returns[:2], 0.0, window=3))


@given(st.lists(st.one_of(st.none(), st.integers(0, 10**6)), max_size=12))
def test_median_steps_to_solve_is_the_step_by_which_half_the_runs_had_solved(steps):
    solved_at = np.array([math.nan if s is None else s for s in steps], float)
    median = compare.median_steps_to_solve(solved_at)
    if not steps:
        assert math.isnan(median)
        return
    never = np.where(np.isnan(solved_at), math.inf, solved_at)
    # half the runs (or more) had solved by it, and fewer than half before it
    assert 2 * np.sum(never <= median) >= len(steps)
    assert 2 * np.sum(never < median) < len(steps)
    assert (median == math.inf) == (2 * np.sum(~np.isnan(solved_at)) < len(steps))


def test_a_group_that_rarely_solves_does_not_look_fast():
    # λ 0.9: 1 of 5 solved, early; λ 0.95: all 5, later. The median over the runs that solved
    # read 11,300 against 24,300; half of λ 0.9's runs never solved
    assert compare.median_steps_to_solve(np.array([11_300.0] + [math.nan] * 4)) == math.inf
    assert compare.median_steps_to_solve(np.array([24_300.0] * 5)) == 24_300.0
    assert compare.median_steps_to_solve(np.array([30.0, math.nan, 10.0])) == 30.0


def test_summary_table_by_hand():
    table = compare.summary_table(episodes_frame(), threshold=12.0, final_window=2, points=5)
    lam09 = table[table["lambda_"] == 0.9].iloc[0]
    assert lam09["seeds"] == lam09["runs"] == 2
    assert lam09["final_return_mean"] == 15.0 and lam09["final_return_iqm"] == 15.0
    assert (lam09["final_return_mean_ci_low"], lam09["final_return_mean_ci_high"]) == (10.0, 20.0)
    # seed 1 (returns 20) reaches 12 with a full window of 2 at its second episode (step 20);
    # seed 0 (returns 10) never does
    assert lam09["solved_fraction"] == 0.5
    assert lam09["median_steps_to_solve"] == 20.0
    # each seed's curve is NaN at step 0 then constant (10 and 20): AUCs 10 and 20, mean 15
    assert lam09["auc_mean"] == pytest.approx(15.0)
    scores = compare.seed_scores(episodes_frame(), final_window=2, points=5)
    assert scores["auc"].tolist() == pytest.approx([10.0, 20.0, 5.0])
    assert table["best"].tolist() == [True, False]


def test_summary_table_marks_every_group_tied_at_the_top():
    frame = episodes_frame()
    frame["return"] = 20.0  # every seed of both λ at the same level: nothing separates them
    table = compare.summary_table(frame, threshold=12.0, final_window=2, points=5)
    assert table["best"].tolist() == [True, True]


def test_episodes_frame_groups_runs_stored_before_a_field_by_the_behaviour_they_had(tmp_path):
    # A run stored before normalize_clip existed never clipped: grouping by the field puts it
    # with clip 0, next to a run stored with the field; pandas would drop a None group.
    from gae_core import metrics as M
    from gae_core.agent.config import TrainConfig
    from gae_core.storage.store import RunStore

    store = RunStore(tmp_path)
    new = TrainConfig(seed=1).to_dict()
    old = {k: v for k, v in TrainConfig(seed=2).to_dict().items() if k != "normalize_clip"}
    ids = [store.create_run(config) for config in (old, new)]
    for i, run_id in enumerate(ids):
        store.flush(run_id, [(M.EPISODIC_RETURN.key, 10 * (i + 1), 5.0 * i, 0.0)])
    frame = compare.episodes_frame(store, ids, "normalize_clip")
    assert frame.groupby("normalize_clip")["seed"].first().to_dict() == {0.0: 2, 10.0: 1}


def test_a_list_field_groups_whole_and_in_numeric_order(tmp_path):
    # A list stored in a config (hidden_sizes) is one group value: pandas would spread a list
    # over the rows (or fail), and its text would put 128x128 before 16x16.
    from gae_core.insight import compare_figures, provenance, stats
    from gae_core.storage.store import RunStore

    store = RunStore(tmp_path)
    ids = runs_of_three_widths(store)
    assert store.get_run(ids[0]).config["hidden_sizes"] == [128, 128]
    episodes = compare.episodes_frame(store, ids, "hidden_sizes")
    assert len(episodes) == 6 * 5
    table = compare.summary_table(episodes, group="hidden_sizes", final_window=5, points=5)
    widths = ["16x16", "64x64", "128x128"]
    assert table["hidden_sizes"].map(str).tolist() == widths
    assert table["final_return_mean"].tolist() == [16.5, 64.5, 128.5]
    assert table["best"].tolist() == [False, False, True]
    records = compare.summary_records(table, "hidden_sizes")
    assert [r["value"] for r in records] == [[16, 16], [64, 64], [128, 128]]
    bands, aligned = compare.aggregate_curves(episodes, group="hidden_sizes", points=5)
    figure, frame = compare_figures.comparison_figure(bands, aligned, group="hidden_sizes")
    names = [t.name for t in figure.data if t.showlegend is not False and t.name]
    assert names[::2] == [f"hidden sizes = {w} 95 % CI" for w in widths]
    assert frame["hidden_sizes"].map(str).unique().tolist() == widths
    assert frame.to_csv(index=False).splitlines()[1].startswith("16x16,")
    scores = compare.seed_scores(episodes, group="hidden_sizes", final_window=5, points=5)
    groups = {k: f["final_return"].to_numpy() for k, f in scores.groupby("hidden_sizes")}
    assert list(map(str, groups)) == widths
    matrix = stats.improvement_matrix(groups)
    wide_over_narrow = (matrix["x"].map(str) == "128x128") & (matrix["y"].map(str) == "16x16")
    assert matrix.loc[wide_over_narrow, "probability"].tolist() == [1.0]
    heatmap, _ = compare_figures.improvement_figure(matrix, "hidden_sizes", "final return")
    assert list(heatmap.data[0].x) == [f"hidden sizes = {w}" for w in widths]
    profile, _ = compare_figures.profile_figure(
        stats.performance_profile(groups), "hidden_sizes", "final return"
    )
    assert [t.name for t in profile.data if t.name] == [f"hidden sizes = {w}" for w in widths]
    record = provenance.methods_record(
        [store.get_run(r) for r in ids], "hidden_sizes", statistic="iqm", window=5
    )
    assert [g["value"] for g in record["groups"]] == [[16, 16], [64, 64], [128, 128]]


def test_the_form_warns_when_a_normalisation_setting_has_nothing_to_act_on():
    from gae_core.agent.config import TrainConfig
    from gae_core.insight.views import config_warnings

    def warned(**fields) -> list[str]:
        found = config_warnings(TrainConfig(**fields))
        return [w for w in found if "normalize clip" in w or "reward norm reset" in w]

    assert warned() == []  # the defaults say nothing, with or without normalisation
    assert warned(normalize_clip=5.0, normalize_observations=True) == []
    assert warned(reward_norm_reset="termination", normalize_rewards=True) == []
    (clip,) = warned(normalize_clip=5.0)
    assert clip.startswith("normalize clip = 5 has no effect")
    (reset,) = warned(reward_norm_reset="termination", normalize_observations=True)
    assert reset.startswith("reward norm reset = termination has no effect: normalize rewards")


@given(
    total=st.integers(1, 10**6),
    checkpoint_every=st.integers(0, 2 * 10**6),
    eval_every=st.integers(0, 2 * 10**6),
)
def test_spacing_fits_checkpoints_and_evaluations_to_a_short_budget(
    total, checkpoint_every, eval_every
):
    """Only what config_warnings calls too long is respaced: SPACED_CHECKPOINTS checkpoints and
    SPACED_EVALUATIONS evaluations, at least an update apart, inside the budget; 0 stays off;
    the respaced config has no such warning left (unless one update outruns the budget)."""
    import dataclasses

    from gae_core.agent.config import TrainConfig
    from gae_core.insight import views

    config = TrainConfig(total_steps=total, checkpoint_every=checkpoint_every,
                         eval_every=eval_every, num_envs=4, rollout_steps=8)  # fmt: skip
    spaced = views.spacing(config)
    short = {
        "checkpoint_every": 0 < checkpoint_every > total,
        "eval_every": 0 < eval_every >= total,
    }
    assert set(spaced) == {name for name, is_short in short.items() if is_short}
    for name, count in (("checkpoint_every", views.SPACED_CHECKPOINTS),
                        ("eval_every", views.SPACED_EVALUATIONS)):  # fmt: skip
        if name in spaced:
            assert spaced[name] == max(config.batch_size, total // count)
    respaced = dataclasses.replace(config, **spaced)
    if total >= views.SPACED_EVALUATIONS * config.batch_size:
        assert views.spacing(respaced) == {}
        assert not [w for w in views.config_warnings(respaced)
                    if "checkpoint every" in w or "eval every" in w]  # fmt: skip


def _stored(run_id: str, **fields):
    """A stored run as the provenance reads it (id, config, env steps, status)."""
    from types import SimpleNamespace

    from gae_core.agent.config import TrainConfig

    config = TrainConfig(**{"total_steps": 1000, **fields}).to_dict()
    return SimpleNamespace(id=run_id, config=config, env_steps=1000, status="finished", code=None,
                           created_at=0.0)  # fmt: skip


def test_statistics_name_the_code_this_process_loaded_not_the_checkout_now(monkeypatch):
    """A dashboard started at one commit keeps computing with the modules it loaded; the
    paragraph names that code (it read the checkout on disk, which may have moved on) and says
    when the checkout has changed since."""
    from gae_core import version
    from gae_core.insight import provenance

    runs = [_stored(f"r{s}", seed=s) for s in range(2)]
    now = version.source_version()
    loaded = {**now, "commit": "0123456789ab" + "0" * 28, "local_changes": False}
    monkeypatch.setattr(version, "LOADED", loaded)
    record = provenance.methods_record(runs, "lambda_")
    assert record["analysis_code"]["commit"] == loaded["commit"]
    text = provenance.methods_text(record)
    if now["commit"] is None:  # no git here: nothing to tell apart
        assert record["analysis_code"]["checkout_changed"] is None
        return
    assert record["analysis_code"]["checkout_changed"] is True
    assert text.endswith(
        f"Statistics computed with gae_core {gae_core.__version__} (commit 0123456789ab), "
        "which this process loaded; the checkout has changed since."
    )
    monkeypatch.setattr(version, "LOADED", now)  # the code on disk is what was loaded
    record = provenance.methods_record(runs, "lambda_")
    assert record["analysis_code"]["checkout_changed"] is False
    assert "changed since" not in provenance.methods_text(record)


def test_distinct_runs_counts_a_run_trained_twice_once_as_the_one_trained_furthest():
    from gae_core.insight import provenance

    first = _stored("first", seed=0)
    again = _stored("again", seed=0, eval_every=1000)  # bookkeeping differs: the same run
    again.env_steps, again.created_at = 1000, 5.0  # as far, later: kept
    short = _stored("short", seed=0)
    short.env_steps = 400
    other_seed, other_rate = _stored("s1", seed=1), _stored("lr", seed=0, learning_rate=1e-3)
    damaged = _stored("bad")
    damaged.config = {}
    kept, repeats = compare.distinct_runs(
        [first, again, short, other_seed, other_rate, damaged], "lambda_"
    )
    assert [r.id for r in kept] == ["again", "s1", "lr", "bad"]
    assert repeats == {"first": "again", "short": "again"}
    # a stored run missing a later field is the same run as one that stored its old value
    old = _stored("old", seed=0)
    old.config = {k: v for k, v in old.config.items() if k != "normalize_clip"}
    clipped = _stored("clip0", seed=0, normalize_clip=0.0)
    assert compare.distinct_runs([old, clipped], "lambda_")[1] == {"clip0": "old"}
    # a setting with no effect given the others (TrainConfig.idle_fields) does not tell runs
    # apart: the critic follows λ, so critic_lambda is unused; no normalisation, no clip
    idle = [_stored("a", seed=3, critic_lambda=0.5), _stored("b", seed=3, normalize_clip=2.0)]
    idle[1].env_steps = 10
    assert compare.distinct_runs(idle, "lambda_")[1] == {"b": "a"}
    used = [_stored("c", seed=3, critic_target="fixed_lambda", critic_lambda=0.5),
            _stored("d", seed=3, critic_target="fixed_lambda")]  # fmt: skip
    assert compare.distinct_runs(used, "lambda_")[1] == {}
    # grouped by the idle field itself, its values stay apart (they name the groups), and the
    # page can say how many runs it has no effect in
    assert compare.distinct_runs([*idle[:1], _stored("e", seed=3)], "critic_lambda")[1] == {}
    count, why = compare.idle_in(idle + used, "critic_lambda")
    # (the page's words: fields by their labels)
    assert (count, why) == (2, "critic target is advantage_lambda (the critic follows λ)")
    shared, varying = provenance.config_spread([r.config for r in idle[:1] + used], "critic_lambda")
    assert "critic_lambda" not in shared and varying["critic_target"]["crossed"] is False
    # the same config and seed made by other code is another run of that seed, not a repeat
    before, after = _stored("before", seed=0), _stored("after", seed=0)
    before.code = {"version": "0.2.0", "commit": "a" * 40, "local_changes": False}
    after.code = {**before.code, "commit": "b" * 40}
    assert compare.distinct_runs([before, after], "lambda_")[1] == {}
    after.code = dict(before.code)
    assert compare.distinct_runs([before, after], "lambda_")[1] == {"after": "before"}


def test_idle_fields_and_what_the_form_and_a_comparison_make_of_them():
    from gae_core.agent.config import PPO_FIELDS, TrainConfig
    from gae_core.insight import provenance
    from gae_core.insight.views import config_warnings

    assert set(TrainConfig(env_id="Pendulum-v1").idle_fields()) == {
        "critic_lambda", "normalize_clip", "reward_norm_reset", "sde_sample_freq", *PPO_FIELDS
    }  # fmt: skip
    assert set(TrainConfig(env_id="Pendulum-v1", algo="ppo").idle_fields()) == {
        "critic_lambda", "normalize_clip", "reward_norm_reset", "sde_sample_freq"
    }  # fmt: skip
    pendulum = TrainConfig(env_id="Pendulum-v1", critic_target="fixed_lambda",
                           normalize_rewards=True, algo="ppo", use_sde=True)  # fmt: skip
    assert pendulum.idle_fields() == {}
    # CartPole's policy is categorical: no Gaussian for log_std_init or gSDE to set up
    discrete = TrainConfig(env_id="CartPole-v1", critic_target="fixed_lambda",
                           normalize_rewards=True, algo="ppo")  # fmt: skip
    assert discrete.idle_fields() == dict.fromkeys(
        ("log_std_init", "use_sde", "sde_sample_freq"), "CartPole-v1's actions are discrete"
    )
    assert "log std init = -1 has no effect: CartPole-v1's actions are discrete." in (
        config_warnings(dataclasses.replace(discrete, log_std_init=-1.0))
    )
    only_obs = TrainConfig(
        env_id="Pendulum-v1",
        critic_target="fixed_lambda",
        normalize_observations=True,
        algo="ppo",
        use_sde=True,
    )
    assert list(only_obs.idle_fields()) == ["reward_norm_reset"]
    (warning,) = [w for w in config_warnings(TrainConfig(critic_lambda=0.9)) if "critic" in w]
    # the form names each field by its label, with its name where the label is other words
    assert warning == (
        "critic target λ (critic_lambda) = 0.9 has no effect: critic target is advantage_lambda "
        "(the critic follows λ)."
    )
    (epochs,) = [w for w in config_warnings(TrainConfig(n_epochs=3)) if "epochs" in w]
    assert epochs == (
        "epochs per rollout (n_epochs) = 3 has no effect: algorithm (algo) is a2c (one gradient "
        "step per rollout, no clipping)."
    )
    # two λ runs that differ only in an unused critic_lambda: no confound, and the paragraph
    # lists no value for it
    runs = [_stored("x", lambda_=0.9, critic_lambda=0.5), _stored("y", lambda_=1.0)]
    shared, varying = provenance.config_spread([r.config for r in runs], "lambda_")
    assert varying == {} and shared["critic_lambda"] is None
    text = provenance.methods_text(provenance.methods_record(runs, "lambda_"))
    assert "critic_lambda=" not in text and "normalize_clip=" not in text
    assert "critic_target=advantage_lambda" in text and "confound" not in text


def test_config_spread_names_what_varies_besides_the_group_seed_and_bookkeeping():
    from gae_core.agent.config import BOOKKEEPING_FIELDS
    from gae_core.insight import provenance

    configs = [
        _stored("a", lambda_=0.5, seed=0, learning_rate=1e-3).config,
        _stored(
            "b", lambda_=1.0, seed=1, learning_rate=1e-2, torch_threads=2, eval_every=500
        ).config,
    ]
    shared, varying = provenance.config_spread(configs, "lambda_")
    assert varying == {"learning_rate": {"values": [0.001, 0.01], "crossed": False,
                                         "one_where_it_applies": False}}  # fmt: skip
    assert shared["num_envs"] == configs[0]["num_envs"] and "learning_rate" not in shared
    assert set(shared) | set(varying) | {"lambda_", "seed", "torch_threads", "eval_every"} == set(
        configs[0]
    )
    assert {"torch_threads", "eval_every"} <= set(BOOKKEEPING_FIELDS)
    # grouped by the learning rate instead, λ is the confound
    assert provenance.config_spread(configs, "learning_rate")[1] == {
        "lambda_": {"values": [0.5, 1.0], "crossed": False, "one_where_it_applies": False}
    }
    # a second axis crossed alike with every λ is pooled, not a confound; numbers by value
    grid = [
        _stored("c", lambda_=lam, seed=0, num_envs=n).config
        for lam in (0.5, 1.0) for n in (16, 4, 8)
    ]  # fmt: skip
    assert provenance.config_spread(grid, "lambda_")[1] == {
        "num_envs": {"values": [4, 8, 16], "crossed": True, "one_where_it_applies": False}
    }
    assert provenance.config_spread(grid[:-1], "lambda_")[1]["num_envs"]["crossed"] is False
    # a run stored before critic_target existed reads as the behaviour it had, not a confound;
    # a damaged row (an empty config) is left out
    old = {k: v for k, v in configs[0].items() if k not in ("critic_target", "critic_lambda")}
    shared, varying = provenance.config_spread([old, configs[0], {}], "lambda_")
    assert varying == {} and shared["critic_target"] == configs[0]["critic_target"]
    # A2C beside PPO, grouped by algo: PPO's clip range varies only as algo does (no effect
    # under A2C), so it is no confound; a learning rate that differs is one
    pair = [_stored("a", algo="a2c").config, _stored("p", algo="ppo", learning_rate=1e-4).config]
    varying = provenance.config_spread(pair, "algo")[1]
    assert varying["clip_range"] == {"values": [0.2, None], "crossed": False,
                                     "one_where_it_applies": True}  # fmt: skip
    assert not provenance.is_confound(varying["clip_range"])
    assert provenance.is_confound(varying["learning_rate"])
    runs = [_stored("a", algo="a2c"), _stored("p", algo="ppo", learning_rate=1e-4)]
    text = provenance.methods_text(provenance.methods_record(runs, "algo"))
    confound = next(line for line in text.split(". ") if "(a confound)" in line)
    assert "learning_rate" in confound and "clip_range" not in confound
    assert "Set where it has an effect, one value there (no effect in the other runs): " in text


def test_the_methods_record_and_its_text_say_what_a_comparison_was_made_from():
    import json
    import subprocess
    from pathlib import Path

    from gae_core.insight import provenance, stats

    runs = [
        _stored(f"r{lam}{seed}", lambda_=lam, seed=seed, learning_rate=rate)
        for lam, rate in ((1.0, 1e-2), (0.5, 1e-3))
        for seed in (2, 0, 1)
    ]
    runs[0].status = "stopped"
    trained = {"package": "gae_core", "version": "0.2.0", "commit": "abcdef0123456789",
               "local_changes": False}  # fmt: skip
    for run in runs[2:]:  # the first two stored before runs recorded their code
        run.code = trained
    broken = _stored("x")
    broken.config = {}
    record = provenance.methods_record([*runs, broken], "lambda_", statistic="mean", window=10)
    record = json.loads(json.dumps(record, allow_nan=False))  # JSON as it is, no NaN
    assert record["groups"] == [
        {"value": 0.5, "seeds": [0, 1, 2], "runs": 3},
        {"value": 1.0, "seeds": [0, 1, 2], "runs": 3},
    ]
    assert [r["id"] for r in record["runs"]] == [r.id for r in runs]
    assert record["unreadable_runs"] == ["x"]
    settings = record["statistics"]
    assert (settings["resamples"], settings["confidence"], settings["bootstrap_seed"]) == (
        stats.RESAMPLES, stats.CONFIDENCE, stats.BOOTSTRAP_SEED
    )  # fmt: skip
    text = provenance.methods_text(record)
    assert "6 runs of A2C with GAE, λ ∈ {0.5, 1}, 3 seeds per value." in text
    assert "1 of them had not finished" in text
    assert "Also varying across the runs (a confound): learning_rate ∈ {0.001, 0.01}." in text
    assert (
        "Curves: the mean across seeds of each run's running mean of episodic return over 10"
        in text
    )
    assert stats.IQM_DEFINITION in text and stats.INTERVAL_DEFINITION in text
    assert f"{stats.RESAMPLES:,} resamples, seed {stats.BOOTSTRAP_SEED}" in text
    assert "each run's own λ" in text  # the field default: the critic's target follows λ
    # the critic held fixed, one learning rate, a run trained again: no confound, the repeat
    # left out and named
    held = [_stored(r.id, critic_target="fixed_lambda", lambda_=r.config["lambda_"],
                    seed=r.config["seed"]) for r in runs]  # fmt: skip
    held.append(_stored("dup", critic_target="fixed_lambda", lambda_=1.0, seed=0))
    held[-1].env_steps = 500
    kept, repeats = compare.distinct_runs(held, "lambda_")
    original = next(r.id for r in held if r.config["lambda_"] == 1.0 and r.config["seed"] == 0)
    assert repeats == {"dup": original} and [r.id for r in kept] == [r.id for r in held[:-1]]
    held_record = provenance.methods_record(kept, "lambda_", repeats=repeats)
    held_text = provenance.methods_text(held_record)
    assert "own λ" not in held_text and "confound" not in held_text and "Curves:" not in held_text
    assert "6 runs of A2C with GAE, λ ∈ {0.5, 1}, 3 seeds per value." in held_text
    assert f"which trained at least as far: dup → {original}." in held_text
    assert held_record["repeats"] == {"dup": original}
    # the code that computed it: the checkout's commit where git can tell
    code = record["analysis_code"]
    assert code["version"] == gae_core.__version__ and code["package"] == "gae_core"
    root = Path(provenance.__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10)  # fmt: skip
    except OSError:  # no git
        head = None
    if head is not None and head.returncode == 0 and (root / ".git").exists():
        commit = head.stdout.strip()
        assert code["commit"] == commit and f"(commit {commit[:12]}" in text
        assert isinstance(code["local_changes"], bool)
    else:
        assert code["commit"] is None
        assert text.endswith(f"Statistics computed with gae_core {gae_core.__version__}.")
    assert (
        "Runs created with gae_core 0.2.0 (commit abcdef012345); 2 stored before runs "
        "recorded their code. Statistics computed with gae_core" in text
    )
    assert record["created_with"] == [{"code": None, "runs": 2}, {"code": trained, "runs": 4}]
    assert "The runs do not record the code they were created with." in held_text


def test_the_auc_sentence_is_how_seed_scores_computes_it():
    """By hand, as the methods paragraph words it: the unsmoothed return (the last episode
    finished at or before each grid point), its area divided by the span from its first such
    point to the grid's end."""
    episodes = pd.DataFrame({
        "lambda_": 0.9, "seed": [0, 0, 0, 1, 1], "run_id": ["a", "a", "a", "b", "b"],
        "env_step": [10, 30, 60, 20, 70], "return": [1.0, 3.0, 5.0, 2.0, 4.0],
    })  # fmt: skip
    scores = compare.seed_scores(episodes, group="lambda_")
    grid = compare.step_grid([60, 70])  # to the shortest seed's last finished episode
    for seed, steps, returns in ((0, [10, 30, 60], [1.0, 3.0, 5.0]), (1, [20, 70], [2.0, 4.0])):
        index = np.searchsorted(steps, grid, side="right") - 1  # the last episode at or before
        keep = index >= 0
        x, y = grid[keep], np.asarray(returns)[index[keep]]
        expected = np.trapezoid(y, x) / (x[-1] - x[0])
        got = scores.loc[scores["seed"] == seed, "auc"].item()
        assert got == pytest.approx(expected, rel=1e-12)


def test_a_comparison_of_unfinished_runs_says_how_many_how_they_ended_and_where_curves_end():
    """A cancelled sweep: one run finished, one still training, one stopped, and one stopped
    before its first episode (the only run of λ = 0.99). The note counts them by status, says
    which are not drawn and which λ is left with none, and names the step the common grid
    ends at (the shortest drawn run's last episode), which is the grid aggregate_curves draws
    and every AUC is taken over; all finished: no note."""
    runs = [_stored("a", seed=0), _stored("b", seed=1), _stored("c", seed=2),
            _stored("d", seed=0, lambda_=0.99)]  # fmt: skip
    runs[1].status = "running"
    runs[2].status = runs[3].status = "stopped"
    episodes = pd.DataFrame(
        {
            "lambda_": 0.95,
            "seed": [0, 0, 1, 1, 2],
            "run_id": ["a", "a", "b", "b", "c"],
            "env_step": [400, 1000, 300, 700, 550],
            "return": [1.0, 2.0, 3.0, 4.0, 5.0],
        }
    )
    note = compare_notes.unfinished_note(runs, episodes, "lambda_")
    assert note == (
        "3 of these 4 runs have not finished their budget (1 running, 2 stopped); 1 finished "
        "no episode and is not drawn, which leaves λ = 0.99 with no run: the curves and every "
        "run's AUC end where the shortest drawn run's episodes end (550 env steps), and each "
        "run's final return is its last 100 episodes wherever it stopped."
    )
    bands, _ = compare.aggregate_curves(episodes, window=1)
    assert bands["env_step"].max() == 550 == compare.curve_end(episodes)
    # what the note claims: finished run "a"'s AUC stops at 550 (its return of 2 at step 1,000
    # is past it), its final return is its last episodes wherever it stopped (1 and 2)
    scores = compare.seed_scores(episodes).set_index("seed")
    assert scores.loc[0, "auc"] == 1.0 and scores.loc[0, "final_return"] == 1.5
    runs[3].config["lambda_"] = 0.95  # its λ has drawn runs: no λ is left out
    one = compare_notes.unfinished_note(runs[2:], episodes, "lambda_")
    assert one.startswith("2 of these 2 runs have not finished their budget (2 stopped); 1 ")
    assert "with no run" not in one
    assert compare_notes.unfinished_note(runs[3:], episodes.iloc[:0], "lambda_") == (
        "1 of these 1 runs has not finished its budget (1 stopped); 1 finished no episode "
        "and is not drawn, which leaves λ = 0.95 with no run."
    )
    runs[1].status = runs[2].status = runs[3].status = "finished"
    assert compare_notes.unfinished_note(runs, episodes, "lambda_") is None
    # all finished, on budgets that differ: the same consequence, said of budgets (the
    # configs' total_steps, not where the last episodes happened to end)
    assert compare_notes.budgets_note(runs, episodes) is None  # all of 1,000 steps
    runs[0].config["total_steps"] = 2000
    budgets = compare_notes.budgets_note(runs, episodes)
    assert budgets == (
        "These runs' budgets differ (1,000 to 2,000 env steps): the curves and every run's "
        "AUC end where the shortest run's episodes end (550 env steps), while each run's final "
        "return is its last 100 episodes at its own end."
    )
    runs[1].status = "running"  # (said by the unfinished note instead, once)
    assert compare_notes.budgets_note(runs, episodes) is None
    runs[1].status = "finished"
    assert compare_notes.budgets_note(runs[1:], episodes) is None  # (d is not drawn)
    # the page and `summary` give every note, in one order
    notes = compare_notes.comparison_notes(runs, episodes, "lambda_")
    assert notes[0] == budgets and notes[1].startswith("Only 3 seeds in the smallest group")
    assert notes[2].startswith("In 3 of these 3 runs the final return's last 100 episodes")
    assert len(notes) == 3


def test_the_form_reads_int_fields_typed_as_text_and_names_what_it_cannot_read():
    config, errors, _ = views.build_config({"seed": " 1,000 ", "total_steps": "2_000"})
    assert not errors and (config.seed, config.total_steps) == (1000, 2000)
    config, errors, _ = views.build_config({"seed": "99999999999999999999", "num_envs": "x"})
    assert config is None and errors == [
        "seed must be an integer in [0, 2147483647], got 99999999999999999999",
        "envs (num_envs) must be an integer in [1, 1024], got 'x'",
    ]


def test_a_sweeps_seeds_start_at_the_first_seed_typed_as_text():
    assert views.sweep_seeds("1,000", 3) == (range(1000, 1003), [])
    top = FIELD_SPECS["seed"].max
    assert views.sweep_seeds(str(top), 1) == (range(top, top + 1), [])
    for text, error in (
        ("seven", f"first seed must be an integer in [0, {top}], got 'seven'"),
        ("-1", f"first seed must be an integer in [0, {top}], got -1"),
        ("99999999999999999999",
         f"first seed must be an integer in [0, {top}], got 99999999999999999999"),
        ("9" * 5000,
         f"first seed must be an integer in [0, {top}], got '99999999999999999999…' "
         "(5,000 digits)"),
        (str(top), f"first seed + seeds per λ − 1 must be at most {top:,} (the largest seed), "
         f"got {top + 1:,}"),
    ):  # fmt: skip
        assert views.sweep_seeds(text, 2) == (range(0), [error]), text


def test_a_list_of_values_names_its_bad_ones_without_echoing_thousands():
    with pytest.raises(ConfigError, match=r"^λ values must be in \[0, 1\], got 1\.5, 2$"):
        views.parse_float_list("0.9, 1.5, 2", "λ values")
    pasted = ", ".join(str(2 + i) for i in range(5000))
    with pytest.raises(ConfigError) as caught:
        views.parse_float_list(pasted, "λ values")
    message = str(caught.value)
    assert message == "λ values must be in [0, 1], got 2, 3, 4, 5, 6, … (5,000 in all)"
    assert views.parse_float_list("0.9; 0.95,1", "λ values") == [0.9, 0.95, 1.0]
    # spaces separate values too, as on the command line
    assert views.parse_float_list(" 0.9 0.95\t1 ", "λ values") == [0.9, 0.95, 1.0]
    assert views.parse_float_list("0.9 ,  1", "λ values") == [0.9, 1.0]
    # what is not a number is named, quoted as typed, with what is out of range
    with pytest.raises(ConfigError) as caught:
        views.parse_float_list("0.9, 1.5, abc, 0,5x", "λ values")
    assert str(caught.value) == (
        "λ values must be numbers in [0, 1], separated by commas or spaces; not a number: "
        "'abc', '5x'; out of range: 1.5"
    )


@given(
    st.lists(
        st.tuples(st.sampled_from([*sorted(views.WATCHED), "loss/value", "perf/sps"]),
                  st.floats(0.0, 20.0, allow_nan=False)),
        min_size=1, max_size=40,
    ),
    st.floats(0.0, 20.0, allow_nan=False),
)  # fmt: skip
def test_live_charts_redraw_diagnostics_only_at_their_own_pace(rows, later):
    """A live run's rows as its charts draw them: the watched keys whole; another key's rows up
    to the last multiple of 5 s of the run's clock (all of them while none is that old); and
    rows logged later in the same 5 s leave the diagnostics' part unchanged, so those charts'
    figures are identical until the next multiple."""
    every = views.DIAGNOSTICS_EVERY_S
    frame = pd.DataFrame(rows, columns=["key", "wall_time"]).sort_values("wall_time")
    frame["value"] = range(len(frame))
    shown = views.live_snapshot(frame, every)
    cutoff = math.floor(frame["wall_time"].max() / every) * every
    for key, rows_of_key in frame.groupby("key"):
        drawn = shown[shown["key"] == key]
        if key in views.WATCHED or rows_of_key["wall_time"].min() > cutoff:
            expected = rows_of_key
        else:
            expected = rows_of_key[rows_of_key["wall_time"] <= cutoff]
        pd.testing.assert_frame_equal(drawn, expected)
    # a value-loss row logged later in the same window changes no diagnostic (unless the key
    # had no row old enough: a young key's charts show everything)
    stamp = frame["wall_time"].max() + later
    value_rows = frame[frame["key"] == "loss/value"]
    old_key = len(value_rows) and value_rows["wall_time"].min() <= cutoff
    if stamp > cutoff and math.floor(stamp / every) * every == cutoff and old_key:
        grown = pd.concat([frame, pd.DataFrame([("loss/value", stamp, -1)], columns=frame.columns)])
        again = views.live_snapshot(grown, every)
        pd.testing.assert_frame_equal(
            again[~again["key"].isin(views.WATCHED)], shown[~shown["key"].isin(views.WATCHED)]
        )
    assert views.live_snapshot(frame.iloc[:0], every).empty


def test_live_charts_keep_rows_without_a_finite_time():
    """A row whose time cannot be placed is drawn, not dropped; a frame with no finite time is
    returned whole."""
    frame = pd.DataFrame({"key": ["loss/value"] * 3, "wall_time": [1.0, np.nan, 7.0],
                          "value": [1.0, 2.0, 3.0]})  # fmt: skip
    assert views.live_snapshot(frame, 5.0)["value"].tolist() == [1.0, 2.0]  # 7 s: after 5 s
    unplaced = frame.assign(wall_time=np.nan)
    pd.testing.assert_frame_equal(views.live_snapshot(unplaced, 5.0), unplaced)


def test_a_comparison_says_a_run_trained_on_a_gpu_ran_there(monkeypatch):
    """On a machine without CUDA a stored ``device: cuda`` config still opens (it reads as a
    CPU config, test_explorer), but a comparison of such runs groups and describes them by
    where they ran: the completed and effective configs keep ``cuda``, and asking which runs
    have a field set to no effect still reads them."""
    import torch

    from gae_core.agent.config import TrainConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_gpu = {**TrainConfig().to_dict(), "device": "cuda"}
    assert compare.completed_config(on_gpu)["device"] == "cuda"
    assert compare.effective_config(on_gpu)["device"] == "cuda"
    assert compare.completed_config(TrainConfig().to_dict())["device"] == "cpu"

    class Run:
        config = on_gpu

    assert compare.idle_in([Run()], "critic_lambda")[0] == 1  # the field follows λ there


@given(
    lengths=st.lists(st.integers(1, 600), min_size=1, max_size=400),
    window=st.integers(1, 150),
)
def test_the_final_windows_share_of_a_run_is_the_steps_its_last_episodes_took(lengths, window):
    """``final_window_share``: (last step − the step before the window) / last step, 1 with no
    more than ``window`` episodes; episodes of one length ℓ over n episodes give window / n."""
    from gae_core.outcome import final_window_share

    steps = np.cumsum(lengths).tolist()
    share = final_window_share(steps, window)
    if len(steps) <= window:
        assert share == 1.0
    else:
        assert share == pytest.approx(sum(lengths[-window:]) / sum(lengths), rel=1e-12)
        assert 0.0 < share < 1.0
    n = len(lengths)
    even = final_window_share([lengths[0] * (i + 1) for i in range(n)], window)
    assert even == pytest.approx(min(1.0, window / n), rel=1e-12)


def test_a_comparison_says_where_a_runs_final_return_spans_most_of_its_training():
    """Short runs: the last 100 episodes reach back over most of a run, so its final return is
    not where its curve ends; the page says so, naming how many runs and the widest share."""

    def run(run_id: str, episodes: int, length: int) -> pd.DataFrame:
        steps = length * np.arange(1, episodes + 1)
        return pd.DataFrame({"lambda_": 0.9, "seed": 0, "run_id": run_id, "env_step": steps,
                             "return": np.ones(episodes)})  # fmt: skip

    long = run("a", 1000, 20)  # its last 100 episodes: 10 % of its steps
    assert compare_notes.final_window_note(long) is None
    short = pd.concat([long, run("b", 150, 20), run("c", 400, 20)]).sample(frac=1, random_state=0)
    note = compare_notes.final_window_note(short)  # (rows in any order: each run's by its steps)
    assert note.startswith(
        "In 1 of these 3 runs the final return's last 100 episodes span more than 50% of the "
        "run's env steps (up to 67%)"
    )
    assert compare_notes.final_window_note(short, most=0.2).startswith("In 2 of these 3 runs")


def test_only_choices_and_switches_decide_which_fields_have_no_effect():
    """The form greys idle fields from its choices and switches alone (pages/_ui._idle_now):
    no number field may change which fields are idle. Every number field at its lowest and
    highest value, on configs that cover every rule, leaves the idle set as it was."""
    from gae_core.agent.config import TrainConfig

    bases = [
        TrainConfig(
            env_id=env, algo=algo, critic_target=target, normalize_rewards=rewards, use_sde=sde
        )
        for env in ("CartPole-v1", "Pendulum-v1")
        for algo in ("a2c", "ppo")
        for target in ("advantage_lambda", "fixed_lambda")
        for rewards in (False, True)
        for sde in (False, True)
    ]
    numbers = [s for s in FIELD_SPECS.values() if s.kind in ("int", "float")]
    for base in bases:
        idle = set(base.idle_fields())
        for spec in numbers:
            for value in (spec.min, spec.max):
                if spec.name in ("minibatch_size",):  # (spans fields: kept within a rollout)
                    value = min(value, base.batch_size)
                try:
                    changed = dataclasses.replace(base, **{spec.name: value})
                except ConfigError:
                    continue  # (a value another field's range refuses: not a config)
                assert set(changed.idle_fields()) == idle, (spec.name, value)
