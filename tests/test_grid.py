"""Two-axis studies (gae_core.insight.grid): axes, the cell table's statistics and marks on
synthetic studies with a known answer, the heat map drawing exactly the table, and the CLI's
``sweep --lambdas … --gammas …`` → ``summary`` round trip (a MuJoCo population sweep too)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest
from conftest import cli, cli_in_process

from gae_core.insight import compare, stats
from gae_core.insight.compare_figures import grid_figure
from gae_core.insight.grid import (
    MARKS,
    best_cell_sentence,
    cell_records,
    cell_table,
    study_axes,
)
from gae_core.labels import format_value
from gae_core.storage.store import RunStore


def _study(levels: dict[tuple[float, float], float], seeds: int = 6, episodes: int = 20,
           noise: float = 1.0, seed: int = 0) -> pd.DataFrame:  # fmt: skip
    """Episodes of a λ × γ study whose cell (λ, γ) returns ``levels[(λ, γ)]`` plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for (lam, gamma), level in levels.items():
        for s in range(seeds):
            for e in range(episodes):
                value = level + noise * rng.normal()
                rows.append({"lambda_": lam, "gamma": gamma, "seed": s, "env_step": (e + 1) * 100,
                             "run_id": f"{lam}-{gamma}-{s}", "return": value})  # fmt: skip
    return pd.DataFrame(rows)


