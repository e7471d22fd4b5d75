"""Study statistics (gae_core.insight.stats): closed forms, small exact cases, properties."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gae_core.insight import stats

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([5.0], 5.0),
        ([1.0, 9.0], 5.0),
        ([1.0, 2.0, 9.0], 4.0),  # ⌊3/4⌋ = 0 cut: the mean
        ([0.0, 2.0, 4.0, 100.0], 3.0),  # ⌊4/4⌋ = 1 cut each end: mean of 2 and 4
        ([0.0, 1.0, 2.0, 3.0, 100.0], 2.0),  # 1 cut each end: mean of 1, 2, 3
        ([-50.0, 1.0, 2.0, 3.0, 4.0, 60.0], 2.5),
        ([-9.0, 0.0, 1.0, 2.0, 3.0, 4.0, 9.0], 2.0),
        ([-9.0, -8.0, 1.0, 2.0, 3.0, 4.0, 9.0, 10.0], 2.5),  # ⌊8/4⌋ = 2 cut each end
    ],
)
def test_iqm_by_hand(scores, expected):
    assert stats.iqm(np.array(scores)) == pytest.approx(expected)
    assert stats.iqm(np.random.default_rng(0).permutation(scores)) == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=2, max_size=12), st.sampled_from(["iqm", "mean"]))
def test_bootstrap_interval_never_leaves_the_data(scores, statistic):
    point, low, high = stats.bootstrap_ci(scores, statistic, resamples=300, seed=1)
    assert min(scores) - 1e-9 <= low <= point + 1e-9
    assert point - 1e-9 <= high <= max(scores) + 1e-9


def test_bootstrap_is_deterministic_and_handles_edges():
    scores = [1.0, 4.0, 2.0, 8.0, np.nan]
    assert stats.bootstrap_ci(scores, "mean", seed=3) == stats.bootstrap_ci(scores, "mean", seed=3)
    assert stats.bootstrap_ci(scores, "mean")[0] == pytest.approx(3.75)  # NaN dropped
    assert stats.bootstrap_ci([7.0], "iqm") == (7.0, 7.0, 7.0)
    assert stats.bootstrap_ci([2.0, 2.0, 2.0], "iqm") == (2.0, 2.0, 2.0)
    assert all(np.isnan(stats.bootstrap_ci([], "mean")))
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.5"):
        stats.bootstrap_ci([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match="resamples must be an integer >= 1, got 0"):
        stats.bootstrap_ci([1.0, 2.0], resamples=0)
    with pytest.raises(ValueError, match="statistic must be one of"):
        stats.bootstrap_ci([1.0, 2.0], "median")


def test_percentile_interval_of_the_mean_covers_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for i in range(200):
        _, low, high = stats.bootstrap_ci(rng.normal(3.0, 2.0, 30), "mean", resamples=1000, seed=i)
        hits += low <= 3.0 <= high
    assert 0.85 <= hits / 200 <= 0.99


def test_stratified_bootstrap_pools_tasks_and_reduces_to_one_task():
    one = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    point, low, high = stats.stratified_bootstrap_ci([one], "mean", seed=2)
    ref = stats.bootstrap_ci(one, "mean", seed=2)
    assert point == pytest.approx(ref[0]) and low == pytest.approx(ref[1], abs=0.5)
    assert high == pytest.approx(ref[2], abs=0.5)
    pooled = stats.stratified_bootstrap_ci([[0.0, 0.0, 0.0], [10.0, 10.0]], "mean")
    assert pooled == (4.0, 4.0, 4.0)  # each task keeps its seeds: the pool never changes


@pytest.mark.parametrize(
    ("x", "y", "expected"),
    [
        ([3.0, 4.0], [1.0, 2.0], 1.0),
        ([1.0, 2.0], [3.0, 4.0], 0.0),
        ([1.0, 3.0], [2.0], 0.5),
        ([1.0, 2.0], [2.0, 2.0], 0.25),  # (0 + ½ + 0 + ½) / 4
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0.5),
    ],
)
def test_probability_of_improvement_closed_form(x, y, expected):
    p, low, high = stats.probability_of_improvement(x, y, resamples=500)
    assert p == pytest.approx(expected)
    if min(len(x), len(y)) == 1:  # one seed: no interval (the bootstrap cannot see its noise)
        assert np.isnan(low) and np.isnan(high)
    else:
        assert 0.0 <= low <= p <= high <= 1.0
    # one seed on both sides, every score equal: ½ for certain
    assert stats.probability_of_improvement([2.0], [2.0]) == (0.5, 0.5, 0.5)


@settings(max_examples=40, deadline=None)
@given(st.lists(finite, min_size=1, max_size=8), st.lists(finite, min_size=1, max_size=8))
def test_probability_of_improvement_is_complementary(x, y):
    p_xy = stats.probability_of_improvement(x, y, resamples=50)[0]
    p_yx = stats.probability_of_improvement(y, x, resamples=50)[0]
    assert p_xy + p_yx == pytest.approx(1.0)
    from scipy.stats import mannwhitneyu

    if len(set(x) | set(y)) > 1:
        assert p_xy == pytest.approx(mannwhitneyu(x, y).statistic / (len(x) * len(y)))


def test_improvement_matrix_and_sentence():
    groups = {0.9: [10.0, 11.0, 12.0, 13.0, 14.0], 1.0: [1.0, 2.0, 3.0, 4.0, 5.0]}
    matrix = stats.improvement_matrix(groups)
    assert len(matrix) == 2 and set(matrix.columns) == {"x", "y", "probability", "ci_low",
                                                        "ci_high"}  # fmt: skip
    assert matrix.set_index(["x", "y"]).loc[(0.9, 1.0), "probability"] == 1.0
    text = stats.best_group_sentence(groups, lambda g: f"λ = {g:g}")
    assert text.startswith("λ = 0.9 beats λ = 1 with probability 1.00 [1.00, 1.00]")
    assert "seed noise" not in text
    close = {0.9: [1.0, 3.0, 5.0], 1.0: [2.0, 4.0, 6.0]}
    assert "not distinguishable from seed noise" in stats.best_group_sentence(close, str)
    assert stats.best_group_sentence({1: [1.0]}, str) == "Only one group: nothing to compare"


def test_sentence_names_groups_tied_at_the_top_instead_of_ranking_them():
    # every seed at the env's ceiling in three groups: no "X beats Y with probability 0.50"
    groups = {0.0: [500.0] * 4, 0.5: [500.0] * 4, 0.95: [500.0, 500.0, 213.0, 500.0],
              1.0: [500.0] * 4}  # fmt: skip
    text = stats.best_group_sentence(groups, lambda g: f"λ = {g:g}")
    assert text.startswith("λ = 0, λ = 0.5 and λ = 1 tie at the top (IQM 500.0, mean 500.0)")
    assert "beats" not in text
    # equal IQM but a higher mean is not a tie
    groups = {0: [1.0, 2.0, 3.0, 4.0], 1: [0.0, 2.0, 3.0, 4.0]}
    assert stats.best_group_sentence(groups, str).startswith("0 beats 1")


def test_sentence_leaves_out_nan_and_gives_no_interval_with_one_seed():
    # a NaN score does not scramble the ranking (it made "b beats a … 0.00 [0.00, 0.00]")
    groups = {"b": [0.0, 0.5, 1.0, 1.5, 2.0], "a": [10.0, 11.0, math.nan, 12.0, 13.0]}
    assert stats.best_group_sentence(groups, str).startswith("a beats b with probability 1.00")
    # a group without scores ranks last; none at all: nothing to say
    groups = {"a": [math.nan], "b": [1.0, 2.0], "c": [0.0, 1.0]}
    assert stats.best_group_sentence(groups, str).startswith("b beats c")
    assert stats.best_group_sentence({"a": [math.nan], "b": []}, str) == "No scores to compare"
    # two seeds a group, ordered one way: [1.00, 1.00], said to come from too few seeds
    text = stats.best_group_sentence({"a": [5.0, 6.0], "b": [1.0, 2.0, 3.0]}, str)
    assert text.startswith("a beats b with probability 1.00 [1.00, 1.00]"), text
    assert text.endswith("from only 2 seeds in a group: too few for this interval to be trusted "
                         "(use 10 per group)")  # fmt: skip
    # one seed in either group: no interval that claims certainty
    for groups in ({"a": [2.0], "b": [1.0]}, {"a": [10.0], "b": [1.0, 2.0, 3.0]}):
        text = stats.best_group_sentence(groups, str)
        assert text.startswith("a beats b with probability 1.00 (P(X > Y) over seeds)"), text
        assert "[" not in text and text.endswith("not distinguishable from seed noise")


def test_performance_profile_of_a_group_without_scores_is_nan():
    profile = stats.performance_profile({"a": [1.0, 2.0], "b": [math.nan]}, np.array([0.0, 1.5]))
    empty = profile[profile["group"] == "b"]
    assert empty[["fraction", "ci_low", "ci_high"]].isna().all().all() and len(empty) == 2
    assert profile[profile["group"] == "a"]["fraction"].tolist() == [1.0, 0.5]


def test_performance_profile_counts_scores_strictly_above_tau():
    profile = stats.performance_profile({"a": [1.0, 2.0, 3.0, 4.0]}, np.array([0.0, 2.0, 4.0]))
    assert profile["fraction"].tolist() == [1.0, 0.5, 0.0]  # > τ, not ≥
    assert (profile["ci_low"] <= profile["fraction"]).all()
    assert (profile["fraction"] <= profile["ci_high"]).all()
    assert profile.loc[0, "ci_low"] == profile.loc[0, "ci_high"] == 1.0  # no seed can fall below
    taus = stats.default_taus({"a": [3.0, 9.0], "b": [-1.0]}, points=5)
    assert taus[0] == -1.0 - 0.05 * 10 and taus[-1] == 9.0 and len(taus) == 5
    # every score equal (a study whose runs all end at 500): a step at 500, not an empty chart
    flat = stats.performance_profile({"λ=0": [500.0] * 3, "λ=1": [500.0] * 3})
    assert flat["tau"].min() == 495.0 and flat["tau"].max() == 500.0
    for _, group in flat.groupby("group"):
        assert group["fraction"].iloc[0] == 1.0 and group["fraction"].iloc[-1] == 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10_000))
def test_curve_band_stays_inside_the_data_at_every_point(seeds, points, seed):
    rng = np.random.default_rng(seed)
    curves = rng.normal(size=(seeds, points)) * 10
    curves[rng.random(curves.shape) < 0.2] = np.nan
    band = stats.curve_band(curves, "iqm", resamples=200, seed=seed)
    for j in range(points):
        column = curves[:, j][~np.isnan(curves[:, j])]
        assert band["seeds"][j] == len(column)
        if not len(column):
            assert np.isnan(band["center"][j])
            continue
        assert column.min() - 1e-9 <= band["ci_low"][j] <= band["center"][j] + 1e-9
        assert band["center"][j] - 1e-9 <= band["ci_high"][j] <= column.max() + 1e-9


def test_curve_band_gives_each_point_the_interval_it_gets_alone():
    """The band's one vectorised bootstrap over the points where every seed has a value gives
    each point exactly what ``bootstrap_ci`` gives it alone, as do the points bootstrapped one
    by one (a seed missing). Its speed is ``benchmarks/bench_stats.py``'s business."""
    curves = np.random.default_rng(0).normal(size=(10, 30))
    curves[3, [4, 17]] = np.nan
    for statistic in ("iqm", "mean"):
        band = stats.curve_band(curves, statistic, resamples=300, seed=5)
        alone = [
            stats.bootstrap_ci(curves[:, j], statistic, resamples=300, seed=5)
            for j in range(curves.shape[1])
        ]
        np.testing.assert_allclose(band[["center", "ci_low", "ci_high"]], alone, rtol=1e-12)
        assert band["seeds"].tolist() == [9 if j in (4, 17) else 10 for j in range(30)]


