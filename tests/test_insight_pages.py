"""AppTest of the advantage explorer and the λ comparison with a tiny run and a tiny sweep."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (
    TINY,
    app,
    handing_to,
    runs_of_three_widths,
    said,
    said_plain,
    set_field,
    wait_until,
)

import gae_core
from gae_core import metrics as M
from gae_core.agent.config import FIELD_SPECS, TrainConfig
from gae_core.inert import to_csv
from gae_core.insight import compare, explorer, stats
from gae_core.insight.lab_figures import _k_ticks
from gae_core.lab import chain
from gae_core.labels import run_label
from gae_core.runs.sweep import grid_of, run_sweep
from gae_core.storage.store import RunStore
from gae_core.trajectory import Trajectory
from pages import _ui


@pytest.fixture
def recorded_run(data_dir):
    manager = _ui.manager()
    run_id = manager.start({**TINY, "total_steps": 1200, "checkpoint_every": 400})
    assert manager.wait(run_id, 60)
    return run_id


def plotly_values(values):
    """Plotly ≥ 6 sends numpy arrays as {"dtype", "bdata": base64}; plain lists otherwise."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=float)


def main_chart_trace(at, name):
    chart = next(c for c in at.get("plotly_chart") if "Advantage estimates" in c.proto.spec)
    spec = json.loads(chart.proto.spec)
    trace = next(d for d in spec["data"] if d.get("name") == name)
    return plotly_values(trace["y"])


def main_chart_slider(at):
    """The λ slider of the explorer's chart: its steps carry every λ's numbers to the browser."""
    chart = next(c for c in at.get("plotly_chart") if "Advantage estimates" in c.proto.spec)
    return json.loads(chart.proto.spec)["layout"]["sliders"][0]


def slider_gae(at, lambda_):
    """GAE at ``lambda_`` as the chart's slider draws it at that step."""
    step = next(s for s in main_chart_slider(at)["steps"] if float(s["label"]) == lambda_)
    return plotly_values(step["args"][0]["y"][0])


def slider_start(at) -> float:
    slider = main_chart_slider(at)
    return float(slider["steps"][slider.get("active", 0)]["label"])


@pytest.mark.slow
def test_explorer_renders_and_its_lambda_slider_carries_every_lambdas_gae(recorded_run, data_dir):
    """λ moves in the browser: the one chart's slider holds GAE at every λ of the grid, each
    equal to gae_core's on the recorded trajectory, and starts at the run's λ."""
    at = app("pages/explorer.py")
    store = RunStore(data_dir)
    assert at.selectbox(key="ex.run").value == recorded_run
    steps = store.checkpoint_steps(recorded_run)
    assert len(steps) >= 3
    at.multiselect(key="ex.pinned").set_value([]).run()
    assert not at.exception
    trajectory = Trajectory.from_bytes(store.trajectory_blobs(recorded_run, steps[-1])[0])
    arrays = (
        trajectory.rewards,
        trajectory.values,
        trajectory.next_values,
        trajectory.terminated,
        trajectory.truncated,
    )
    gamma = at.number_input(key="ex.gamma").value
    for lambda_ in (0.0, 0.3, 0.9, 1.0):
        expected = gae_core.gae(*arrays, gamma=gamma, lambda_=lambda_)
        np.testing.assert_allclose(slider_gae(at, lambda_), expected, rtol=1e-5, atol=1e-6)
    assert len(main_chart_slider(at)["steps"]) == len(explorer.LAMBDA_GRID)
    assert slider_start(at) == pytest.approx(store.get_run(recorded_run).config["lambda_"])
    assert len(at.get("plotly_chart")) == 1  # per-step panels, heat map and weights in one


@pytest.mark.slow
def test_explorer_csvs_say_which_run_checkpoints_trajectory_and_gamma_made_them(
    recorded_run, data_dir, monkeypatch
):
    handed: dict[str, pd.DataFrame] = {}
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))
    steps = RunStore(data_dir).checkpoint_steps(recorded_run)
    at = app("pages/explorer.py")
    at.selectbox(key="ex.critic").set_value(steps[0]).run()
    assert not at.exception
    gamma = at.number_input(key="ex.gamma").value
    assert set(handed) == {f"{recorded_run}_{s}.csv" for s in ("advantages", "gae_heatmap",
                                                                 "weights")}  # fmt: skip
    for name, frame in handed.items():
        made_by = frame.iloc[:, :5]
        assert list(made_by.columns) == ["run_id", "policy_step", "critic_step", "trajectory",
                                         "gamma"], name  # fmt: skip
        assert (made_by["run_id"] == recorded_run).all()
        assert (made_by["policy_step"] == steps[-1]).all()
        assert (made_by["critic_step"] == steps[0]).all()
        assert (made_by["trajectory"] == "recorded #0").all() and (made_by["gamma"] == gamma).all()


@pytest.mark.slow
def test_explorer_starts_each_run_at_its_own_gamma_lambda_and_last_checkpoint(
    recorded_run, data_dir
):
    """Keyed widgets keep their values when their defaults change: picking another run resets
    the ones the run sets (a slider moved on one run, or a λ = 0 trial's 0, stayed put)."""
    manager = _ui.manager()
    other = manager.start({**TINY, "total_steps": 800, "checkpoint_every": 400, "lambda_": 0.5,
                           "gamma": 0.95})  # fmt: skip
    assert manager.wait(other, 60)
    store = RunStore(data_dir)
    at = app("pages/explorer.py")
    first = at.selectbox(key="ex.run").value
    at.number_input(key="ex.gamma").set_value(0.5).run()
    for run_id in [r for r in (other, recorded_run) if r != first] + [first]:
        at.selectbox(key="ex.run").set_value(run_id).run()
        assert not at.exception
        config = store.get_run(run_id).config
        assert slider_start(at) == pytest.approx(config["lambda_"])
        assert at.number_input(key="ex.gamma").value == pytest.approx(config["gamma"])
        assert at.selectbox(key="ex.policy").value == store.checkpoint_steps(run_id)[-1]


@pytest.mark.slow
def test_explorer_draws_each_estimator_once_and_keeps_chips_sorted(recorded_run):
    """By default δ is drawn once: Â^(1) and GAE λ = 0 are δ itself, so neither is on by
    default; pinned λ and k chips stay in value order (the order of the lines' colours), and
    keeping them so draws no Streamlit warning about a default set twice."""
    import logging

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    keep = Keep()
    streamlit_log = logging.getLogger("streamlit")  # (Streamlit's loggers do not propagate)
    loggers = [streamlit_log, *(logging.getLogger(n) for n in logging.root.manager.loggerDict
                                if n.startswith("streamlit."))]  # fmt: skip
    for logger in loggers:
        logger.addHandler(keep)
    try:
        _draw_each_estimator_once_and_keep_chips_sorted()
    finally:
        for logger in loggers:
            logger.removeHandler(keep)
    assert not [m for m in logged if "default value but also had its value set" in m], logged


def _draw_each_estimator_once_and_keep_chips_sorted() -> None:
    at = app("pages/explorer.py")
    chart = next(c for c in at.get("plotly_chart") if "Advantage estimates" in c.proto.spec)
    names = [d.get("name") for d in json.loads(chart.proto.spec)["data"]]
    assert names.count("δ_t") == 1 and "Â^(1)" not in names
    assert not {"GAE λ = 0", "GAE λ = 0 (pinned)"} & set(names)  # nor pinned
    assert at.multiselect(key="ex.pinned").value == [1.0]
    assert at.multiselect(key="ex.ks").value == [10]
    at.multiselect(key="ex.pinned").set_value([0.9, 0.3, 1.0]).run()
    at.multiselect(key="ex.ks").set_value([50, 2]).run()
    assert at.multiselect(key="ex.pinned").value == [0.3, 0.9, 1.0]
    assert at.multiselect(key="ex.ks").value == [2, 50]
    # γ is shown at the precision it is used
    at.number_input(key="ex.gamma").set_value(0.99731).run()
    assert at.number_input(key="ex.gamma").value == 0.99731 and not at.exception
    assert at.query_params["gamma"] == "0.99731"  # what a copied link carries
    # γ out of [0, 1]: said under its name, and nothing drawn at another γ
    at.number_input(key="ex.gamma").set_value(1.5).run()
    assert said(at.error) == ["γ (gamma) must be in [0, 1], got 1.5"]
    assert not at.get("plotly_chart") and not at.exception
    assert "gamma" not in at.query_params  # a copied link does not carry it
    at.number_input(key="ex.gamma").set_value(0.9).run()
    assert not at.error and at.get("plotly_chart")