def _plotly_array(value) -> np.ndarray:
    """A Plotly JSON array: nested lists, or Plotly 6's typed-array encoding with its shape."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(n) for n in str(value.get("shape", len(flat))).split(",")])
    return np.asarray(value, float)


def test_study_axes_puts_lambda_first_and_never_groups_by_seed():
    assert study_axes({"seed": [0, 1], "gamma": [0.9, 0.99]}) == ("gamma", None)
    assert study_axes({"seed": [0, 1], "gamma": [0.9], "lambda_": [0.9, 1.0]}) == (
        "lambda_", "gamma")  # fmt: skip
    assert study_axes({"gamma": [0.9, 0.99], "seed": [0], "lambda_": [0.9]}) == (
        "lambda_", "gamma")  # fmt: skip
    assert study_axes({"seed": [0, 1]}) == ("lambda_", None)
    assert study_axes({"hidden_sizes": [(8,)], "learning_rate": [1e-3]}) == (
        "hidden_sizes", "learning_rate")  # fmt: skip


def test_one_clearly_best_cell_and_two_tied_with_it_are_marked():
    levels = {(lam, g): 100.0 for lam in (0.0, 0.9, 1.0) for g in (0.98, 0.99)}
    levels[(0.9, 0.99)] = 200.0  # clearly best
    levels[(1.0, 0.99)] = 199.8  # tied with it: intervals of noise 1 overlap
    levels[(0.9, 0.98)] = 200.1 - 0.2  # tied too
    table = cell_table(_study(levels), "lambda_", "gamma")
    assert len(table) == 6 and list(table.columns[:5]) == ["lambda_", "gamma", "score", "seeds",
                                                           "runs"]  # fmt: skip
    marked = {(r.lambda_, r.gamma): (r.best, r.not_distinguishable) for r in table.itertuples()}
    best = [cell for cell, (b, _) in marked.items() if b]
    tied = sorted(cell for cell, (_, t) in marked.items() if t)
    assert len(best) == 1 and best[0] in {(0.9, 0.99), (1.0, 0.99), (0.9, 0.98)}
    assert sorted([*best, *tied]) == [(0.9, 0.98), (0.9, 0.99), (1.0, 0.99)]
    # every other cell's interval lies apart from the best one's
    top = table[table.best].iloc[0]
    for row in table[~table.best & ~table.not_distinguishable].itertuples():
        assert row.iqm_ci_high < top.iqm_ci_low or row.iqm_ci_low > top.iqm_ci_high


def test_one_seed_per_cell_marks_no_cell_as_distinguishable_or_not():
    levels = {(lam, 0.99): 100.0 for lam in (0.0, 0.5, 0.9, 1.0)}
    table = cell_table(_study(levels, seeds=1, noise=1.0), "lambda_", "gamma")
    assert table["best"].sum() == 1 and not table["not_distinguishable"].any()
    sentence = best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}")
    assert "one seed in a cell gives no interval" in sentence
    assert "lies apart" not in sentence
    top = table[table.best].iloc[0]
    assert f"(IQM {top['iqm']:,.1f}; one seed: no interval)" in sentence  # no [x, x]
    # no cell has an interval (not one of a single value, [x, x]): in the CSV an empty cell,
    # on hover the words
    bounds = ["iqm_ci_low", "iqm_ci_high", "mean_ci_low", "mean_ci_high"]
    assert table[bounds].isna().all().all() and table[["iqm", "mean"]].notna().all().all()
    figure, _ = grid_figure(table, "lambda_", "gamma")
    hover = [h for row in figure.data[0].customdata for h in row if h != "no scores"]
    assert len(hover) == 4 and all(h.count("(one seed: no interval)") == 2 for h in hover)
    assert all("1 seed" in h and "[" not in h for h in hover)


def test_a_cell_of_two_seeds_with_one_score_has_no_interval_to_tell_cells_apart():
    """The bounds, not the seed count, say whether a cell has an interval: a cell of two seeds
    whose second score is missing (NaN) has none, so nothing is marked ≈ against it and the
    sentence does not say the others lie apart from it."""
    from gae_core.insight import grid as grid_module

    table = pd.DataFrame({"lambda_": [0.9, 1.0], "gamma": [0.99, 0.99], "score": "auc",
                          "seeds": [2, 2], "iqm": [9.0, 5.0], "iqm_ci_low": [np.nan, 4.0],
                          "iqm_ci_high": [np.nan, 6.0], "mean": [9.0, 5.0]})  # fmt: skip
    grid_module._mark(table, higher=True)
    assert table["best"].tolist() == [True, False] and not table["not_distinguishable"].any()
    sentence = best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}")
    assert "lies apart" not in sentence and "which cells it beats cannot be told" in sentence


@pytest.mark.parametrize("seeds", [2, 4, 5])
def test_cells_apart_on_fewer_than_five_seeds_are_said_to_be_too_few_to_trust(seeds):
    """Two seeds a cell that lie apart give intervals that are their range, not their noise:
    the verdict says so below FEW_SEEDS (as the λ sentence does), and not from five up."""
    levels = {(lam, 0.99): 100.0 * lam for lam in (0.0, 0.5, 1.0)}
    table = cell_table(_study(levels, seeds=seeds, noise=1.0), "lambda_", "gamma")
    sentence = best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}")
    assert "every other cell's interval lies apart from it (2 cells)" in sentence
    few = f" — from only {seeds} seeds in a cell: too few for this interval to be trusted"
    assert (few in sentence) is (seeds < stats.FEW_SEEDS)


def test_one_tied_cell_is_named_in_the_singular():
    levels = {(lam, 0.99): 100.0 * lam for lam in (0.0, 0.5, 1.0)}
    levels[(0.5, 0.99)] = 100.0  # tied with λ = 1
    table = cell_table(_study(levels, seeds=5, noise=1.0), "lambda_", "gamma")
    sentence = best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}")
    assert "; 1 of the other 2 cells is not distinguishable from it" in sentence
    flat = {(lam, 0.99): 100.0 for lam in (0.0, 0.5, 1.0)}  # every cell alike: all tied
    table = cell_table(_study(flat, seeds=5, noise=1.0), "lambda_", "gamma")
    sentence = best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}")
    assert "; both other cells are not distinguishable from it" in sentence
    assert "too few" not in sentence  # none said apart: no clause


def test_cell_statistics_equal_the_one_axis_summary_of_that_cell():
    levels = {(lam, g): 10.0 * lam + g for lam in (0.5, 1.0) for g in (0.9, 0.99)}
    episodes = _study(levels, seeds=5, noise=3.0)
    table = cell_table(episodes, "lambda_", "gamma", score="auc")
    for row in table.itertuples():
        one = episodes[(episodes.lambda_ == row.lambda_) & (episodes.gamma == row.gamma)]
        scores = compare.seed_scores(one, group="lambda_")
        assert (row.seeds, row.runs) == (5, 5)
        assert (row.iqm, row.iqm_ci_low, row.iqm_ci_high) == pytest.approx(
            stats.bootstrap_ci(scores["auc"].to_numpy(), "iqm"))  # fmt: skip
        assert row.mean == pytest.approx(float(np.mean(scores["auc"])))


def test_steps_to_threshold_is_lower_is_better_and_censors_never_solved_seeds():
    rows = []
    # λ = 1 never reaches the threshold; λ = 0.5's runs stop after 3 episodes without it
    for lam, solve_at, length in ((0.5, None, 3), (0.9, 5, 12), (1.0, None, 12)):
        for s in range(4):
            for e in range(length):
                high = solve_at is not None and e >= solve_at + s % 2
                rows.append({"lambda_": lam, "gamma": 0.99, "seed": s, "run_id": f"{lam}-{s}",
                             "env_step": (e + 1) * 10, "return": 50.0 * high})  # fmt: skip
    episodes = pd.DataFrame(rows)
    table = cell_table(episodes, "lambda_", "gamma", score="steps_to_threshold",
                       threshold=40.0, final_window=2)  # fmt: skip
    figure, _ = grid_figure(table, "lambda_", "gamma")
    assert figure.data[0].reversescale is True  # lower is better: still bright is better
    stopped, fast, never = table.iloc[0], table.iloc[1], table.iloc[2]
    # solved when the last 2 episodes average ≥ 40: episode index solve_at + 1 (+1 odd seeds)
    assert fast["iqm"] == pytest.approx(np.mean([70, 80, 70, 80]))
    # never solved: counted at the study's end (step 120), a run stopped at 30 included, so
    # stopping early cannot look fast
    assert never["iqm"] == 120.0 and never["solved_fraction"] == 0.0
    assert stopped["iqm"] == 120.0 and stopped["solved_fraction"] == 0.0
    assert fast["best"] and not never["best"] and not stopped["best"]
    assert not never["not_distinguishable"]
    # no run reached the threshold anywhere: every cell is the study's end, none is best
    unsolved = episodes[episodes["lambda_"] != 0.9]
    table = cell_table(unsolved, "lambda_", "gamma", score="steps_to_threshold",
                       threshold=40.0, final_window=2)  # fmt: skip
    assert (table["iqm"] == 120.0).all() and not table["best"].any()
    assert not table["not_distinguishable"].any()
    assert best_cell_sentence(table, "lambda_", "gamma", lambda f, v: f"{f}={v}") == (
        "No run reached the env's threshold: every cell's score is the study's last step "
        "(censored), so no cell is best"
    )
    figure, _ = grid_figure(table, "lambda_", "gamma")
    assert not any("★" in t for row in figure.data[0].text for t in row)
    with pytest.raises(ValueError, match="needs the env's reward threshold"):
        cell_table(episodes, "lambda_", "gamma", score="steps_to_threshold")
    with pytest.raises(ValueError, match="score must be one of"):
        cell_table(episodes, "lambda_", "gamma", score="median")
    with pytest.raises(ValueError, match="second axis must differ"):
        cell_table(episodes, "lambda_", "lambda_")


def test_the_heat_map_draws_exactly_the_table():
    levels = {(lam, g): lam * 100 + g for lam in (0.0, 0.96, 1.0) for g in (0.96, 0.99, 0.995)}
    table = cell_table(_study(levels, seeds=4), "lambda_", "gamma")
    figure, frame = grid_figure(table, "lambda_", "gamma")
    pd.testing.assert_frame_equal(frame, table)
    heat = figure.data[0]
    assert list(heat.x) == [format_value(v) for v in (0.0, 0.96, 1.0)]
    assert list(heat.y) == [format_value(v) for v in (0.96, 0.99, 0.995)]
    for row in table.itertuples():
        i, j = [0.96, 0.99, 0.995].index(row.gamma), [0.0, 0.96, 1.0].index(row.lambda_)
        assert heat.z[i][j] == row.iqm
        interval = stats.estimate_text(row.iqm, row.iqm_ci_low, row.iqm_ci_high).split(" ", 1)[1]
        assert interval in heat.customdata[i][j]  # as every table prints it
        mark = "★ " if row.best else "≈ " if row.not_distinguishable else ""
        assert heat.text[i][j] == f"{mark}{row.iqm:,.4g}"
    assert heat.reversescale is False  # higher is better: bright is better
    assert json.loads(json.dumps(cell_records(table, "lambda_", "gamma")))[0]["lambda_"] == 0.0


def test_heat_map_cells_of_a_thousand_and_up_read_as_whole_numbers():
    """Env steps to a threshold (about 20,000 here) read "19,998" in a cell, not "2e+04", and
    the colour bar's ticks keep their digits."""
    levels = {(lam, 0.99): 20_000.0 - 3.0 * lam for lam in (0.0, 0.5, 1.0)}
    table = cell_table(_study(levels, seeds=4), "lambda_", "gamma")
    heat = grid_figure(table, "lambda_", "gamma")[0].data[0]
    for row in table.itertuples():
        j = [0.0, 0.5, 1.0].index(row.lambda_)
        mark = "★ " if row.best else "≈ " if row.not_distinguishable else ""
        assert heat.text[0][j] == f"{mark}{row.iqm:,.0f}" and "e+" not in heat.text[0][j]
    assert heat.colorbar.tickformat == ",.6~r"