def test_group_summary_columns_and_values():
    scores = pd.DataFrame(
        {
            "lambda_": [0.9] * 4 + [1.0] * 4,
            "seed": list(range(8)),
            "final_return": [1.0, 2.0, 3.0, 100.0, 5.0, 5.0, 5.0, 5.0],
        }
    )
    table = stats.group_summary(scores, "lambda_", ["final_return"], seed=1)
    row = table.set_index("lambda_").loc[0.9]
    assert row["seeds"] == 4
    assert row["final_return_iqm"] == pytest.approx(2.5) and row["final_return_mean"] == 26.5
    assert row["final_return_iqm_ci_low"] <= 2.5 <= row["final_return_iqm_ci_high"]
    assert table.set_index("lambda_").loc[1.0, "final_return_mean_ci_low"] == 5.0


def test_a_group_of_one_seed_has_a_score_and_no_interval():
    scores = pd.DataFrame({"lambda_": [0.9, 1.0, 1.0, 1.0], "seed": [0, 0, 1, 2],
                           "final_return": [7.0, 1.0, np.nan, 3.0]})  # fmt: skip
    table = stats.group_summary(scores, "lambda_", ["final_return"], seed=1).set_index("lambda_")
    bounds = [f"final_return_{n}_ci_{e}" for n in ("iqm", "mean") for e in ("low", "high")]
    one, two = table.loc[0.9], table.loc[1.0]
    assert (one["final_return_iqm"], one["final_return_mean"]) == (7.0, 7.0)
    assert one[bounds].isna().all()  # one value: no interval, not [7, 7]
    # two finite scores (a NaN one is left out): an interval, and seeds counts the rows
    assert two[bounds].notna().all() and two["seeds"] == 3
    assert two["final_return_mean_ci_low"] <= 2.0 <= two["final_return_mean_ci_high"]


