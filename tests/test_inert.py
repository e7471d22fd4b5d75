"""User text made inert (gae_core.inert), and the views that show runs (status line, progress)."""

from __future__ import annotations

import io
import re
import string
import unicodedata

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gae_core import inert
from gae_core import metrics as M
from gae_core.cli.commands import _solved_words
from gae_core.insight import compare, compare_figures, figures, views
from gae_core.outcome import RunSummary
from gae_core.storage.records import RunRecord
from gae_core.storage.table import run_row

EVIL = '=HYPERLINK("http://x","y") **b** [l](javascript:alert(1)) ![i](x.png) <b>h</b> :red[r] $x$'


@given(st.lists(st.text(max_size=30), min_size=1, max_size=20))
def test_csv_text_cells_never_start_a_formula(texts):
    frame = pd.DataFrame({"name": texts, "final_return": np.linspace(-200.5, 5.0, len(texts))})
    safe = inert.csv_safe(frame)
    for original, cell in zip(texts, safe["name"], strict=True):
        assert not cell.startswith(inert.CSV_FORMULA_PREFIXES)
        assert "\r" not in cell  # the CSV writer would leave it unquoted: a new row
        kept = original.replace("\r\n", "\n").replace("\r", "\n")
        assert cell in (kept, "'" + kept)
    pd.testing.assert_series_equal(safe["final_return"], frame["final_return"])  # numbers stay
    assert inert.csv_safe(frame.iloc[:0]).empty


def test_to_csv_quotes_formulas_and_keeps_negative_numbers():
    frame = pd.DataFrame({"name": ["-cmd", "@SUM(A1)", "ok"], "final_return": [-1.5, 2.0, 3.0]})
    lines = inert.to_csv(frame).splitlines()
    assert lines == ["name,final_return", "'-cmd,-1.5", "'@SUM(A1),2.0", "ok,3.0"]


def test_to_csv_quotes_a_carriage_return_inside_a_cell():
    frame = pd.DataFrame({"name": ["abc\r=1+1", "\r=2", "x\r\ny"], "final_return": [1.0, 2.0, 3.0]})
    text = inert.to_csv(frame)
    assert text == 'name,final_return\n"abc\n=1+1",1.0\n"\'\n=2",2.0\n"x\ny",3.0\n', repr(text)
    assert pd.read_csv(io.StringIO(text))["final_return"].tolist() == [1.0, 2.0, 3.0]


@given(st.text(max_size=60))
def test_markdown_text_escapes_every_ascii_punctuation(text):
    out = inert.markdown_text(text)
    i = 0
    while i < len(out):
        if out[i] == "\\":
            assert out[i + 1] in string.punctuation
            i += 2
            continue
        assert out[i] not in string.punctuation
        i += 1
    assert "\n" not in out


#: What GFM's autolink literals match in a text node (escapes already read): a bare URL's start,
#: "www." and an e-mail address (mdast-util-gfm-autolink-literal's patterns).
_GFM_AUTOLINKS = re.compile(r"(?i)https?://|www(?=\.)|[-.\w+]+@[-\w]+(\.[-\w]+)+")


@given(st.text(max_size=40), st.sampled_from(["http://a.io/x", "HTTPS://b.org", "www.c.com",
                                              "d@e.co", "[l](http://f.net)"]))  # fmt: skip
def test_markdown_text_leaves_no_bare_url_or_address_for_gfm_to_link(text, link):
    """Streamlit's markdown links a bare URL or e-mail address found in the text after the
    escapes are read (a run named "see http://example.com" drew a live link in the status
    line): with the escapes read, none is left to match, and the word joiners are the only
    characters added."""
    out = inert.markdown_text(text + " " + link + " " + text)
    read = re.sub(r"\\(.)", r"\1", out)  # what the markdown parser's text node holds
    assert not _GFM_AUTOLINKS.search(read), read
    assert read.replace("\u2060", "") == inert.terminal_text(text + " " + link + " " + text)


@given(st.text(max_size=60))
def test_plotly_and_terminal_text_are_inert(text):
    assert "<" not in inert.plotly_text(text) and ">" not in inert.plotly_text(text)
    shown = inert.terminal_text(text)
    assert all(unicodedata.category(c) not in ("Cc", "Cf") or c == " " for c in shown), repr(shown)


def test_a_name_that_is_not_utf8_is_refused_naming_the_field():
    for name, what in [
        ("ab\udcff", "byte 0xff at position 2"),
        (b"\xffab", "byte 0xff at position 0"),
        ("\ud800", "a lone surrogate at position 0"),
    ]:
        with pytest.raises(ValueError, match=f"^run name is not valid UTF-8 text \\({what}\\)$"):
            inert.clean_name(name, field="run name")
    assert inert.clean_name("λ = 0.95".encode(), field="run name") == "λ = 0.95"
    assert inert.terminal_text("/tmp/a\x1b[31mb\udcff") == "/tmp/a[31mb\ufffd"