def test_sweep_gammas_flag_expands_and_rejects_clearly(tmp_path):
    both = cli_in_process(tmp_path / "d", "sweep", "--gammas", "0.9", "--gamma", "0.99")
    assert both.returncode == 2 and "--gammas conflicts with --gamma" in both.stderr
    bad = cli_in_process(tmp_path / "d", "sweep", "--lambdas", "0.9", "--gammas", "0.9", "1.5")
    assert bad.returncode == 2 and "gamma" in bad.stderr and "1.5" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "extra"),
    [
        ("CartPole-v1", ["--num-envs", "2", "--rollout-steps", "8", "--total-steps", "1500"]),
        # a MuJoCo preset (normalisation on) trains as one population per worker
        ("HalfCheetah-v5", ["--num-envs", "2", "--total-steps", "2400", "--eval-every", "0"]),
    ],
)  # fmt: skip
def test_a_gamma_by_lambda_sweep_summarises_as_a_grid(tmp_path, env, extra):
    data = tmp_path / "data"
    done = cli(data, "sweep", "--env", env, "--lambdas", "0.9", "1", "--gammas", "0.95", "0.99",
               "--seeds", "0", "1", "--workers", "2", "--no-progress", "--json", *extra,
               timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    sweep_id = json.loads(done.stdout.strip().splitlines()[-1])["sweep_id"]
    with RunStore(data, recover=False) as store:
        runs = store.list_runs(sweep_id=sweep_id)
        grid = {(r.config["lambda_"], r.config["gamma"], r.config["seed"]) for r in runs}
        assert len(runs) == 8 and len(grid) == 8
        assert {r.status for r in runs} == {"finished"}
        episodes = compare.episodes_frame(store, [r.id for r in runs], "lambda_", also=("gamma",))
        threshold = runs[0].summary.reward_threshold
    table = cell_table(episodes, "lambda_", "gamma", threshold=threshold)
    expected = cell_records(table, "lambda_", "gamma")
    shown = cli(data, "summary", sweep_id, "--json")
    report = json.loads(shown.stdout.strip().splitlines()[-1])
    assert report["grid"]["x"] == "lambda_" and report["grid"]["y"] == "gamma"
    assert report["grid"]["cells"] == expected and len(expected) == 4
    text = cli(data, "summary", sweep_id)
    assert text.returncode == 0 and "γ × λ" in text.stdout and "★" in text.stdout
    assert MARKS["best"] in text.stdout
    swapped = json.loads(cli(data, "summary", sweep_id, "--group", "gamma", "--json").stdout)
    assert (swapped["grid"]["x"], swapped["grid"]["y"]) == ("gamma", "lambda_")
    by_flag = json.loads(cli(data, "summary", sweep_id[:6], "--group", "gamma", "--second",
                             "lambda", "--json").stdout)  # fmt: skip
    assert by_flag["grid"] == swapped["grid"]  # a field by its flag's words, a short id
    unknown = cli(data, "summary", sweep_id, "--second", "nope_field")
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "error: --second: unknown config field 'nope_field'; fields: algo, env_id, "
    ), unknown.stderr


