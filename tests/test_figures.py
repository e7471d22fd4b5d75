"""Figure builders: the frame returned is what the figure plots, downsampled and labelled."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gae_core
from gae_core import metrics as M
from gae_core.insight import compare, compare_figures, explorer, figures, stats


def long_metrics(n: int, key: str = M.EPISODIC_RETURN.key) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "env_step": np.arange(n) * 10,
            "wall_time": np.arange(n) * 0.5,
            "key": key,
            "value": np.arange(n, dtype=float),
        }
    )


def test_downsample_keeps_ends_and_caps_points():
    idx = figures.downsample_indices(100_000)
    assert len(idx) <= figures.MAX_POINTS and idx[0] == 0 and idx[-1] == 99_999
    assert np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(figures.downsample_indices(5), np.arange(5))


def test_smoothing_is_tensorboards_debiased_ema():
    # weight 0.5 on [1, 3]: last = 0.5, debias 0.5 → 1; then last = 0.25 + 1.5 = 1.75,
    # debias 1 − 0.25 = 0.75 → 2.3333
    np.testing.assert_allclose(figures.smooth(np.array([1.0, 3.0]), 0.5), [1.0, 7 / 3])
    np.testing.assert_allclose(figures.smooth(np.array([1.0, 3.0]), 0.0), [1.0, 3.0])
    with pytest.raises(ValueError, match="smoothing weight must be in"):
        figures.smooth(np.array([1.0]), 1.0)


def test_an_empty_metric_figure_says_so_instead_of_inventing_axes():
    empty = pd.DataFrame({"key": [], "env_step": [], "wall_time": [], "value": []})
    figure, frame = figures.metric_figure(empty, M.EPISODIC_RETURN.key)
    assert frame.empty and all(len(trace.x) == 0 for trace in figure.data)
    assert [a.text for a in figure.layout.annotations] == ["no points yet"]
    assert figure.layout.xaxis.showticklabels is False is figure.layout.yaxis.showticklabels
    one = pd.DataFrame({"key": [M.EPISODIC_RETURN.key], "env_step": [10], "wall_time": [0.1],
                        "value": [3.0]})  # fmt: skip
    figure, _ = figures.metric_figure(one, M.EPISODIC_RETURN.key)
    assert not figure.layout.annotations and figure.layout.xaxis.showticklabels is not False


def test_metric_figure_draws_a_downsample_and_exports_every_point():
    metrics = pd.concat([long_metrics(5000), long_metrics(3, M.VALUE_LOSS.key)])
    figure, frame = figures.metric_figure(metrics, M.EPISODIC_RETURN.key, smoothing=0.6)
    assert list(frame.columns) == [
        "env_step",
        "wall_time_s",
        "episodic_return",
        "episodic_return_smoothed",
    ]
    assert len(frame) == 5000  # the CSV: every logged point
    drawn = frame.iloc[figures.downsample_indices(len(frame))]
    assert len(figure.data[0].y) == len(drawn) <= figures.MAX_POINTS
    np.testing.assert_array_equal(figure.data[0].y, drawn["episodic_return"])
    np.testing.assert_array_equal(figure.data[1].y, drawn["episodic_return_smoothed"])
    _, by_time = figures.metric_figure(metrics, M.VALUE_LOSS.key, x="wall_time")
    assert by_time["value_loss"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="x must be one of"):
        figures.metric_figure(metrics, M.VALUE_LOSS.key, x="episodes")


def test_a_curve_of_few_points_is_not_smoothed():
    # 4 evaluations ending at 500: a moving average ended at 372 beside them
    metrics = long_metrics(4, M.EVAL_RETURN.key)
    figure, frame = figures.metric_figure(metrics, M.EVAL_RETURN.key, smoothing=0.6)
    assert len(figure.data) == 1 and not any(c.endswith("_smoothed") for c in frame.columns)
    _, overlay = figures.overlay_figure({"a": metrics}, M.EVAL_RETURN.key, smoothing=0.6)
    assert not any(c.endswith("_smoothed") for c in overlay.columns)
    many = long_metrics(figures.MIN_SMOOTHED_POINTS, M.EVAL_RETURN.key)
    figure, frame = figures.metric_figure(many, M.EVAL_RETURN.key, smoothing=0.6)
    assert len(figure.data) == 2 and "eval_return_smoothed" in frame.columns


def test_a_line_of_few_points_marks_them_so_one_evaluation_shows():
    """A run evaluated once (eval_every past its budget) has one point: a plain line draws
    nothing there, so lines of up to MARKED_POINTS points carry markers; long ones do not
    (markers per point slowed the live page)."""
    one = long_metrics(1, M.EVAL_RETURN.key)
    figure, frame = figures.metric_figure(one, M.EVAL_RETURN.key)
    assert len(frame) == 1 and figure.data[0].mode == "lines+markers"
    assert figure.layout.xaxis.range is None  # a point at step 0: Plotly's own range
    figure, _ = figures.metric_figure(one.assign(env_step=3_000), M.EVAL_RETURN.key)
    assert figure.layout.xaxis.range == (0, 3_150)  # whole env steps, not 2,999.5 to 3,000.5
    few = figures.MARKED_POINTS
    figure, _ = figures.metric_figure(long_metrics(few), M.EPISODIC_RETURN.key, smoothing=0.5)
    assert [t.mode for t in figure.data] == ["lines+markers"] * 2
    figure, _ = figures.metric_figure(long_metrics(few + 1), M.EPISODIC_RETURN.key)
    assert figure.data[0].mode == "lines"
    figure, _ = figures.overlay_figure(
        {"once": one, "long": long_metrics(5000, M.EVAL_RETURN.key)}, M.EVAL_RETURN.key
    )
    assert [t.mode for t in figure.data] == ["lines+markers", "lines"]


def test_overlay_has_one_trace_per_run():
    figure, frame = figures.overlay_figure(
        {"a": long_metrics(10), "b": long_metrics(20)}, M.EPISODIC_RETURN.key
    )
    assert [trace.name for trace in figure.data] == ["a", "b"]
    assert frame.groupby("run").size().to_dict() == {"a": 10, "b": 20}
    # every run its own colour, however many are overlaid
    many = {f"run {i}": long_metrics(5) for i in range(len(figures.RUN_COLORS))}
    figure, _ = figures.overlay_figure(many, M.EPISODIC_RETURN.key)
    colours = [trace.line.color for trace in figure.data]
    assert len(set(colours)) == len(colours) == len(figures.RUN_COLORS)


def _explorer(terminated, truncated, show=None, lambda_=0.95, t=0, gamma=0.9):
    """The explorer's figure and frames for a rollout of ones with these flags."""
    n = len(terminated)
    arrays = (np.ones(n, np.float32), np.linspace(0, 1, n).astype(np.float32),
              np.linspace(0.1, 1.1, n).astype(np.float32), np.asarray(terminated, bool),
              np.asarray(truncated, bool))  # fmt: skip
    table = explorer.advantage_table(*arrays, gamma=gamma, lambdas=[0.5, 1.0], ks=[1, 3])
    sweep = gae_core.gae_lambda_sweep(*arrays, gamma=gamma, lambdas=explorer.LAMBDA_GRID)
    figure, frames = figures.explorer_figure(table, sweep, show=show, lambda_=lambda_, t=t)
    return figure, frames, arrays