@pytest.mark.slow
def test_the_explorers_link_holds_gamma_and_the_fresh_episodes_seed(recorded_run, data_dir):
    """γ and a fresh episode's seed change every number on the page: a reload or a pasted
    link opens at the same ones, and a γ outside [0, 1] in a link falls back to the run's."""
    from streamlit.testing.v1 import AppTest

    at = app("pages/explorer.py")
    at.number_input(key="ex.gamma").set_value(0.95).run()
    at.selectbox(key="ex.source").set_value("fresh recording").run()
    at.text_input(key="ex.seed").set_value("5").run()
    assert not at.exception
    link = {name: at.query_params[name] for name in at.query_params}
    assert link["gamma"] in ("0.95", ["0.95"]) and link["seed"] in ("5", ["5"])
    pasted = AppTest.from_file("../dashboard.py", default_timeout=60)
    pasted.query_params.update(link)
    pasted.run()
    pasted.switch_page("pages/explorer.py").run()
    assert not pasted.exception
    assert pasted.number_input(key="ex.gamma").value == 0.95
    assert pasted.selectbox(key="ex.source").value == "fresh recording"
    assert pasted.text_input(key="ex.seed").value == "5"
    # back on a recorded episode the link holds no seed: it would carry over to another run
    pasted.selectbox(key="ex.source").set_value("recorded #0").run()
    assert "seed" not in pasted.query_params and "gamma" in pasted.query_params
    bad = AppTest.from_file("../dashboard.py", default_timeout=60)
    bad.query_params.update(run=recorded_run, gamma="7")
    bad.run()
    bad.switch_page("pages/explorer.py").run()
    run_gamma = RunStore(data_dir).get_run(recorded_run).config["gamma"]
    assert bad.number_input(key="ex.gamma").value == pytest.approx(run_gamma)


@pytest.mark.slow
def test_explorer_fresh_recording_and_early_critic(recorded_run, data_dir):
    """The page draws the seed-7 episode of the chosen policy, and V(s_t) of the chosen critic:
    the early checkpoint's values, not the policy's own."""
    at = app("pages/explorer.py")
    store = RunStore(data_dir)
    steps = store.checkpoint_steps(recorded_run)
    at.selectbox(key="ex.source").set_value("fresh recording").run()
    at.text_input(key="ex.seed").set_value("99999999999999999999").run()  # past 2^53: said
    assert said(at.error) == [
        "the fresh episode's seed must be an integer in [0, 2147483647], got 99999999999999999999"
    ]
    at.text_input(key="ex.seed").set_value("7").run()
    assert not at.exception and not at.error
    own = explorer.load_trajectory(store, recorded_run, steps[-1], fresh_seed=7)
    np.testing.assert_allclose(main_chart_trace(at, "V(s_t)"), own.values, rtol=1e-6)
    at.selectbox(key="ex.critic").set_value(steps[0]).run()
    assert not at.exception
    early = explorer.load_trajectory(
        store, recorded_run, steps[-1], fresh_seed=7, critic_step=steps[0]
    )
    np.testing.assert_array_equal(early.rewards, own.rewards)  # the same episode
    shown = main_chart_trace(at, "V(s_t)")
    np.testing.assert_allclose(shown, early.values, rtol=1e-6)
    assert not np.allclose(shown, own.values)  # a different critic
    gamma = at.number_input(key="ex.gamma").value
    arrays = (early.rewards, early.values, early.next_values, early.terminated, early.truncated)
    np.testing.assert_allclose(
        main_chart_trace(at, "δ_t"),
        gae_core.td_residuals(*arrays[:4], gamma=gamma),
        rtol=1e-5,
        atol=1e-6,
    )
    assert at.slider(key="ex.t").max == len(early) - 1


@pytest.mark.slow
def test_explorer_states_its_units_and_draws_values_in_reward_units(data_dir):
    """A run that scales rewards for learning: the page says so with the checkpoint's σ, and the
    V it draws is the critic's raw output times that σ (env reward units), like the rewards."""
    from gae_core.agent.recording import load_replay

    manager = _ui.manager()
    run_id = manager.start(
        {**TINY, "total_steps": 1200, "checkpoint_every": 600, "normalize_rewards": True}
    )
    assert manager.wait(run_id, 60)
    at = app("pages/explorer.py")
    assert not at.exception
    store = RunStore(data_dir)
    step = store.checkpoint_steps(run_id)[-1]
    config = TrainConfig.from_dict(store.get_run(run_id).config)
    replay = load_replay(config, store.load_checkpoint(run_id, step))
    assert replay.value_scale != pytest.approx(1.0)  # the run really scaled its rewards
    caption = " ".join(c.value for c in at.caption)
    assert f"σ = {replay.value_scale:.4g}" in caption and "env reward units" in caption
    bound = 10 * replay.value_scale  # the default normalize_clip, in env reward units
    assert f"clipped scaled rewards at ±10 (env rewards beyond ±{bound:.4g} now)" in caption
    trajectory = Trajectory.from_bytes(store.trajectory_blobs(run_id, step)[0])
    with torch.inference_mode():  # the critic's own output, in its scaled units
        raw = replay.model.values(replay.policy_input(trajectory.observations))
    np.testing.assert_allclose(
        main_chart_trace(at, "V(s_t)"),
        raw.numpy() * replay.value_scale,
        rtol=1e-4,
        atol=1e-5,
    )
    # without reward scaling the note says values and rewards share units, with no σ
    assert "σ" not in explorer.units_note({"normalize_rewards": False}, 1.0)
    # a run stored before normalize_clip existed never clipped, and the note does not say so
    assert "clipped" not in explorer.units_note({"normalize_rewards": True}, 2.0)


