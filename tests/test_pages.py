"""AppTest of the dashboard pages: they render, validate the form, start and stop runs.

AppTest never fires ``run_every``: the tests call ``run()`` again to refresh a fragment.
"""

from __future__ import annotations

import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from gae_core.store import RunStore
from pages import _ui

TINY = {"total_steps": 600, "num_envs": 2, "rollout_steps": 8, "checkpoint_every": 0}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty store per test, and a fresh process-wide manager (cache_resource is global)."""
    monkeypatch.setenv("GAE_CORE_DATA", str(tmp_path))
    st.cache_resource.clear()
    yield tmp_path
    _ui.manager().shutdown(timeout=10)
    st.cache_resource.clear()


def app(page: str | None = None) -> AppTest:
    at = AppTest.from_file("../app.py", default_timeout=60).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def set_fields(at: AppTest, values: dict) -> None:
    for name, value in values.items():
        at.number_input(key=f"train.{name}").set_value(value)
    at.run()


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_home_lists_the_pages(data_dir):
    at = app()
    assert at.title[0].value == "GAE Lab"
    assert "Runs in progress: 0" in [c.value for c in at.sidebar.caption]


def test_train_page_renders_with_a_field_for_every_config_field(data_dir):
    from dataclasses import fields

    from gae_core.config import TrainConfig

    at = app("pages/train.py")
    keys = {w.key for w in [*at.number_input, *at.selectbox, *at.checkbox, *at.text_input]}
    for f in fields(TrainConfig):
        assert f"train.{f.name}" in keys, f.name
    assert at.info[0].value.startswith("No runs yet")
    assert not at.button(key="train.start").disabled


def test_train_form_explains_invalid_values_before_start(data_dir):
    at = app("pages/train.py")
    at.text_input(key="train.hidden_sizes").set_value("64, lots").run()
    assert "hidden_sizes must be comma-separated positive integers" in at.error[0].value
    assert at.button(key="train.start").disabled
    at.text_input(key="train.hidden_sizes").set_value("64, 0").run()
    assert "hidden_sizes" in at.error[0].value and at.button(key="train.start").disabled
    at.text_input(key="train.hidden_sizes").set_value("32").run()
    assert not at.error
    set_fields(at, {"total_steps": 100})
    warnings = [w.value for w in at.warning]
    assert any("smaller than one update" in w for w in warnings), warnings
    assert any("only the final checkpoint" in w for w in warnings), warnings


def test_start_puts_a_run_in_the_store_and_the_page_shows_it(data_dir):
    at = app("pages/train.py")
    set_fields(at, TINY)
    at.button(key="train.start").click().run()
    runs = RunStore(data_dir).list_runs()
    assert len(runs) == 1 and runs[0].config["total_steps"] == 600
    assert any(runs[0].name in m.value for m in at.markdown)
    assert wait_for(lambda: RunStore(data_dir).get_run(runs[0].id).status == "finished")
    at.run()
    assert any("finished" in m.value for m in at.markdown)
    assert any("Episodic return" in str(c.proto.spec) for c in at.get("plotly_chart"))


def test_stop_button_stops_the_run(data_dir):
    at = app("pages/train.py")
    set_fields(at, {"total_steps": 10_000_000, "checkpoint_every": 0})
    at.button(key="train.start").click().run()
    run_id = RunStore(data_dir).list_runs()[0].id
    assert wait_for(lambda: RunStore(data_dir).get_run(run_id).status == "running")
    at.run()
    at.button(key="train.stop").click().run()
    assert wait_for(lambda: RunStore(data_dir).get_run(run_id).status == "stopped", 5)
    at.run()
    assert any("stopped at step" in m.value for m in at.markdown)


def test_runs_page_lists_and_filters(data_dir):
    at = app("pages/runs.py")
    assert at.info[0].value.startswith("No runs in the store")
    manager = _ui.manager()
    run_ids = [manager.start({**TINY, "seed": seed}) for seed in (0, 1)]
    for run_id in run_ids:
        assert manager.wait(run_id, 60)
    at = app("pages/runs.py")
    frame = at.dataframe[0].value
    assert sorted(frame["run_id"]) == sorted(run_ids)
    assert set(frame["status"]) == {"finished"}
    at.text_input(key="runs.text").set_value(run_ids[0]).run()
    assert at.dataframe[0].value["run_id"].tolist() == [run_ids[0]]
    at.multiselect(key="runs.status").set_value(["failed"]).run()
    assert at.dataframe[0].value.empty


def test_a_second_start_switches_the_view_to_the_new_run(data_dir):
    at = app("pages/train.py")
    set_fields(at, TINY)
    at.button(key="train.start").click().run()
    first = at.selectbox(key="train.view").value
    at.button(key="train.start").click().run()
    second = at.selectbox(key="train.view").value
    assert first != second
    assert second == RunStore(data_dir).list_runs()[0].id  # the newest run