@pytest.mark.slow
def test_the_compare_page_draws_a_gamma_by_lambda_sweep_as_a_heat_map(data_dir):
    from conftest import TINY, app

    from gae_core.agent.config import TrainConfig
    from gae_core.runs.sweep import grid_of, run_sweep

    store = RunStore(data_dir)
    base = TrainConfig(**{**TINY, "total_steps": 800})
    grid = grid_of(lambdas=[0.9, 1.0], seeds=[0, 1], gamma=[0.9, 0.99])
    sweep_id = run_sweep(store, base, grid, workers=2).sweep_id
    at = app("pages/compare.py")
    assert at.selectbox(key="cmp.sweep_pick").value == sweep_id
    # the sweep's other axis is the heat map's second axis without a click
    assert at.selectbox(key=f"cmp.second.{sweep_id}").value == "gamma"
    (heat,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
               if json.loads(c.proto.spec)["data"][0]["type"] == "heatmap"
               and "IQM of" in json.loads(c.proto.spec)["layout"]["title"]["text"]]  # fmt: skip
    runs = store.list_runs(sweep_id=sweep_id)
    episodes = compare.episodes_frame(store, [r.id for r in runs], "lambda_", also=("gamma",))
    expected = cell_table(episodes, "lambda_", "gamma", threshold=runs[0].summary.reward_threshold)
    z = _plotly_array(heat["data"][0]["z"])
    for row in expected.itertuples():
        i, j = [0.9, 0.99].index(row.gamma), [0.9, 1.0].index(row.lambda_)
        assert z[i, j] == pytest.approx(row.iqm)
    assert any(m.value.startswith("Best: λ = ") for m in at.markdown)
    # the AUC choice redraws the grid from the AUC
    at.segmented_control(key="cmp.grid_score").set_value("auc").run()
    assert not at.exception
    auc = cell_table(episodes, "lambda_", "gamma", score="auc")
    (heat,) = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
               if "IQM of AUC" in json.loads(c.proto.spec)["layout"]["title"]["text"]]  # fmt: skip
    z = _plotly_array(heat["data"][0]["z"])
    assert sorted(z.ravel()) == pytest.approx(sorted(auc["iqm"]))