def test_clean_name_drops_control_characters_and_checks_length():
    assert inert.clean_name("  a\x1b[31m\tb\x07\n c ") == "a[31m b c"
    with pytest.raises(ValueError, match="run name cannot be empty"):
        inert.clean_name("\x1b\x07 ", field="run name")
    with pytest.raises(ValueError, match="at most 200 characters, got 201"):
        inert.clean_name("x" * 201)


def test_figure_legends_show_names_as_text():
    metrics = pd.DataFrame(
        {"env_step": [1, 2], "wall_time": [0.1, 0.2], "key": M.VALUE_LOSS.key, "value": [1, 2]}
    )
    figure, _ = figures.overlay_figure({EVIL: metrics}, M.VALUE_LOSS.key)
    assert figure.data[0].name == inert.plotly_text(EVIL)
    assert "<b>" not in figure.data[0].name and "&lt;b&gt;" in figure.data[0].name
    episodes = pd.DataFrame(
        {
            "sweep": EVIL,
            "seed": [0, 0, 1, 1],
            "run_id": ["a", "a", "b", "b"],
            "env_step": [1, 2, 1, 2],
            "return": [1.0] * 4,
        }
    )
    bands, aligned = compare.aggregate_curves(episodes, group="sweep", points=3, window=1)
    figure, _ = compare_figures.comparison_figure(bands, aligned, group="sweep")
    assert all("<b>" not in (trace.name or "") for trace in figure.data)


def _run(**summary) -> RunRecord:
    return RunRecord(
        id="r1",
        name="n",
        config={"total_steps": 1000},
        status="finished",
        error=None,
        created_at=0.0,
        started_at=1.0,
        ended_at=2.0,
        env_steps=1000,
        sweep_id=None,
        stop_requested=False,
        summary=RunSummary(**summary),
    )


def test_status_text_says_how_a_run_ended():
    base = {"episodes": 300, "final_return": 9.0, "reward_threshold": 475.0}
    mean = "(mean of the last 100 episodes)"  # not the last episode the chart ends on
    assert views.status_text(_run(**base)) == f"finished: not solved; final return 9.0 {mean}"
    collapsed = _run(
        **base, solved_at_step=180_000, fell_below_at_step=240_000, stayed_solved=False
    )
    assert views.status_text(collapsed) == (
        f"finished: solved at 180,000, fell below at 240,000; final return 9.0 {mean}"
    )
    kept = _run(**{**base, "final_return": 498.0}, solved_at_step=180_000, stayed_solved=True)
    assert views.status_text(kept) == (
        f"finished: solved at 180,000, stayed solved; final return 498.0 {mean}"
    )
    short = _run(**{**base, "episodes": 7})  # fewer episodes than the window
    assert views.status_text(short).endswith("final return 9.0 (mean of the last 7 episodes)")
    dipped = _run(
        **{**base, "final_return": 490.0},
        solved_at_step=1,
        fell_below_at_step=2_000,
        stayed_solved=True,
    )
    assert "dipped below at 2,000 and recovered" in views.status_text(dipped)
    # the CLI's word for each case, from the same summary
    no_threshold = _run(episodes=300, final_return=9.0)
    never = _run(**base)
    states = [r.summary.solved_state for r in (never, collapsed, kept, dipped)]
    assert states == ["no", "fell", "stayed", "dipped"] and never.summary.solved is False
    assert no_threshold.summary.solved_state is None
    # and the CLI's sentence after `train`, from the run's table row
    assert _solved_words(run_row(collapsed)) == "solved at step 180,000, fell below at 240,000"
    assert _solved_words(run_row(kept)) == "solved at step 180,000, stayed solved"
    assert _solved_words(run_row(dipped)).endswith("dipped below at 2,000 and recovered")
    assert _solved_words(run_row(no_threshold)) == "no solved threshold"
    # a trial of a sweep cancelled before its turn: no step, no "not solved" verdict
    unstarted = RunRecord(**{**_run(reward_threshold=475.0).__dict__, "env_steps": 0,
                             "status": "stopped"})  # fmt: skip
    assert views.status_text(unstarted) == "stopped before it started"
    stopped = RunRecord(**{**never.__dict__, "env_steps": 700, "status": "stopped"})
    assert views.status_text(stopped) == f"stopped at step 700: not solved; final return 9.0 {mean}"
    # a run whose process died says what it had reached, as a stopped one does
    died = RunRecord(**{**kept.__dict__, "env_steps": 700, "status": "interrupted"})
    assert views.status_text(died) == (
        "interrupted at step 700 (its process ended before the run did; the data up to then is "
        f"kept): solved at 180,000, stayed solved; final return 498.0 {mean}"
    )


def test_progress_never_passes_100_percent():
    over = _run()
    over = RunRecord(**{**over.__dict__, "env_steps": 1500, "status": "running"})
    fraction, eta = views.progress(over, rate=100.0)
    assert fraction == 1.0 and eta == 0.0
    assert views.progress(_run())[0] == 1.0