@pytest.mark.parametrize(
    ("point", "low", "high", "text"),
    [
        (1234.56, 1200.0, 1260.34, "1,234.6 [1,200.0, 1,260.3]"),
        (150.0, 150.0, 150.0, "150.0 [150.0, 150.0]"),  # every seed alike: a real interval
        (-83.44, float("nan"), float("nan"), "-83.4 (one seed: no interval)"),
        (5.0, None, None, "5.00 (one seed: no interval)"),  # a JSON record's null
        (float("nan"), float("nan"), float("nan"), "–"),
        (None, None, None, "–"),
        # small scores keep three significant digits of the largest number
        (0.2661, 0.2213, 0.3049, "0.266 [0.221, 0.305]"),
        (5.04, 4.8, 5.31, "5.04 [4.80, 5.31]"),
        (0.0012345, 0.001, 0.0015, "0.00123 [0.00100, 0.00150]"),
        (-0.5, -0.75, -0.25, "-0.500 [-0.750, -0.250]"),
        (0.0, 0.0, 0.0, "0.0 [0.0, 0.0]"),
        (9.99, 9.5, 10.2, "10.0 [9.5, 10.2]"),  # the interval's end sets it: 10.2 ≥ 10
    ],
)
def test_estimate_text_reads_a_score_and_its_interval_or_says_there_is_none(point, low, high, text):
    assert stats.estimate_text(point, low, high) == text