@pytest.mark.slow
def test_compare_validates_launches_a_sweep_and_draws_one_band_per_lambda(data_dir, monkeypatch):
    handed: dict[str, object] = {}
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    assert at.text_input(key="cmp.seeds").value == "10"  # a new study defaults to 10 seeds
    # the three study knobs explain themselves
    assert "in [0, 1]" in at.text_input(key="cmp.lambdas").help
    assert "about 10 seeds" in at.text_input(key="cmp.seeds").help
    assert "retried once" in at.text_input(key="cmp.workers").help
    # held (the default), the critic's target is the checkbox's: the form shows no field of its
    # own for it that would say otherwise; unchecked, the fields are back
    keys = lambda: {w.key for w in at.selectbox} | {w.key for w in at.number_input}  # noqa: E731
    assert at.checkbox(key="cmp.hold_critic").value
    assert not {"cmp.critic_target", "cmp.critic_lambda"} & keys()
    at.checkbox(key="cmp.hold_critic").uncheck().run()
    assert {"cmp.critic_target", "cmp.critic_lambda"} <= keys()
    at.checkbox(key="cmp.hold_critic").check().run()
    at.text_input(key="cmp.lambdas").set_value("0.5, 0.5, 1").run()
    assert "λ values: 0.5 given twice" in said(at.error)[0]  # duplicates reported
    at.text_input(key="cmp.lambdas").set_value("0.5, 1.5").run()
    assert "λ values must be in [0, 1], got 1.5" in said(at.error)[0]
    assert at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.lambdas").set_value("0.8, 1").run()
    at.text_input(key="cmp.seeds").set_value("2").run()
    largest = FIELD_SPECS["seed"].max
    at.text_input(key="cmp.first_seed").set_value(str(largest)).run()  # seeds past the largest
    assert (
        f"must be at most {largest:,} (the largest seed), got {largest + 1:,}"
        in (said(at.error)[0])
    )
    assert at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.first_seed").set_value("7").run()  # fresh replicates: seeds 7, 8
    at.text_input(key="cmp.workers").set_value("1").run()
    at.text_input(key="cmp.total_steps").set_value("1500").run()
    at.text_input(key="cmp.name").set_value("\x07 \x08").run()  # nothing printable: refused
    assert "sweep name cannot be empty" in said(at.error)[0]
    assert at.button(key="cmp.launch").disabled
    store = RunStore(data_dir)
    at.text_input(key="cmp.name").set_value("λ study").run()
    at.button(key="cmp.launch").click().run()
    assert not at.exception
    sweep_id = store.list_sweeps()[0].id
    assert store.get_sweep(sweep_id).name == "λ study"
    trials = store.list_runs(sweep_id=sweep_id)
    assert len(trials) == 4
    assert sorted(r.config["seed"] for r in trials) == [7, 7, 8, 8]
    assert all(r.name.startswith("λ study") for r in trials)
    # a λ study varies λ and nothing else: one critic target (the preset's λ) for every trial
    assert {(r.config["critic_target"], r.config["critic_lambda"]) for r in trials} == {
        ("fixed_lambda", 0.95)
    }
    assert sorted(r.config["lambda_"] for r in trials) == [0.8, 0.8, 1.0, 1.0]
    assert wait_until(lambda: store.get_sweep(sweep_id).status == "finished", 120)
    at.run()
    # Streamlit logs (once a process, with a stack) a widget given both a default and a state
    from streamlit.elements.lib import policies

    logged = []
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    monkeypatch.setattr(policies._LOGGER, "warning", lambda *args, **_: logged.append(args))
    at.button(key="cmp.go_compare").click().run()  # "Compare this sweep"
    assert not at.exception
    assert logged == []
    assert at.segmented_control(key="cmp.view").value == "Compare"
    assert at.selectbox(key="cmp.sweep_pick").value == sweep_id
    # sweeps are listed by name, env and date, not by id alone
    (listed,) = at.selectbox(key="cmp.sweep_pick").options
    name, algo, env, when = listed.split(" · ")
    assert name == store.get_sweep(sweep_id).name and env == "CartPole-v1"
    assert algo == {"a2c": "A2C", "ppo": "PPO"}[store.get_sweep(sweep_id).base_config["algo"]]
    assert dt.datetime.strptime(when, "%Y-%m-%d %H:%M")
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert sum(trace.get("fill") == "tonexty" for trace in spec["data"]) == 2
    assert "IQM across seeds, 95 % percentile-bootstrap band" in spec["layout"]["title"]["text"]
    assert [t["name"] for t in spec["data"] if t.get("fill") == "tonexty"] == [
        "λ = 0.8 95 % CI",
        "λ = 1 95 % CI",
    ]
    summary = at.dataframe[-1].value
    assert list(summary["λ"]) == ["0.8", "1"] and "final return IQM" in summary.columns
    # two seeds per λ: the page says why the intervals are wide
    assert any("Only 2 seeds in the smallest group" in w.value for w in at.warning)
    # a sentence per score: one λ beats the other, or (a coin flip at two seeds) ranks first
    sentences = [
        m.value for m in at.markdown if " beats λ =" in m.value or " ranks first" in m.value
    ]
    assert [s.split(":**")[0] for s in sentences] == [
        "**Final return",
        "**AUC (how fast it learned)",
    ]
    # what the figures were made from, to cite them: a paragraph and the record
    (methods,) = [c.value for c in at.code if c.value.startswith("4 runs of A2C")]
    assert "4 runs of A2C with GAE, λ ∈ {0.8, 1}, 2 seeds per value." in methods
    assert "critic_target=fixed_lambda, critic_lambda=0.95" in methods
    assert "confound" not in methods and not any("also differ" in w.value for w in at.warning)
    assert not any("not finished" in w.value for w in at.warning)
    # every CSV names its sweep (not its runs), the grouping and its own settings, ahead of
    # the columns it held before, unchanged
    every = {"sweep_id": sweep_id, "left_out": "", "group_by": "lambda_",
             "metric": M.EPISODIC_RETURN.key}  # fmt: skip
    settings = {
        "curves.csv": {"running_mean_episodes": 10, "x_axis": "env_step"},
        "bands.csv": {"running_mean_episodes": 10, "statistic": "iqm"},
        "summary.csv": {"final_return_episodes": 100, "reward_threshold": 475.0},
        "improvement.csv": {"score": "final_return"},
        "profile.csv": {"score": "final_return"},
    }
    # each saved as the sweep's: downloads of two sweeps do not overwrite each other
    settings = {f"sweep-{sweep_id}_{name}": own for name, own in settings.items()}
    assert set(handed) == set(settings)
    for name, own in settings.items():
        assert "run_ids" not in handed[name], name  # a sweep's trials are its id's to name
        for column, value in {**every, **own}.items():
            assert set(handed[name][column]) == {value}, (name, column, set(handed[name][column]))
    episodes = compare.episodes_frame(store, [r.id for r in trials], "lambda_")
    _, aligned = compare.aggregate_curves(episodes, group="lambda_", window=10)
    pd.testing.assert_frame_equal(handed[f"sweep-{sweep_id}_curves.csv"][list(aligned)], aligned)
    table = compare.summary_table(episodes, group="lambda_", threshold=475.0)
    table = table.replace([np.inf, -np.inf], np.nan)
    pd.testing.assert_frame_equal(handed[f"sweep-{sweep_id}_summary.csv"][list(table)], table)
    # a run marked stopped (a Stop before its budget would leave that status; its episodes
    # here reach the budget): the page says so, and where the curves and AUCs end
    store.finish_run(trials[0].id, "stopped")
    at.run()
    (note,) = [w.value for w in at.warning if "not finished its budget" in w.value]
    assert note.startswith("1 of these 4 runs has not finished its budget (1 stopped): ")
    end = compare.curve_end(compare.episodes_frame(store, [r.id for r in trials], "lambda_"))
    assert f"({end:,} env steps)" in note
    # left out on request: the note goes, and the figures hold the 3 finished runs
    leave_out = at.checkbox(key="cmp.finished_only")
    assert leave_out.label == "Leave out the 1 run that has not finished its budget"
    leave_out.check().run()
    assert not any("not finished" in w.value for w in at.warning)
    assert set(handed[f"sweep-{sweep_id}_summary.csv"]["left_out"]) == {trials[0].id}
    assert any(c.value.startswith("3 runs of A2C with GAE") for c in at.code)
    expected = compare.sweep_summary(store, sweep_id)
    cell = summary["final return IQM"].iloc[0]
    assert cell.startswith(f"{expected['final_return_iqm'].iloc[0]:,.1f} [")
    # the matrix and the profile are drawn from the score their titles name: τ spans that
    # score's seed values (from just below the lowest, so every profile starts at 1)
    episodes = compare.episodes_frame(store, [r.id for r in trials], "lambda_")
    seed_scores = compare.seed_scores(episodes, group="lambda_")
    for choice, name in (("final_return", "final return"), ("auc", "AUC")):
        at.segmented_control(key="cmp.pair_score").set_value(choice).run()
        assert not at.exception
        matrix, profile = (json.loads(c.proto.spec) for c in at.get("plotly_chart")[-2:])
        assert f"on {name}," in matrix["layout"]["title"]["text"]
        assert f"with {name} > τ" in profile["layout"]["title"]["text"]
        lines = [t for t in profile["data"] if t.get("mode") and not t.get("fill")]
        assert all(t.get("mode") == "lines" for t in profile["data"] if t.get("fill"))
        taus = np.concatenate([_array(t["x"]) for t in lines])
        low, high = seed_scores[choice].min(), seed_scores[choice].max()
        assert (taus.min(), taus.max()) == pytest.approx((low - 0.05 * (high - low), high))


