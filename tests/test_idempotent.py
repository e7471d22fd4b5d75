"""Start and Launch act once per click burst (:func:`pages._ui.start_once`).

AppTest delivers a double click as two back-to-back ``click().run()`` calls: the second rerun
follows a first that has returned. A second click that interrupts the first (Streamlit's fast
reruns start it in a new script thread while the first is still inside ``start()``) is played by
a repeat made from inside ``start()``. The helper's clock is moved on instead of sleeping.
"""

from __future__ import annotations

import pytest
from conftest import TINY, app, set_field, wait_until
from streamlit.testing.v1 import AppTest

from gae_core.storage.store import RunStore
from pages import _ui


@pytest.fixture
def clock(monkeypatch):
    """The helper's clock, frozen; ``clock[0] += s`` moves it on."""
    now = [1000.0]
    monkeypatch.setattr(_ui, "_clock", lambda: now[0])
    return now


def already_starting(at) -> list[str]:
    return [i.value for i in at.info if i.value.startswith("Already starting")]


@pytest.mark.slow
def test_a_double_click_on_start_starts_one_run_and_a_later_click_another(data_dir, clock):
    at = app("pages/train.py")
    for name, value in TINY.items():
        set_field(at, f"train.{name}", value).run()
    at.button(key="train.start").click().run()
    at.button(key="train.start").click().run()  # the double click's second rerun
    assert not at.exception
    (first,) = RunStore(data_dir).list_runs()
    assert already_starting(at) == [
        "Already starting this run: a click within 3 s of the last one does nothing. To start "
        "another identical one, wait 3 s and click again."
    ]
    assert at.selectbox(key="train.view").value == first.id
    clock[0] += 2.0  # still the same burst: each repeat extends it
    at.button(key="train.start").click().run()
    assert len(RunStore(data_dir).list_runs()) == 1 and already_starting(at)
    clock[0] += _ui.REPEAT_WINDOW_S + 0.1  # a click on purpose, after a quiet window
    at.button(key="train.start").click().run()
    assert not at.exception and not already_starting(at)
    runs = RunStore(data_dir).list_runs()
    assert len(runs) == 2 and runs[0].config == runs[1].config  # an identical run, on purpose
    assert at.selectbox(key="train.view").value == runs[0].id != first.id
    at.text_input(key="train.seed").set_value("1").run()  # other settings: not a repeat
    at.button(key="train.start").click().run()
    assert not already_starting(at)
    runs = RunStore(data_dir).list_runs()
    assert [r.config["seed"] for r in runs] == [1, 0, 0]
    for run in runs:
        assert _ui.manager().wait(run.id, 60)


@pytest.mark.slow
def test_a_double_click_on_launch_starts_one_sweep_and_a_later_click_another(data_dir, clock):
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    at.text_input(key="cmp.lambdas").set_value("1").run()
    for key, value in {**TINY, "seeds": 1, "workers": 1}.items():
        set_field(at, f"cmp.{key}", value).run()
    at.button(key="cmp.launch").click().run()
    at.button(key="cmp.launch").click().run()  # the double click's second rerun
    assert not at.exception
    store = RunStore(data_dir)
    (first,) = store.list_sweeps()
    assert len(store.list_runs()) == 1
    assert already_starting(at) and "this sweep" in already_starting(at)[0]
    assert at.selectbox(key="cmp.progress_sweep").value == first.id
    clock[0] += _ui.REPEAT_WINDOW_S + 0.1
    at.button(key="cmp.launch").click().run()
    assert not at.exception and not already_starting(at)
    sweeps = store.list_sweeps()
    assert len(sweeps) == 2 and sweeps[0].grid == sweeps[1].grid
    for sweep in sweeps:
        assert wait_until(lambda s=sweep: store.get_sweep(s.id).status == "finished", 120)


def _burst_script() -> None:
    """A page whose start is clicked again while it is in flight, then fails once."""
    import streamlit as st

    from pages import _ui

    state = st.session_state
    state.setdefault("started", [])

    def start(tag: str):
        state.started.append(tag)
        if tag == "first":  # the second click of the burst arrives before start() returns
            state.inner = _ui.start_once("act", {"x": 1}, lambda: start("inner"), "it")
        if tag == "fails":
            raise ValueError("refused")
        return tag

    state.outer = _ui.start_once("act", {"x": 1}, lambda: start("first"), "it")
    try:
        _ui.start_once("act", {"x": 2}, lambda: start("fails"), "it")
    except ValueError:
        pass
    state.retried = _ui.start_once("act", {"x": 2}, lambda: start("retry"), "it")


def test_a_click_while_the_start_is_in_flight_does_nothing_and_a_failed_start_retries(clock):
    at = AppTest.from_function(_burst_script).run()
    assert not at.exception
    assert at.session_state.outer == "first" and at.session_state.inner is None
    assert [i.value.split(":")[0] for i in at.info] == ["Already starting it"]
    # a start that raised left no record: the same click again starts at once
    assert at.session_state.started == ["first", "fails", "retry"]
    assert at.session_state.retried == "retry"


def _two_threads_script() -> None:
    """The second click of a burst reruns in another script thread while the first's start is
    still running (Streamlit's fast reruns); the first's start returns, or raises when
    ``fail`` is set in the session, only once the second has said "Already starting"."""
    import threading

    import streamlit as st
    from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

    from pages import _ui

    answers = {}
    said = threading.Event()
    real_info = st.info

    def info(*args, **kwargs):  # the repeat says "Already starting", then waits
        said.set()
        return real_info(*args, **kwargs)

    def second_click() -> None:
        try:
            answers["second"] = _ui.start_once("act", {"x": 1}, lambda: "second", "it")
        except ValueError as error:
            answers["second"] = f"raised {error}"

    thread = add_script_run_ctx(threading.Thread(target=second_click), get_script_run_ctx())

    def first_start() -> str:
        thread.start()
        said.wait(10)  # the second click's rerun found this start in flight
        if st.session_state.get("fail"):
            raise ValueError("refused")
        return "first"

    st.info = info
    try:
        st.session_state.first = _ui.start_once("act", {"x": 1}, first_start, "it")
    except ValueError as error:
        st.session_state.first = f"raised {error}"
    finally:
        st.info = real_info
    thread.join(30)
    st.session_state.second = answers.get("second", "no answer")


@pytest.mark.parametrize("fail", [False, True])
def test_a_second_click_in_another_thread_gets_what_the_first_started(clock, fail):
    """The first click's run is stopped by Streamlit at its next element and never draws what
    it started: the second click's run waits for that start and returns it (for the page to
    show), or raises its error (for the page to say), and starts nothing itself."""
    at = AppTest.from_function(_two_threads_script)
    at.session_state.fail = fail
    at.run()
    assert not at.exception
    expected = "raised refused" if fail else "first"
    assert at.session_state.first == expected
    assert at.session_state.second == expected