def test_explorer_figure_marks_each_boundary_kind():
    figure, frames, _ = _explorer([0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0])
    lines = [shape.line for shape in figure.layout.shapes]
    # terminated at t=1, truncated at t=3, end of rollout after t=5: three styles, drawn
    # across the step panels (values, advantages, the heat map), not the weights' k axis
    assert sorted((line.dash, line.color) for line in lines) == sorted(
        3 * [("solid", "#d62728"), ("dash", "#ff7f0e"), ("dot", "#7f7f7f")]
    )
    assert {shape.xref for shape in figure.layout.shapes} == {"x", "x2", "x3"}
    # advantages on their own axis, V on the top panel; δ never in termination red
    by_name = {trace.name: trace for trace in figure.data}
    assert by_name["V(s_t)"].yaxis == "y" and by_name["δ_t"].yaxis == "y3"
    assert by_name["δ_t"].line.color != "#d62728"
    steps = frames["steps"]
    assert "gae[lambda=0.5]" in steps and "k_step[k=3]" in steps and "delta" in steps
    names = [trace.name for trace in figure.data]
    assert "GAE λ = 0.5 (pinned)" in names and "Â^(3)" in names and "δ_t" in names


def test_each_estimator_keeps_its_colour_whatever_else_is_shown():
    flags = [0] * 6
    one, _, _ = _explorer(flags, flags, show=["delta", "gae[lambda=0.5]"])
    many, _, _ = _explorer(flags, flags, show=["delta", "k_step[k=3]", "gae[lambda=0.5]",
                                               "gae[lambda=1]"])  # fmt: skip
    color = {t.name: t.line.color for t in many.data if t.type == "scatter"}
    assert {t.name: t.line.color for t in one.data if t.type == "scatter"}.items() <= color.items()
    pinned = color["GAE λ = 1 (pinned)"], color["GAE λ = 0.5 (pinned)"]
    assert len({*pinned, color["Â^(3)"], color["δ_t"]}) == 4