def saved_as_picked(handed: dict, run_ids) -> dict:
    """The files ``handed`` for picked runs (not a sweep's, drawn earlier), by the names the
    pages gave, after checking each is saved as these runs' (``runs-<the first 8 hex digits of
    SHA-256 over their sorted ids>_``)."""
    digest = hashlib.sha256(" ".join(sorted(run_ids)).encode()).hexdigest()[:8]
    lead = f"runs-{digest}_"
    picked = {name: frame for name, frame in handed.items() if name.startswith("runs-")}
    assert picked and all(name.startswith(lead) for name in picked), (lead, list(handed))
    return {name.removeprefix(lead): frame for name, frame in picked.items()}


def _array(value):
    """A Plotly JSON array: a list, or Plotly 6's typed-array encoding."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value, float)


@pytest.mark.slow
def test_compare_groups_picked_runs_by_any_field(data_dir, monkeypatch):
    handed: dict[str, object] = {}
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))
    store = RunStore(data_dir)
    base = TrainConfig(**{**TINY, "total_steps": 800})
    run_sweep(store, base, grid_of(seeds=[0, 1], gamma=[0.9, 0.99]), workers=1)
    at = app("pages/compare.py")
    at.radio(key="cmp.source").set_value("pick runs").run()
    assert [i.value for i in at.info] == [
        "Pick runs to compare in the box above (at least two, from one environment)."
    ]  # not "no finished episodes in these runs"
    at.multiselect(key="cmp.runs").set_value([r.id for r in store.list_runs()]).run()
    at.selectbox(key="cmp.group").set_value("gamma").run()
    assert not at.exception
    summary = at.dataframe[-1].value
    assert isinstance(summary, pd.DataFrame) and sorted(summary["γ"]) == ["0.9", "0.99"]
    # 800 steps do not reach CartPole's 475: no median step to solve, and the cell says so
    assert summary["solved"].tolist() == ["0%"] * 2
    assert summary["median steps to solve"].tolist() == ["not reached"] * 2
    # … and in the CSV an empty cell, not "inf"
    exported = saved_as_picked(handed, [r.id for r in store.list_runs()])["summary.csv"]
    assert exported["median_steps_to_solve"].isna().all()
    assert "inf" not in to_csv(exported)
    assert not any("also differ" in w.value for w in at.warning) and not at.info
    # grouped by λ (one value here), γ varies alike within it: pooled, a seed's two runs (one
    # per γ, the same initial weights and env seeds) one replicate, their mean
    at.selectbox(key="cmp.group").set_value("lambda_").run()
    assert not at.exception
    assert any("γ also varies, alike in every λ group" in i.value for i in at.info)
    (methods,) = [c.value for c in at.code if c.value.startswith("4 runs of A2C")]
    assert "2 seeds per value (4 runs: a seed's runs count once, as their mean)." in methods
    assert "Crossed with it, alike in every group, and pooled: gamma ∈ {0.9, 0.99}." in methods
    shown = at.dataframe[-1].value
    assert shown[["seeds", "runs"]].values.tolist() == [[2, 4]]
    runs = store.list_runs()
    finals = {(r.config["seed"], r.config["gamma"]): r.summary.final_return for r in runs}
    per_seed = [(finals[(s, 0.9)] + finals[(s, 0.99)]) / 2 for s in (0, 1)]
    assert shown["final return mean"].iloc[0].startswith(f"{sum(per_seed) / 2:,.1f} [")
    # two more runs whose λ comes with its own learning rate: a confound the page names
    for lam, rate in ((0.5, 1e-3), (1.0, 1e-2)):
        config = dataclasses.replace(base, lambda_=lam, learning_rate=rate)
        run_sweep(store, config, grid_of(seeds=[0]), workers=1)
    confounded = [r.id for r in store.list_runs() if r.config["learning_rate"] in (1e-3, 1e-2)]
    at.run()  # the runs list now offers them
    at.multiselect(key="cmp.runs").set_value(confounded).run()
    assert not at.exception
    assert any(
        "These runs also differ in learning rate: the curves do not isolate λ" in w.value
        for w in at.warning
    )
    (methods,) = [c.value for c in at.code if c.value.startswith("2 runs of A2C")]
    assert "(a confound): learning_rate ∈ {0.001, 0.01}." in methods


def test_the_compare_page_keeps_the_runs_it_compares_and_its_grouping_in_the_url(data_dir):
    """``?source=runs&run=…&run=…&group=…`` opens the comparison of those runs grouped by that
    field (a link a colleague can open), and the user's changes are written back."""
    from streamlit.testing.v1 import AppTest

    ids = runs_of_three_widths(RunStore(data_dir))
    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.query_params.update(source="runs", run=ids[:4], group="hidden_sizes")
    at.run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception
    assert at.radio(key="cmp.source").value == "pick runs"
    assert at.multiselect(key="cmp.runs").value == ids[:4]
    assert at.selectbox(key="cmp.group").value == "hidden_sizes"
    assert at.dataframe[-1].value["hidden sizes"].tolist() == ["16x16", "128x128"]
    at.multiselect(key="cmp.runs").set_value(ids).run()
    at.selectbox(key="cmp.group").set_value("lambda_").run()
    assert not at.exception
    assert at.query_params["run"] == ids
    assert at.query_params["group"] in ("lambda_", ["lambda_"])
    assert at.query_params["source"] in ("runs", ["runs"])


def test_a_link_naming_a_sweep_compares_it_whatever_was_compared_before(data_dir):
    """After comparing picked runs grouped by a list field, the Train page's "Compare its
    sweep" link (``?source=sweep&sweep=…``) or a bare ``?sweep=…`` opens that sweep grouped by
    its own axis, not the picked runs or their grouping (the session's context)."""
    from streamlit.testing.v1 import AppTest

    store = RunStore(data_dir)
    ids = runs_of_three_widths(store)
    sweep_id = store.create_sweep({"lambda_": [0.9, 1.0]}, TrainConfig().to_dict(), name="S")
    for lam in (0.9, 1.0):
        trial = store.create_run(TrainConfig(lambda_=lam).to_dict(), sweep_id=sweep_id)
        store.flush(trial, [(M.EPISODIC_RETURN.key, 10, 0.0, 1.0)], env_steps=50)
    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.query_params.update(source="runs", run=ids[:2], group="hidden_sizes")
    at.run()
    at.switch_page("pages/compare.py").run()
    assert at.radio(key="cmp.source").value == "pick runs"
    for link in ({"source": "sweep", "sweep": sweep_id}, {"sweep": sweep_id}):
        at.query_params.clear()
        at.switch_page("pages/train.py").run()
        at.query_params.clear()
        at.query_params.update(link)
        at.switch_page("pages/compare.py").run()
        assert not at.exception
        assert at.radio(key="cmp.source").value == "a sweep", link
        assert at.selectbox(key="cmp.sweep_pick").value == sweep_id
        assert at.selectbox(key="cmp.group").value == "lambda_", link
        assert not any(i.value.startswith("The link names") for i in at.info)
    # a link to a sweep this folder does not hold says so, and which sweep is shown instead
    gone = AppTest.from_file("../dashboard.py", default_timeout=60)
    gone.query_params.update(source="sweep", sweep="nosuch")
    gone.run()
    gone.switch_page("pages/compare.py").run()
    assert not gone.exception and gone.selectbox(key="cmp.sweep_pick").value == sweep_id
    (note,) = [said_plain(i.value) for i in gone.info if i.value.startswith("The link names")]
    assert note.startswith("The link names a sweep this page cannot open: this data folder "
                           "holds no sweep 'nosuch' (deleted, or a link from another folder). "
                           "Showing S · A2C · CartPole-v1 · ")  # fmt: skip