def test_few_seeds_warning():
    assert stats.few_seeds_warning(10) is None and stats.few_seeds_warning(5) is None
    assert "Only 3 seeds" in stats.few_seeds_warning(3)
    assert "Only 1 seed in" in stats.few_seeds_warning(1)


def test_sentence_never_says_beats_when_the_first_on_iqm_wins_fewer_seed_pairs():
    """A group first on IQM that wins fewer than half the seed pairs (P(X > Y) < ½) is said to
    rank first on IQM, with both IQMs, and the runner-up to win more seed pairs."""
    groups = {"a": [10.0, 10.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0], "b": [1.0] * 8}
    assert stats.iqm(np.array(groups["a"])) == 2.5 and stats.iqm(np.array(groups["b"])) == 1.0
    text = stats.best_group_sentence(groups, str)
    assert text.startswith(
        "a ranks first on IQM (2.50 against 1.00 for b), yet b wins more seed pairs: "
        "P(a > b) = 0.38 ["
    ), text
    assert "beats" not in text
    # one seed in the runner-up: no interval, and still no "beats"
    text = stats.best_group_sentence({"a": groups["a"], "b": [1.0]}, str)
    assert "beats" not in text and "[" not in text and text.endswith("seed noise"), text


def test_sentence_edge_cases_say_what_the_numbers_say():
    """A runner-up without scores is named as such (no P(X > Y) of NaN); first place on a tied
    IQM says so; a probability printed as 0.50 is a coin flip, never a loss."""
    nan = math.nan
    text = stats.best_group_sentence({"a": [1.0, 2.0, 3.0], "b": [nan] * 3}, str)
    assert text == "a ranks first; b has no scores to compare it with"
    text = stats.best_group_sentence({"a": [1.0, 2.0], "b": [nan], "c": []}, str)
    assert text == "a ranks first; b and c have no scores to compare it with"
    tied = {"a": [1.0, 5.0, 2.0, 0.0], "b": [2.0, 1.0, 3.0, 1.0]}  # IQM 1.5 both, means 2 > 1.75
    assert stats.iqm(np.array(tied["a"])) == stats.iqm(np.array(tied["b"]))
    text = stats.best_group_sentence(tied, str)
    assert text.startswith(
        "a ranks first (IQM tied at 1.50 with b, higher mean), yet b wins more seed pairs: "
        "P(a > b) = 0.47 ["
    ), text
    # first on IQM, half the seed pairs each way: a coin flip, not "a beats b … 0.50"
    text = stats.best_group_sentence({"a": [0.0, 2.0, 3.0, 3.0], "b": [1.0, 1.0, 3.0, 3.0]}, str)
    assert text.startswith(
        "a ranks first on IQM (2.50 against 2.00 for b), yet b wins as many seed pairs: "
        "P(a > b) = 0.50 ["
    ), text