def test_steps_text_says_a_run_past_its_budget_is_so_instead_of_over_its_total():
    run = _run()
    within = RunRecord(**{**run.__dict__, "env_steps": 400, "config": {"total_steps": 30_000}})
    assert views.steps_text(within) == "400 / 30,000 env steps"
    at = RunRecord(**{**within.__dict__, "env_steps": 30_000})
    assert views.steps_text(at) == "30,000 / 30,000 env steps"
    past = RunRecord(**{**within.__dict__, "env_steps": 30_001})
    assert views.steps_text(past) == (
        "30,001 env steps (budget 30,000: the last vector step finishes every env)"
    )


def test_progress_eta_comes_from_the_measured_rate_and_a_queued_run_is_at_zero():
    """Early in a sweep a worker's start-up made the average rate tiny: ETAs read minutes for a
    sweep that took seconds (and 1:17:23 for a 30-second run at its 80th step). The run's own
    logged rate gives the ETA; without one there is none; a queued run is at 0."""
    running = RunRecord(**{**_run().__dict__, "env_steps": 200, "status": "running",
                           "ended_at": None})  # fmt: skip
    # the run logged 400 steps/s: 800 steps left take 2 s
    assert views.progress(running, rate=400.0) == (0.2, pytest.approx(2.0))
    # no rate measured yet: no ETA, never one from the average since the worker started
    assert views.progress(running) == (0.2, None)
    assert views.progress(running, rate=0.0) == (0.2, None)
    queued = RunRecord(**{**_run().__dict__, "env_steps": 0, "status": "queued",
                          "started_at": None, "ended_at": None})  # fmt: skip
    assert views.progress(queued, rate=400.0) == (0.0, None)


def test_measured_rate_is_the_last_logged_steps_per_second(tmp_path):
    from gae_core import metrics as M
    from gae_core.storage.store import RunStore

    with RunStore(tmp_path) as store:
        run_id = store.create_run({"total_steps": 10_000})
        assert store.claim_run(run_id)
        assert views.measured_rate(store, store.get_run(run_id)) is None  # nothing logged yet
        first = [(M.STEPS_PER_SECOND.key, 1000, 2.0, 900.0)]  # one row: the rate it logged
        store.flush(run_id, first, env_steps=1000)
        assert views.measured_rate(store, store.get_run(run_id)) == 900.0
        # more rows: env steps gained over wall time passed (2,000 steps in 2.5 s), not the
        # updates' own logged rates, which leave flushes and evaluations out
        rows = [(M.STEPS_PER_SECOND.key, 2000, 3.0, 1100.0),
                (M.STEPS_PER_SECOND.key, 3000, 4.5, 1250.0)]  # fmt: skip
        store.flush(run_id, rows, env_steps=3000)
        assert views.measured_rate(store, store.get_run(run_id)) == pytest.approx(2000 / 2.5)
        store.finish_run(run_id, "finished")
        assert views.measured_rate(store, store.get_run(run_id)) is None  # not running


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0.95, "0.95"), (500_000.0, "500,000"), (-1234.56, "-1,234.56"), (12_345.678, "12,345.7"),
     (0.0007, "0.0007"), (3, "3"), (1_000_000, "1,000,000"), ((64, 64), "64x64"), (True, "True")],
)  # fmt: skip
def test_values_read_with_sensible_precision_and_thousands_separators(value, shown):
    from gae_core.labels import format_value

    assert format_value(value) == shown


def test_an_assignment_reads_as_people_write_it():
    from gae_core.labels import assignment

    assert assignment("lambda_", 0.95) == "λ = 0.95"
    assert assignment("total_steps", 500_000) == "budget (env steps) = 500,000"
    assert assignment("algo", "ppo") == "algorithm = PPO"  # as every label writes it
    assert assignment("algo", "a2c") == "algorithm = A2C"
    from gae_core.labels import value_text

    assert value_text("algo", "ppo") == "PPO" and value_text("gamma", 0.99) == "0.99"


def test_the_final_return_says_where_its_window_of_episodes_starts(tmp_path):
    """InvertedPendulum at 50k steps read "final return 457.1" beside a curve flat at 1,000
    from 30k on: its last 100 episodes reached back to step 426. The line says so."""
    from gae_core import metrics as M
    from gae_core.storage.store import RunStore

    with RunStore(tmp_path) as store:
        run_id = store.create_run({"total_steps": 50_000})
        assert views.final_window_start(store, store.get_run(run_id)) is None  # no episode yet
        steps = [426 + 300 * i for i in range(150)]
        rows = [(M.EPISODIC_RETURN.key, step, step / 1000, 1.0) for step in steps]
        store.flush(run_id, rows, env_steps=50_000)
        run = store.get_run(run_id)
        start = views.final_window_start(store, run)
        assert start == steps[-100]  # the first of the last 100 episodes
        short = store.create_run({"total_steps": 5_000})
        store.flush(short, rows[:7], env_steps=5_000)
        assert views.final_window_start(store, store.get_run(short)) == steps[0]  # all 7
    finished = _run(episodes=150, final_return=457.1, reward_threshold=950.0)
    assert views.status_text(finished, window_from=start).endswith(
        f"final return 457.1 (mean of the last 100 episodes, from step {start:,})"
    )
    assert views.status_text(finished).endswith("(mean of the last 100 episodes)")