def test_a_links_values_a_page_cannot_show_are_named_not_replaced_silently(recorded_run, data_dir):
    """A link to a run the page opens, with a checkpoint it lacks, a γ out of range, a λ off
    the chart's grid, an unknown view, status or run: each page says which value it cannot show,
    why, and what it shows instead."""
    from streamlit.testing.v1 import AppTest

    store = RunStore(data_dir)
    steps = store.checkpoint_steps(recorded_run)
    held = f"({steps[0]:,} to {steps[-1]:,} env steps)"
    recorded = len(store.trajectory_blobs(recorded_run, steps[-1]))
    sources = ", ".join([f"recorded #{i}" for i in range(recorded)] + ["fresh recording"])

    def notes(page: str, **link) -> tuple[AppTest, list[str]]:
        at = AppTest.from_file("../dashboard.py", default_timeout=60)
        at.query_params.update(link)
        at.run()
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, page
        said = [said_plain(i.value) for i in at.info if i.value.startswith("The link names")]
        return at, said

    at, said = notes("explorer", run=recorded_run, policy="999999", critic=["3", str(steps[0])],
                     trajectory="recorded #99", gamma="7", **{"lambda": "7"})  # fmt: skip
    assert at.selectbox(key="ex.policy").value == steps[-1]
    assert at.selectbox(key="ex.critic").value == steps[0]  # the link's one the run holds
    assert at.selectbox(key="ex.source").value == "recorded #0"
    assert at.number_input(key="ex.gamma").value == store.get_run(recorded_run).config["gamma"]
    assert said == [
        f"The link names policy '999999' this page cannot open: it is not one of this run's "
        f"checkpoints {held}. Showing {steps[-1]:,}.",
        f"The link names critic '3' this page cannot open: it is not one of this run's "
        f"checkpoints {held}. Showing {steps[0]:,}.",
        "The link names trajectory 'recorded #99' this page cannot open: this checkpoint's "
        f"trajectories are {sources}. Showing recorded #0.",
        "The link names gamma '7' this page cannot open: it must be a number in [0, 1]. "
        "Showing 0.99.",
        "The link names lambda '7' this page cannot open: it must be a number in [0, 1]. "
        "Showing 0.95.",
    ]
    assert at.query_params["policy"] in (str(steps[-1]), [str(steps[-1])])  # the link is fixed
    assert at.query_params["lambda"] in ("0.95", ["0.95"])  # λ too, though the browser moves it
    # that λ is the run's: another run chosen elsewhere (the lab) drops it from the session's
    # context, so the explorer reached from the sidebar opens that run at its own λ
    assert at.session_state["gae.context"]["lambda"] == ["0.95"]
    other = _ui.manager().start({**TINY, "total_steps": 400, "checkpoint_every": 400,
                                 "lambda_": 0.8})  # fmt: skip
    assert _ui.manager().wait(other, 60)
    at.query_params.clear()
    at.switch_page("pages/lab.py").run()
    at.selectbox(key="lab.run").set_value(other).run()
    assert not at.exception and at.query_params["run"] in (other, [other])
    assert "lambda" not in at.session_state["gae.context"]

    at, said = notes("lab", run=recorded_run, policy="x", view="bogus")
    assert at.selectbox(key="lab.policy").value == steps[-1]
    assert said == [
        f"The link names policy 'x' this page cannot open: it is not one of this run's "
        f"checkpoints {held}. Showing {steps[-1]:,}.",
        "The link names view 'bogus' this page cannot open: the views are per state, policy "
        "gradient. Showing per state.",
    ]

    at, said = notes("compare", source="runs", run=[recorded_run, "zzz"])
    assert at.multiselect(key="cmp.runs").value == [recorded_run]
    assert said == [
        "The link names run 'zzz' this page cannot open: this data folder holds no such run "
        f"(deleted, or a link from another folder). Showing {recorded_run}."
    ]
    at, said = notes("compare", source="runs", run=recorded_run, group="bogus")
    assert at.selectbox(key="cmp.group").value == "lambda_"
    assert said == ["The link names group 'bogus' this page cannot open: it is not a field "
                    "the runs can be grouped by. Showing λ."]  # fmt: skip
    at, said = notes("compare", source="bogus")
    assert said == ["The link names source 'bogus' this page cannot open: the sources are sweep, "
                    "runs. Showing sweep."]  # fmt: skip

    at, said = notes("runs", status=["finished", "done"])
    assert at.multiselect(key="runs.status").value == ["finished"]
    assert said == [
        "The link names status 'done' this page cannot open: the statuses are queued, running, "
        "stopped, finished, failed, interrupted. Showing finished."
    ]
    at, said = notes("runs", status="done")  # no status left: the filter shows them all
    assert said[0].endswith("Showing every status.")
    at, said = notes("compare", source="bogus", run=recorded_run)  # the runs the link names
    assert at.radio(key="cmp.source").value == "pick runs" and said[0].endswith("Showing runs.")
    # a good link says nothing (λ written "1" is 1.0)
    at, said = notes("explorer", run=recorded_run, policy=str(steps[0]), gamma="0.9",
                     **{"lambda": "1"})  # fmt: skip
    assert said == [] and at.number_input(key="ex.gamma").value == 0.9


def test_compare_groups_by_a_list_field_in_numeric_order(data_dir, monkeypatch):
    handed: dict[str, object] = {}
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))
    store = RunStore(data_dir)
    ids = runs_of_three_widths(store)
    # the first run trained again, less far: one replicate, counted once and named
    again = store.create_run(store.get_run(ids[0]).config)
    store.flush(again, [(M.EPISODIC_RETURN.key, 10, 0.0, 999.0)], env_steps=10)
    ids.append(again)
    at = app("pages/compare.py")
    at.radio(key="cmp.source").set_value("pick runs").run()
    at.multiselect(key="cmp.runs").set_value(ids).run()
    at.selectbox(key="cmp.group").set_value("hidden_sizes").run()
    assert not at.exception
    widths = ["16x16", "64x64", "128x128"]
    assert at.dataframe[-1].value["hidden sizes"].tolist() == widths
    assert at.dataframe[-1].value["seeds"].tolist() == [2, 2, 2]
    assert "runs" not in at.dataframe[-1].value  # one run per seed: no column to say so
    assert [i.value[:46] for i in at.info] == ["1 of these runs repeat another's config, seed "]
    # runs of a few episodes: their final returns span all of them, and the page says so
    assert any(w.value.startswith("In 6 of these 6 runs the final return's last 100 episodes")
               for w in at.warning)  # fmt: skip
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = [t["name"] for t in spec["data"] if t.get("fill") == "tonexty"]
    assert names == [f"hidden sizes = {w} 95 % CI" for w in widths]
    (methods,) = [c.value for c in at.code if c.value.startswith("6 runs of A2C")]
    assert "hidden sizes ∈ {16x16, 64x64, 128x128}, 2 seeds per value." in methods
    assert f"which trained at least as far: {again} → {ids[0]}." in methods
    # every CSV leads with what made it: the runs it compares (picked, not one sweep), the run
    # left out, the grouping, the metric and the settings its numbers depend on; its own
    # columns follow, unchanged
    at.selectbox(key="cmp.second.runs").set_value("lambda_").run()  # the grid's CSV too
    assert not at.exception
    drawn = " ".join(i for i in ids if i != again)
    every = {"run_ids": drawn, "left_out": again, "group_by": "hidden_sizes",
             "metric": M.EPISODIC_RETURN.key}  # fmt: skip
    curves = {"running_mean_episodes": 10, "x_axis": "env_step"}
    # (runs that never finished have no stored threshold: no solved columns, none said)
    scores = {"interval": stats.INTERVAL_DEFINITION, "reward_threshold": None}
    settings = {
        "curves.csv": curves,
        "bands.csv": {**curves, "statistic": "iqm", "interval": stats.INTERVAL_DEFINITION},
        "summary.csv": {**scores, "final_return_episodes": 100},
        "grid.csv": {**scores, "second_axis": "lambda_", "score": "final_return"},
        "improvement.csv": {"score": "final_return"},
        "profile.csv": {"score": "final_return"},
    }
    handed = saved_as_picked(handed, drawn.split())
    assert set(handed) == set(settings)
    for name, own in settings.items():
        made_by = {**every, **own}
        frame = handed[name]
        assert "sweep_id" not in frame, name
        for column, value in made_by.items():
            assert set(frame[column]) == {value}, (name, column, set(frame[column]))
        leading = [c for c in frame.columns if c in made_by and c not in ("score", "statistic")]
        assert list(frame.columns)[: len(leading)] == leading, name
    episodes = compare.episodes_frame(store, [i for i in ids if i != again], "hidden_sizes")
    _, aligned = compare.aggregate_curves(episodes, group="hidden_sizes", window=10)
    pd.testing.assert_frame_equal(handed["curves.csv"][list(aligned)], aligned)
    summary = compare.summary_table(episodes, group="hidden_sizes")
    summary = summary.replace([np.inf, -np.inf], np.nan)
    pd.testing.assert_frame_equal(handed["summary.csv"][list(summary)], summary)
    # grouped by a field these runs do not use, the page says the groups differ in name only
    at.selectbox(key="cmp.group").set_value("critic_lambda").run()
    assert not at.exception
    assert any(
        "has no effect in 6 of these runs, since critic target is advantage_lambda (the "
        "critic follows λ): those train alike" in w.value
        for w in at.warning
    )