@settings(max_examples=200, deadline=None)
@given(a=st.floats(-1e6, 1e6), b=st.floats(-1e6, 1e6))
def test_two_scores_side_by_side_print_to_the_same_places_and_apart_where_they_differ(a, b):
    """side_by_side prints both scores to the same places, the tables' rule at least, each
    within half a unit of its last place, and never alike where they differ by more than
    1e-6 (six places)."""
    shown = stats.side_by_side(a, b)
    places = [len(t.split(".")[1]) for t in shown]
    assert places[0] == places[1] >= stats.score_places(a, b)
    for text, value in zip(shown, (a, b), strict=True):
        assert abs(float(text.replace(",", "")) - value) <= 0.5 * 10 ** -places[0] + 1e-9
    if abs(a - b) > 1e-6:
        assert shown[0] != shown[1]
    elif shown[0] == shown[1]:  # alike to six places: printed by the rule, not to six zeros
        assert places[0] == stats.score_places(a, b)


def test_two_scores_that_print_alike_to_six_places_read_as_a_tie_by_the_rule():
    assert stats.side_by_side(0.1 + 0.2, 0.3) == ("0.300", "0.300")
    assert stats.side_by_side(-0.0, 0.0) == ("0.0", "0.0")
    assert stats.side_by_side(92.2, 86.48) == ("92.2", "86.5")  # apart at the rule's place


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(2, 12), m=st.integers(2, 12),
       shift=st.floats(-50, 50))  # fmt: skip
def test_median_gap_ci_is_the_gap_of_medians_within_its_interval(seed, n, m, shift):
    """median(x) − median(y), inside a percentile interval of the gaps of resampled medians;
    shifting x by c shifts the gap and the interval by c (the resamples are the same draws)."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=n), rng.normal(size=m)
    gap, low, high = stats.median_gap_ci(x, y, resamples=300)
    assert gap == pytest.approx(np.median(x) - np.median(y))
    assert low <= gap + 1e-12 and gap - 1e-12 <= high
    # every interval bound is a gap of two medians of values drawn from the samples
    assert low >= x.min() - y.max() - 1e-12 and high <= x.max() - y.min() + 1e-12
    moved = stats.median_gap_ci(x + shift, y, resamples=300)
    assert moved == pytest.approx((gap + shift, low + shift, high + shift), abs=1e-9)


def test_median_gap_ci_edge_cases():
    assert stats.median_gap_ci([3.0, 3.0], [1.0, 1.0, 1.0]) == (2.0, 2.0, 2.0)  # no spread
    gap, low, high = stats.median_gap_ci([5.0], [1.0, 2.0])  # one seed: no interval
    assert gap == 3.5 and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in stats.median_gap_ci([], [1.0, 2.0]))