def test_the_sliders_lambda_stands_out_from_pinned_ones_of_a_like_colour():
    # λ 0.95 on the slider and λ 1 pinned are both lime on viridis: the line style tells them
    figure, _, _ = _explorer([0] * 6, [0] * 6, show=["gae[lambda=1]"], lambda_=0.95)
    line = {t.name: t.line for t in figure.data if t.type == "scatter" and t.name != "V(s_t)"}
    assert (line["GAE λ = 0.95"].dash, line["GAE λ = 0.95"].width) == (None, 3.5)
    assert (line["GAE λ = 1 (pinned)"].dash, line["GAE λ = 1 (pinned)"].width) == ("longdash", 2)


def test_a_pinned_lambda_on_the_sliders_lambda_keeps_a_name_of_its_own():
    figure, _, _ = _explorer([0] * 6, [0] * 6, show=["gae[lambda=1]"], lambda_=1.0)
    names = [t.name for t in figure.data if t.type == "scatter"]
    assert names.count("GAE λ = 1") == 1 and names.count("GAE λ = 1 (pinned)") == 1


@settings(max_examples=15, deadline=None)
@given(
    flags=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12),
    lambda_=st.sampled_from([0.0, 0.37, 0.95, 1.0]),
    data=st.data(),
)
def test_every_slider_step_draws_that_lambdas_numbers(flags, lambda_, data):
    """A step of the chart's λ slider redraws in the browser from what the figure carries:
    GAE at that λ (gae_core's, to float32's precision), the heat map's marker at λ, and the
    weights of each Â^(k) at step t (estimator_weights) with the geometric (1−λ)λ^(k−1); the
    slider starts at ``lambda_``; every frame holds what any step draws."""
    terminated, truncated = zip(*flags, strict=True)
    t = data.draw(st.integers(0, len(flags) - 1))
    figure, frames, arrays = _explorer(terminated, truncated, lambda_=lambda_, t=t)
    (slider,) = figure.layout.sliders
    assert len(slider.steps) == len(explorer.LAMBDA_GRID)
    assert float(slider.steps[slider.active].label) == lambda_
    moving = slider.steps[0].args[2]
    assert [figure.data[i].name for i in moving][1:] == [
        "the slider's λ",
        "weight in GAE (tail in red)",
        "(1−λ)λ^(k−1)",
    ]
    horizon = int(explorer.steps_left(arrays[3], arrays[4])[t])
    for step in (*slider.steps[::25], slider.steps[-1]):
        lam = float(step.label)
        gae, marker, weight, geometric = step.args[0]["y"]
        expected = gae_core.gae(*arrays, gamma=0.9, lambda_=lam)
        np.testing.assert_allclose(gae, expected, rtol=1e-6, atol=1e-6)
        assert step.args[0]["name"][0] == f"GAE λ = {lam:g}"
        assert marker == [lam, lam]
        np.testing.assert_allclose(weight, gae_core.estimator_weights(lam, horizon), rtol=1e-6)
        k = np.arange(1, horizon + 1)
        np.testing.assert_allclose(geometric, (1 - lam) * lam ** (k - 1.0), rtol=1e-6, atol=1e-12)
        assert f"t = {t}, λ = {lam:g}" in step.args[1]["annotations[3].text"]
        steps = frames["steps"]
        np.testing.assert_allclose(steps[f"gae[lambda={lam:g}]"], expected, rtol=1e-6, atol=1e-6)
        shown = frames["weights"][frames["weights"]["lambda_"] == lam]
        np.testing.assert_allclose(shown["weight"], weight, rtol=1e-6)
    start = slider.steps[slider.active].args[0]["y"]
    np.testing.assert_allclose(figure.data[moving[0]].y, start[0], rtol=1e-6, atol=1e-6)
    heat = frames["heat"]
    assert len(heat) == len(explorer.LAMBDA_GRID) * len(flags)
    assert np.asarray(figure.data[moving[0] + 1].z).shape == (len(explorer.LAMBDA_GRID),
                                                               len(flags))  # fmt: skip