@pytest.mark.slow
def test_a_launched_sweep_takes_the_progress_panel_from_the_one_shown_before(data_dir):
    """With an earlier sweep in the progress panel, Launch shows the new sweep's progress and
    its Cancel (the keyed box kept the earlier one, and the new sweep trained unseen), and
    Cancel (a click callback) stops its running trial, its trained steps kept."""
    store = RunStore(data_dir)
    earlier = run_sweep(store, TrainConfig(**TINY), grid_of(seeds=[0]), workers=1).sweep_id
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    assert at.selectbox(key="cmp.progress_sweep").value == earlier
    at.text_input(key="cmp.lambdas").set_value("1").run()
    budget = {**TINY, "total_steps": 5_000_000, "seeds": 1, "workers": 1}
    for key, value in budget.items():
        set_field(at, f"cmp.{key}", value).run()
    at.button(key="cmp.launch").click().run()
    assert not at.exception
    (launched,) = {s.id for s in store.list_sweeps()} - {earlier}
    assert at.selectbox(key="cmp.progress_sweep").value == launched
    # the link names the sweep just launched, and the Compare view opens on it
    assert at.query_params["sweep"] in (launched, [launched])
    at.segmented_control(key="cmp.view").set_value("Compare").run()
    assert at.selectbox(key="cmp.sweep_pick").value == launched
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    (trial,) = store.list_runs(sweep_id=launched)
    assert wait_until(lambda: store.get_run(trial.id).env_steps > 0, 60)
    at.run()
    at.button(key="cmp.cancel").click().run()
    assert not at.exception
    assert wait_until(lambda: store.get_sweep(launched).status == "cancelled", 60)
    stopped = store.get_run(trial.id)
    assert stopped.status == "stopped" and 0 < stopped.env_steps < 5_000_000


@pytest.mark.slow
def test_the_labs_cancel_stops_a_measurement_and_stores_nothing(recorded_run, data_dir):
    """Cancel (a click callback) ends a running measurement; the page says that nothing was
    stored (its message stays: no redraw takes it away), and nothing is."""
    at = app("pages/lab.py")
    store = RunStore(data_dir)
    at.selectbox(key="lab.run").set_value(recorded_run).run()
    for key, value in {"lab.states": 64, "lab.rollouts": 256, "lab.segment": 200}.items():
        at.text_input(key=key).set_value(str(value)).run()
    at.button(key="lab.start").click().run()
    assert not at.exception
    at.button(key="lab.cancel").click().run()
    assert wait_until(lambda: at.run() and any("Cancelled" in w.value for w in at.warning), 60)
    assert store.lab_records(recorded_run) == []


@pytest.mark.slow
def test_lab_page_measures_a_run_and_shows_the_stored_result(recorded_run, data_dir, monkeypatch):
    """From the explorer's link to a finished measurement: the page starts a job with the
    explorer's checkpoints, and after a reload draws the stored result, whose curves are the
    stored numbers, and each CSV button hands out its own chart's data."""
    from streamlit.testing.v1 import AppTest

    from gae_core.lab.jobs import measure_run
    from gae_core.lab.measure import LabResult, LabSettings

    handed: dict[str, object] = {}  # file name → what its button was given (read after the run)
    monkeypatch.setattr(_ui, "csv_button", handing_to(handed))

    at = app("pages/explorer.py")
    store = RunStore(data_dir)
    steps = store.checkpoint_steps(recorded_run)
    at.selectbox(key="ex.critic").set_value(steps[0]).run()
    at.button(key="ex.to_lab").click().run()
    assert not at.exception
    at.switch_page("pages/lab.py").run()  # AppTest stays on the page it was switched to
    assert at.selectbox(key="lab.policy").value == steps[-1]
    assert at.multiselect(key="lab.critics").value == [steps[0], steps[-1]]
    for key, value in {"lab.states": 4, "lab.rollouts": 4, "lab.k": 4, "lab.segment": 20}.items():
        at.text_input(key=key).set_value(str(value)).run()
    at.button(key="lab.start").click().run()
    assert not at.exception
    assert wait_until(lambda: len(store.lab_records(recorded_run)) == 2, 120)
    at.run()
    assert not at.exception
    stored = {
        r.critic_step: LabResult.from_json(store.load_lab_result(r.id))
        for r in store.lab_records(recorded_run)
    }
    # the stored measurement's label: each critic with its own λ*, in checkpoint order
    (label,) = at.selectbox(key="lab.stored").options
    critics = ", ".join(
        f"critic {step:,}: λ* = {stored[step].best_lambda():g}" for step in sorted(stored)
    )
    assert re.search(rf"{re.escape(critics)} · \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d$", label), label
    # the link names it (by its first critic's result), and a link naming another says so
    (shown,) = [r.id for r in store.lab_records(recorded_run) if r.critic_step == min(stored)]
    assert at.query_params["measurement"] in (shown, [shown])
    linked = AppTest.from_file("../dashboard.py", default_timeout=60)
    linked.query_params.update(run=recorded_run, measurement="nope")
    linked.run()
    linked.switch_page("pages/lab.py").run()
    assert linked.selectbox(key="lab.stored").value == shown
    assert [said_plain(i.value) for i in linked.info if i.value.startswith("The link names")] == [
        "The link names measurement 'nope' this page cannot open: it is not one of this run's "
        f"stored per-state measurements. Showing {label}."
    ]
    # a newer Measure stored meanwhile: the box moves to it, as it does for the gradient lens
    measure_run(store, recorded_run, critic_steps=[steps[0]], settings=LabSettings(
        gamma=0.9, states=2, rollouts=2, continuations=2, segment=5))  # fmt: skip
    at.run()
    newest = store.lab_records(recorded_run)[0].id
    assert at.selectbox(key="lab.stored").value == newest != shown
    assert at.query_params["measurement"] in (newest, [newest])
    at.selectbox(key="lab.stored").set_value(shown).run()  # the user's choice then stays
    at.run()
    assert at.selectbox(key="lab.stored").value == shown
    # the gradient lens has none stored: a link's measurement is said to be none of its own
    none = AppTest.from_file("../dashboard.py", default_timeout=60)
    none.query_params.update(run=recorded_run, view="policy gradient", measurement=shown)
    none.run()
    none.switch_page("pages/lab.py").run()
    assert [said_plain(i.value) for i in none.info if i.value.startswith("The link names")] == [
        f"The link names measurement '{shown}' this page cannot open: it is not one of this "
        "run's stored gradient measurements. Showing none."
    ]
    level = next(iter(stored.values())).settings.confidence
    assert any(
        f"Bands: {level * 100:g} % percentile bootstrap across the 4 states" in c.value
        for c in at.caption
    )
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    for step, result in stored.items():
        mse = next(
            plotly_values(t["y"]) for t in spec["data"]
            if t.get("name") == f"critic {step:,}" and t.get("xaxis") == "x3"
        )  # fmt: skip
        gae = result.estimators[result.estimators["kind"] == "gae"].sort_values("param")
        np.testing.assert_allclose(mse, gae["mse"], rtol=1e-9)
        # each critic's sentence: where its least MSE is, from its own numbers
        said = [m.value for m in at.markdown if m.value.startswith(f"critic {step:,}: Least")]
        best = f"Least MSE at λ = {result.best_lambda():g}:"
        assert len(said) == 1 and best in said[0], (said, best)
    # a band's outline is no series: Plotly marks the points of a trace under 20 points unless
    # told otherwise, and the k charts' bands (a few k values) drew coloured dots
    for chart in at.get("plotly_chart"):
        for trace in json.loads(chart.proto.spec)["data"]:
            if trace.get("fill"):
                assert trace.get("mode") == "lines", trace.get("name")
    # the k chart ticks each measured k (Plotly's own log ticks labelled 20 and 50 "2", "5")
    k_chart = json.loads(at.get("plotly_chart")[1].proto.spec)
    ks = sorted(next(iter(stored.values())).settings.ks)
    assert list(plotly_values(k_chart["layout"]["xaxis"]["tickvals"])) == ks
    # (a label printed over its larger neighbour is left blank: test_figures tests that rule)
    assert k_chart["layout"]["xaxis"]["ticktext"] == _k_ticks(ks)["ticktext"]
    # each button its own data (a late-bound `lambda: frame` gave three buttons the last one's)
    # each saved as the run's (downloads from two runs do not overwrite each other)
    assert all(name.startswith(f"{recorded_run}_") for name in handed), list(handed)
    frames = {name.removeprefix(f"{recorded_run}_"): f() if callable(f) else f
              for name, f in handed.items()}  # fmt: skip
    result = next(iter(stored.values()))
    lambdas = sorted(result.settings.lambdas)
    assert sorted(set(frames["lab_lambda.csv"]["param"])) == lambdas
    assert sorted(set(frames["lab_k.csv"]["param"])) == sorted(result.settings.ks)
    assert set(frames["lab_state.csv"]["state"]) == {0}  # the state on the slider
    critics = {f"critic {step:,}" for step in stored}
    for name, part in (("lab_per_state.csv", "per_state"), ("lab_states.csv", "states")):
        assert set(frames[name]["critic"]) == critics  # every critic's rows, named
        assert len(frames[name]) == sum(len(getattr(r, part)) for r in stored.values())
    # every CSV says what made it: the run, the policy checkpoint and the settings
    lab_frames = {name: frame for name, frame in frames.items() if name.startswith("lab_")}
    assert len(lab_frames) == 5
    for name, frame in lab_frames.items():
        assert list(frame.columns[:2]) == ["run_id", "policy_step"], name
        assert (frame["run_id"] == recorded_run).all() and (frame["policy_step"] == steps[-1]).all()
        assert (frame["states"] == 4).all() and (frame["segment"] == 20).all(), name
        assert (frame["horizon"] == result.horizon).all(), name  # H used, not the setting None
    assert set(frames["lab_state.csv"]["critic"]) <= critics


@pytest.mark.slow
def test_lab_inputs_out_of_range_are_said_in_words_and_block_measure(recorded_run):
    """An out-of-range box (states N = 100,000) reaches the page: one line naming the field and
    its range, Measure disabled, no cost estimate for settings that cannot run; fixing it
    brings both back."""
    at = app("pages/lab.py")
    assert not at.button(key="lab.start").disabled
    assert any("env steps" in c.value for c in at.caption)  # the cost estimate
    at.text_input(key="lab.states").set_value("100,000").run()
    assert not at.exception
    assert said(at.error) == ["states N must be an integer in [1, 4096], got 100000"]
    assert at.button(key="lab.start").disabled
    assert not any("env steps" in c.value for c in at.caption)
    # past 2^53 (a browser number box would refuse it with a red mark alone), or not a number
    at.text_input(key="lab.seed").set_value("99999999999999999999").run()
    assert said(at.error) == [
        "states N must be an integer in [1, 4096], got 100000",
        "seed must be an integer in [0, 2147483647], got 99999999999999999999",
    ]  # every problem at once, one an error
    at.text_input(key="lab.states").set_value("8").run()
    assert said(at.error) == [
        "seed must be an integer in [0, 2147483647], got 99999999999999999999"
    ]
    assert at.button(key="lab.start").disabled
    at.text_input(key="lab.seed").set_value("seven").run()
    assert said(at.error) == ["seed must be an integer in [0, 2147483647], got 'seven'"]
    at.text_input(key="lab.seed").set_value("7").run()
    assert not at.error and not at.button(key="lab.start").disabled
    assert any("env steps" in c.value for c in at.caption)


def test_lab_page_teaches_on_the_exact_chain(data_dir):
    at = app("pages/lab.py")
    at.radio(key="lab.mode").set_value("the exact chain").run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert "least MSE at λ = " in spec["layout"]["title"]["text"]
    before = spec["layout"]["title"]["text"]
    # Monte-Carlo points on the curves: the page's settings, sampled by gae_core
    c = chain.ChainSpec()
    pi = chain.policy_matrix(c, 0.6)
    critic = chain.critic_with_error(chain.exact_values(c, pi, 0.95)[0], 0.2, seed=0)
    grid = np.round(np.linspace(0, 1, 11), 2)
    sampled = chain.sampled_gae_moments(c, pi, critic, 0.95, c.start, 1, 8, grid, 2_000, 0)
    points = {t["name"].split(",")[0]: t for t in spec["data"] if t.get("mode") == "markers"}
    assert len(points) == 3, [t["name"] for t in spec["data"]]
    for quantity, trace in zip(("bias2", "variance", "mse"), points.values(), strict=True):
        np.testing.assert_allclose(plotly_values(trace["y"]), getattr(sampled, quantity))
        np.testing.assert_allclose(plotly_values(trace["x"]), grid)
    bars = points["MSE = bias² + variance"]["error_y"]["array"]
    np.testing.assert_allclose(plotly_values(bars), 2 * sampled.mse_se)  # ± 2 SE
    # the sentence says where the least MSE is and which side costs what
    exact = chain.exact_estimator_moments(
        c, pi, critic, 0.95, c.start, 1, 8, np.round(np.linspace(0, 1, 101), 2), np.array([1])
    )
    best = np.round(np.linspace(0, 1, 101), 2)[np.argmin(exact.gae.mse)]
    said = [m.value for m in at.markdown if m.value.startswith("Least MSE at")]
    assert len(said) == 1 and said[0].startswith(f"Least MSE at λ = {best:g}:"), said
    assert "below it the critic's bootstrap bias grows" in said[0]
    at.slider(key="lab.chain_error").set_value(0.0).run()  # the exact critic: no bias anywhere
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    bias2 = next(plotly_values(t["y"]) for t in spec["data"] if t["name"].startswith("bias"))
    assert np.abs(bias2).max() < 1e-20 and spec["layout"]["title"]["text"] != before
    # with no bias, every λ < 1 only loses: variance grows with λ, the least MSE is at 0
    said = [m.value for m in at.markdown if m.value.startswith("Least MSE at")]
    assert said[0].startswith("Least MSE at λ = 0:"), said