def test_metric_axes_never_degenerate_and_respect_display_ranges():
    assert figures.y_range(np.full(5, 500.0), None) == [450.0, 550.0]
    assert figures.y_range(np.zeros(3), None) == [-1.0, 1.0]
    assert figures.y_range(np.array([0.2, -40.0, 0.9]), (-1.0, 1.0)) == [-1.0, 1.0]
    assert figures.y_range(np.array([0.2, 0.6]), (-1.0, 1.0)) == pytest.approx([0.18, 0.62])
    assert figures.y_range(np.array([1.0, 2.0]), None) is None  # Plotly chooses
    # a value past the range (∞ too) is drawn at its edge: the axis reaches that edge
    assert figures.y_range(np.array([0.2, np.inf, 0.5]), (-1.0, 1.0)) == pytest.approx([0.185, 1.0])
    assert figures.y_range(np.array([0.2, -3.0, 0.5]), (-1.0, 1.0))[0] == -1.0
    metrics = long_metrics(50, M.EXPLAINED_VARIANCE.key)
    metrics["value"] = -1e6  # a terrible critic: still drawn on a readable axis
    figure, _ = figures.metric_figure(metrics, M.EXPLAINED_VARIANCE.key)
    assert list(figure.layout.yaxis.range) == [-1.0, 1.0]
    figure, _ = figures.metric_figure(long_metrics(5, M.VALUE_LOSS.key), M.VALUE_LOSS.key,
                                      log_y=True)  # fmt: skip
    assert figure.layout.yaxis.type == "log"