@pytest.mark.slow
def test_pages_open_on_the_selection_their_url_names_and_follow_the_users_run(
    recorded_run, data_dir
):
    """A link (``?run=…&policy=…&critic=…&lambda=…``) opens the explorer on that run,
    checkpoints and λ and writes changes back; a page reached without one opens on the run the
    user last looked at elsewhere, not on the newest; the explorer's "Measure this checkpoint"
    hands the lab its run and checkpoints; a URL naming what does not exist falls back."""
    from streamlit.testing.v1 import AppTest

    manager = _ui.manager()
    newest = manager.start({**TINY, "total_steps": 800, "checkpoint_every": 400, "seed": 5})
    assert manager.wait(newest, 60)
    store = RunStore(data_dir)
    steps = store.checkpoint_steps(recorded_run)

    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.query_params.update(run=recorded_run, policy=str(steps[1]), critic=str(steps[0]),
                           **{"lambda": "0.3"})  # fmt: skip
    at.run()
    at.switch_page("pages/explorer.py").run()
    assert not at.exception
    assert at.selectbox(key="ex.run").value == recorded_run  # not the newest run
    assert not any(i.value.startswith("The link names") for i in at.info)  # it opened it
    assert at.selectbox(key="ex.policy").value == steps[1]
    assert at.selectbox(key="ex.critic").value == steps[0]
    assert slider_start(at) == pytest.approx(0.3)
    at.selectbox(key="ex.critic").set_value(steps[1]).run()
    assert at.query_params["critic"] in (str(steps[1]), [str(steps[1])])  # changes reach the URL
    at.selectbox(key="ex.critic").set_value(steps[0]).run()
    assert at.query_params["run"] in (recorded_run, [recorded_run])

    at.button(key="ex.to_lab").click().run()
    at.switch_page("pages/lab.py").run()
    assert not at.exception
    assert at.selectbox(key="lab.run").value == recorded_run
    assert at.selectbox(key="lab.policy").value == steps[1]
    assert at.multiselect(key="lab.critics").value == [steps[0], steps[1]]

    # the URL changed under the same page (Back, a link to it): the page follows the URL
    at.switch_page("pages/explorer.py").run()
    at.query_params.update(run=newest, policy=str(store.checkpoint_steps(newest)[0]))
    at.run()
    assert not at.exception
    assert at.selectbox(key="ex.run").value == newest
    assert at.selectbox(key="ex.policy").value == store.checkpoint_steps(newest)[0]
    at.query_params.update(run=recorded_run, policy=str(steps[1]))
    at.switch_page("pages/lab.py").run()

    # no URL, e.g. from the sidebar: the train page opens on the run the user was looking at
    at.query_params.clear()
    at.switch_page("pages/train.py").run()
    assert not at.exception
    assert at.selectbox(key="train.view").value == recorded_run
    # its cross-page links carry it (a run of no sweep: no "compare its sweep")
    links = {link.proto.label: (link.proto.page, link.proto.query_string)
             for link in at.get("page_link")}  # fmt: skip
    assert links["Explore this run"] == ("explorer", f"run={recorded_run}"), links
    assert links["Measure it in the lab"] == ("lab", f"run={recorded_run}"), links
    assert "Compare its sweep" not in links
    # … and so does the Runs page, whose selection is in its URL too
    at.query_params.clear()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    assert at.query_params["run"] in (recorded_run, [recorded_run])
    assert at.text_input(key=f"runs.name.{recorded_run}")  # the run is open below the table

    fresh = AppTest.from_file("../dashboard.py", default_timeout=60)  # another tab, a bad link
    fresh.query_params.update(run="no-such-run", policy="123", gamma="5", **{"lambda": "abc"})
    fresh.run()
    fresh.switch_page("pages/explorer.py").run()
    assert not fresh.exception
    assert fresh.selectbox(key="ex.run").value == newest
    assert fresh.selectbox(key="ex.policy").value == store.checkpoint_steps(newest)[-1]
    # … and says so, rather than switching runs silently
    (note,) = [i.value for i in fresh.info if i.value.startswith("The link names")]
    shown = run_label(store.get_run(newest))
    assert said_plain(note) == ("The link names a run this page cannot open: this data folder "
                                "holds no run 'no-such-run' (deleted, or a link from another "
                                f"folder). Showing {shown}, at its own policy, gamma and lambda "
                                "(the link's were the run it names).")  # fmt: skip
    # a run the store holds but the page cannot open: what it lacks
    bare = store.create_run({**TINY}, name="no checkpoints")
    for page, lacking in (("explorer", "has no recorded trajectory to explore"),
                          ("lab", "has no readable checkpoint to replay")):  # fmt: skip
        linked = AppTest.from_file("../dashboard.py", default_timeout=60)
        linked.query_params.update(run=bare)
        linked.run()
        linked.switch_page(f"pages/{page}.py").run()
        assert not linked.exception
        notes = [said_plain(i.value) for i in linked.info if i.value.startswith("The link")]
        assert notes == [f"The link names a run this page cannot open: run '{bare}' {lacking}. "
                         f"Showing {run_label(store.get_run(newest))}."], page  # fmt: skip
    # the Train page lists every stored run: a deleted one's link
    gone = AppTest.from_file("../dashboard.py", default_timeout=60)
    gone.query_params.update(run="0123456789ab")
    gone.run()
    gone.switch_page("pages/train.py").run()
    assert any("holds no run '0123456789ab'" in said_plain(i.value) for i in gone.info)
    # a link may name a run by the start of its id, as the CLI and the exports take it: every
    # page opens the run, and the URL comes to hold its full id
    for page, key in (("explorer", "ex.run"), ("lab", "lab.run")):
        short = AppTest.from_file("../dashboard.py", default_timeout=60)
        short.query_params.update(run=recorded_run[:5])
        short.run()
        short.switch_page(f"pages/{page}.py").run()
        assert not short.exception
        assert short.selectbox(key=key).value == recorded_run, page
        assert not [i for i in short.info if i.value.startswith("The link")], page
        assert short.query_params["run"] in (recorded_run, [recorded_run])
    pasted = AppTest.from_file("../dashboard.py", default_timeout=60)  # a link to the Runs page
    pasted.query_params.update(run=recorded_run)
    pasted.run()
    pasted.switch_page("pages/runs.py").run()
    assert not pasted.exception
    assert pasted.text_input(key=f"runs.name.{recorded_run}")


def test_the_lab_shows_a_measurement_of_one_state_without_a_slider(recorded_run, data_dir):
    """A per-state measurement of one state (``states`` allows 1): its page draws that state,
    with no slider (a slider needs two positions)."""
    from streamlit.testing.v1 import AppTest

    from gae_core.lab.jobs import measure_run
    from gae_core.lab.measure import LabSettings

    store = RunStore(data_dir)
    measure_run(store, recorded_run, settings=LabSettings(
        gamma=0.9, states=1, rollouts=2, continuations=2, segment=5))  # fmt: skip
    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.query_params.update(run=recorded_run)
    at.run()
    at.switch_page("pages/lab.py").run()
    assert not at.exception, at.exception
    assert "state: 0 (the only one)" in [c.value for c in at.caption]
    assert not [s for s in at.slider if s.key == "lab.result.state"]
    assert any("One state" in h.value for h in at.subheader)


def test_a_lab_job_that_ended_unseen_shows_in_any_session_once(recorded_run, data_dir):
    """The sidebar's way back to an ended measurement leads to a lab page that shows how it
    ended, from any session (a reload, another tab), and the sidebar then lets it go; later
    only the sessions that started it or watched it keep its message. A session that opened
    the page while it measured shows its end when it comes."""
    import threading

    from streamlit.testing.v1 import AppTest

    from gae_core.lab.jobs import LabJob

    release = threading.Event()

    def fails(store, run_id, progress, cancel, **options):
        release.wait(30)
        raise ValueError("no checkpoint to measure")

    def lab_session() -> AppTest:
        at = AppTest.from_file("../dashboard.py", default_timeout=60)
        at.query_params.update(run=recorded_run)
        at.run()
        at.switch_page("pages/lab.py").run()
        assert not at.exception, at.exception
        return at

    said = ["ValueError: no checkpoint to measure"]
    jobs = _ui.lab_jobs()
    try:
        jobs[recorded_run] = job = LabJob(None, recorded_run, measure=fails)
        watcher = lab_session()  # opened while it measures: shows the progress
        # no progress yet: no time to say, and the bar says when there will be one
        texts = [p.proto.text for p in watcher.get("progress")]
        assert texts == ["measuring… ETA once the first rollouts are in"], texts
        release.set()
        assert job.wait(10) and not job.seen
        other = lab_session()  # neither started nor watched it
        assert [e.value for e in other.error] == said and job.seen
        assert not lab_session().error  # shown once: a later visit has nothing to say
        watcher.run()  # the session that watched it running keeps its end
        assert [e.value for e in watcher.error] == said
        starter = AppTest.from_file("../dashboard.py", default_timeout=60)
        starter.session_state["lab.job"] = recorded_run  # as its Measure set it
        starter.query_params.update(run=recorded_run)
        starter.run()
        starter.switch_page("pages/lab.py").run()
        assert [e.value for e in starter.error] == said
    finally:
        release.set()
        jobs.clear()