@pytest.mark.parametrize("smoothing", [0.0, 0.6])
def test_points_off_a_display_range_are_drawn_at_its_edge_and_counted(smoothing):
    """Explained variance below −1 is drawn at −1 (raw and smoothed lines), never off the
    axis, and the chart says how many points lie outside and the lowest; the CSV keeps every
    value as logged."""
    metrics = long_metrics(50, M.EXPLAINED_VARIANCE.key)
    values = np.linspace(0.9, -4.94, 50)  # the last points run off below −1
    metrics["value"] = values
    figure, frame = figures.metric_figure(metrics, M.EXPLAINED_VARIANCE.key, smoothing=smoothing)
    for trace in figure.data:
        drawn = np.asarray(trace.y, float)
        assert drawn.min() >= -1.0 and len(drawn) == 50
    np.testing.assert_array_equal(frame["explained_variance"], values)
    outside = int((values < -1).sum())
    (note,) = [a.text for a in figure.layout.annotations]
    assert note == (f"{outside} below -1 (lowest -4.94) of 50 points, drawn at the edge; the "
                    "CSV has their values")  # fmt: skip
    metrics.loc[0, "value"] = np.nan  # no point: neither drawn nor counted
    figure, _ = figures.metric_figure(metrics, M.EXPLAINED_VARIANCE.key, smoothing=smoothing)
    assert figure.layout.annotations[0].text.startswith(f"{outside} below -1 (lowest -4.94) of 49")
    metrics["value"] = np.linspace(0.9, -0.5, 50)  # all within: nothing said
    figure, _ = figures.metric_figure(metrics, M.EXPLAINED_VARIANCE.key, smoothing=smoothing)
    assert not figure.layout.annotations
    returns = long_metrics(50)
    returns["value"] = -values * 100  # no display range: drawn as logged
    figure, _ = figures.metric_figure(returns, M.EPISODIC_RETURN.key)
    np.testing.assert_array_equal(figure.data[0].y, -values * 100)


def test_comparison_draws_one_band_per_lambda():
    rows = [
        {
            "lambda_": lam,
            "seed": seed,
            "run_id": f"{lam}/{seed}",
            "env_step": step,
            "return": float(seed + step),
        }
        for lam in (0.9, 0.95, 1.0)
        for seed in (0, 1, 2)
        for step in (10, 20, 30)
    ]
    bands, aligned = compare.aggregate_curves(pd.DataFrame(rows), points=4, window=1)
    figure, frame = compare_figures.comparison_figure(bands, aligned, show_seeds=True)
    assert sum(trace.fill == "tonexty" for trace in figure.data) == 3
    assert {"seed_0", "seed_1", "seed_2", "center", "ci_low", "ci_high"} <= set(frame.columns)


def test_a_seed_with_several_runs_is_one_replicate_the_mean_of_its_runs():
    # λ 0.9 holds seed 0 twice (γ 0.9 and 0.99 pooled): runs that share a seed share initial
    # weights and env seeds, so they are one replicate, their mean (20), not two seeds, and not
    # one seed's episodes spliced together; seeds 1 and 10 stay themselves
    rows = [
        {"lambda_": 0.9, "seed": seed, "run_id": run, "env_step": step, "return": level}
        for seed, run, level in ((0, "g9", 10.0), (0, "g99", 30.0), (1, "one", 20.0),
                                 (10, "ten", 40.0))
        for step in (10, 20, 30)
    ]  # fmt: skip
    episodes = pd.DataFrame(rows)
    bands, aligned = compare.aggregate_curves(episodes, points=4, window=1, statistic="mean")
    assert bands["seeds"].max() == 3
    assert bands.set_index("env_step").loc[30, "center"] == pytest.approx(80.0 / 3)
    figure, frame = compare_figures.comparison_figure(bands, aligned, show_seeds=True)
    assert [c for c in frame.columns if c.startswith("seed_")] == ["seed_0", "seed_1", "seed_10"]
    assert frame.set_index("env_step").loc[30, "seed_0"] == 20.0
    assert sum((trace.name or "").endswith("seed 0") for trace in figure.data) == 1
    scores = compare.seed_scores(episodes, final_window=2, points=4)
    assert scores[["seed", "runs", "final_return"]].values.tolist() == [
        [0, 2, 20.0], [1, 1, 20.0], [10, 1, 40.0]
    ]  # fmt: skip
    table = compare.summary_table(episodes, threshold=25.0, final_window=2, points=4)
    assert table[["seeds", "runs"]].values.tolist() == [[3, 4]]
    assert table["final_return_mean"].iloc[0] == pytest.approx(80.0 / 3)  # over seeds
    # solving is counted over runs (g99 and ten reach 25 from their second episode, step 20)
    assert table["solved_fraction"].iloc[0] == 0.5
    assert table["median_steps_to_solve"].iloc[0] == 20.0


def test_a_seeds_auc_is_the_area_under_the_curve_drawn_for_it():
    # two runs of one seed, returns equal to the step, one finishing episodes from step 10, the
    # other from 60: the seed's drawn curve (their mean) starts at 60, and its AUC is that
    # curve's area over 60..100 divided by 40, i.e. 80 (the mean of the runs' own AUCs would
    # be 67.5: 55 and 80)
    rows = [
        {"lambda_": 0.9, "seed": 0, "run_id": run, "env_step": step, "return": float(step)}
        for run, first in (("early", 10), ("late", 60))
        for step in range(first, 101, 10)
    ]
    episodes = pd.DataFrame(rows)
    _, aligned = compare.aggregate_curves(episodes, points=11, window=1)
    drawn = aligned.set_index("env_step")["return"]
    assert drawn[50] != drawn[50] and drawn[60] == 60.0  # NaN until both runs have a value
    (auc,) = compare.seed_scores(episodes, points=11)["auc"]
    assert auc == pytest.approx(80.0)


def test_improvement_cells_with_one_seed_say_there_is_no_interval():
    # one seed in group 1.0: its cells give the probability and no interval, not "[1.00, 1.00]"
    matrix = stats.improvement_matrix({0.9: [1.0, 2.0, 3.0], 1.0: [5.0]})
    figure, _ = compare_figures.improvement_figure(matrix, "lambda_", "final return")
    cells = [t for row in figure.data[0].text for t in row if t]
    assert sorted(cells) == ["0.00<br>no interval", "1.00<br>no interval"]
    matrix = stats.improvement_matrix({0.9: [1.0, 2.0, 3.0], 1.0: [5.0, 6.0]})
    figure, _ = compare_figures.improvement_figure(matrix, "lambda_", "final return")
    assert all("[" in t for row in figure.data[0].text for t in row if t)


def test_the_lab_trade_off_csv_names_each_critic_in_its_critic_column():
    from gae_core.insight.lab_figures import trade_off_figure

    def estimators(shift: float) -> pd.DataFrame:
        params = [0.0, 0.5, 1.0]
        values = {q: [shift + p for p in params] for q in ("bias2", "variance", "mse")}
        bounds = {f"{q}_ci_{e}": v for q, v in values.items() for e in ("low", "high")}
        return pd.DataFrame({"kind": "gae", "param": params, **values, **bounds})

    frames = {"critic at step 10,000": estimators(0.0), "critic at step 50,000": estimators(1.0)}
    _, frame = trade_off_figure(frames)
    assert sorted(frame["critic"].unique()) == sorted(frames)  # labels, not a function's repr
    for critic, part in frame.groupby("critic"):
        mse = part[part["quantity"] == "mse"]["value"].to_numpy()
        assert list(mse) == list(frames[critic]["mse"])


def test_k_ticks_label_each_k_but_one_printed_over_a_larger_neighbour():
    """A log k axis ticks every measured k; a label closer than K_TICK_DECADES to the next
    labelled one (128 beside the segment L = 200) is left blank, the largest always kept."""
    from gae_core.insight.lab_figures import K_TICK_DECADES, _k_ticks

    ticks = _k_ticks([200, 1, 2, 4, 8, 16, 32, 64, 128])
    assert ticks["tickvals"] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 200.0]
    assert ticks["ticktext"] == ["1", "2", "4", "8", "16", "32", "64", "", "200"]
    assert _k_ticks([1, 2, 4, 256])["ticktext"] == ["1", "2", "4", "256"]
    ticks = _k_ticks(range(1, 40))
    labelled = [k for k, t in zip(ticks["tickvals"], ticks["ticktext"], strict=True) if t]
    assert labelled[-1] == 39 and all(
        np.log10(b / a) >= K_TICK_DECADES for a, b in itertools.pairwise(labelled)
    )
