"""AppTest of the dashboard pages: they render, validate the form, start and stop runs.

AppTest never fires ``run_every``: the tests call ``run()`` again to refresh a fragment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3

import pytest
from conftest import TINY, app, read_only_folder, said, set_field, trajectory_steps, wait_until
from streamlit.testing.v1 import AppTest

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.inert import markdown_text
from gae_core.labels import MISSING, label, run_label
from gae_core.runs.backends import ray_installed
from gae_core.storage.store import RunStore
from pages import _ui


def set_fields(at: AppTest, values: dict) -> None:
    for name, value in values.items():
        set_field(at, f"train.{name}", value)
    at.run()


def test_home_lists_the_pages(data_dir):
    at = app()
    assert at.title[0].value == "GAE Lab"
    assert "Runs in progress: 0" in [c.value for c in at.sidebar.caption]


def test_the_sidebars_runs_in_progress_each_link_to_their_train_view(data_dir):
    """Each run in progress in the sidebar (a CLI's or another tab's too) has a link to the
    Train page showing it."""
    store = RunStore(data_dir)
    first = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="first")
    second = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="second")
    at = app()
    assert "Runs in progress: 2" in [c.value for c in at.sidebar.caption]
    links = [e.proto for e in at.sidebar.get("page_link") if e.proto.label == "watch on Train"]
    assert sorted(link.query_string for link in links) == sorted(
        f"run={run_id}" for run_id in (first, second)
    )
    assert {link.page for link in links} == {"train"}


def test_train_page_renders_with_a_field_for_every_config_field(data_dir):
    from dataclasses import fields

    from gae_core.agent.config import TrainConfig

    at = app("pages/train.py")
    keys = {w.key for w in [*at.number_input, *at.selectbox, *at.checkbox, *at.text_input]}
    for f in fields(TrainConfig):
        assert f"train.{f.name}" in keys, f.name
    assert at.info[0].value.startswith("No runs yet")
    assert not at.button(key="train.start").disabled


def test_train_form_explains_invalid_values_before_start(data_dir):
    at = app("pages/train.py")
    at.text_input(key="train.hidden_sizes").set_value("64, lots").run()
    assert "hidden sizes: cannot read '64, lots'; expected 1 to 8 integers" in said(at.error)[0]
    assert at.button(key="train.start").disabled
    at.text_input(key="train.hidden_sizes").set_value("64, 0").run()
    assert "hidden sizes" in said(at.error)[0] and at.button(key="train.start").disabled
    at.text_input(key="train.hidden_sizes").set_value("32").run()
    assert not at.error
    # 100 steps is less than one update of 16 envs x 8 steps, whatever the preset says
    set_fields(at, {"num_envs": 16, "rollout_steps": 8, "total_steps": 100})
    warnings = [w.value for w in at.warning]
    assert any("smaller than one update" in w for w in warnings), warnings
    assert any("only the final checkpoint" in w for w in warnings), warnings
    set_fields(at, {"eval_every": 50})  # within the 100-step budget
    assert not any("evaluated once" in w.value for w in at.warning)
    set_fields(at, {"eval_every": 1_000_000})
    assert any(
        w.value.startswith("eval every (1,000,000) is not below budget (env steps, total_")
        for w in at.warning
    )
    set_fields(at, {"eval_every": 100})  # at the budget: also one evaluation only
    assert any("evaluated once" in w.value for w in at.warning)
    set_fields(at, {"gamma": 1.0, "lambda_": 1.0})
    assert (
        "γ (gamma) and λ (lambda_) both 1: undiscounted Monte Carlo advantages, the "
        "highest-variance setting." in [w.value for w in at.warning]
    )


@pytest.mark.slow
def test_start_puts_a_run_in_the_store_and_the_page_shows_it(data_dir):
    at = app("pages/train.py")
    set_fields(at, TINY)
    at.button(key="train.start").click().run()
    runs = RunStore(data_dir).list_runs()
    assert len(runs) == 1 and runs[0].config["total_steps"] == 600
    assert any(markdown_text(runs[0].name) in m.value for m in at.markdown)
    assert wait_until(lambda: RunStore(data_dir).get_run(runs[0].id).status == "finished")
    at.run()
    assert any("finished" in m.value for m in at.markdown)
    assert any("Episodic return" in str(c.proto.spec) for c in at.get("plotly_chart"))


@pytest.mark.slow
def test_stop_button_stops_the_run(data_dir):
    at = app("pages/train.py")
    set_fields(at, {"total_steps": 10_000_000, "checkpoint_every": 0})
    at.button(key="train.start").click().run()
    run_id = RunStore(data_dir).list_runs()[0].id
    assert wait_until(lambda: RunStore(data_dir).get_run(run_id).status == "running")
    at.run()
    at.button(key="train.stop").click().run()
    # generous: on a loaded 2-core machine the worker can take seconds to see the stop
    assert wait_until(lambda: RunStore(data_dir).get_run(run_id).status == "stopped", 20)
    at.run()
    assert any("stopped at step" in m.value for m in at.markdown)


@pytest.mark.slow
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
    # a run never solved has no step: its cell reads as every missing value does, not "None"
    assert frame["solved_at_step"].isna().all()
    assert at.dataframe[0].proto.placeholder == MISSING == "–"
    at.text_input(key="runs.text").set_value(run_ids[0]).run()
    assert at.dataframe[0].value["run_id"].tolist() == [run_ids[0]]
    at.multiselect(key="runs.status").set_value(["failed"]).run()
    assert at.dataframe[0].value.empty


@pytest.mark.slow
def test_a_second_start_switches_the_view_to_the_new_run(data_dir, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(_ui, "_clock", lambda: now[0])
    at = app("pages/train.py")
    set_fields(at, TINY)
    at.button(key="train.start").click().run()
    first = at.selectbox(key="train.view").value
    now[0] += _ui.REPEAT_WINDOW_S + 0.1  # a second start on purpose, not a double click
    at.button(key="train.start").click().run()
    second = at.selectbox(key="train.view").value
    assert first != second
    assert second == RunStore(data_dir).list_runs()[0].id  # the newest run


def _table_key(at) -> str:
    """The runs table's widget key (it names the ids the table shows)."""
    return next(str(e.key) for e in at.dataframe if str(e.key).startswith("runs.table"))


def test_runs_selection_follows_run_ids_when_another_process_adds_a_run(data_dir):
    """Rows are positions; a run created elsewhere between two clicks shifts them. The page must
    never open (or offer to delete) the run that moved into the selected row."""
    store = RunStore(data_dir)
    older = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="older run")
    store.finish_run(older, "stopped")
    newer = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="newer run")
    store.finish_run(newer, "stopped")
    at = app("pages/runs.py")
    key = _table_key(at)
    at.session_state[key] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    headers = [m.value for m in at.markdown if "—" in m.value]
    assert any("older run" in h for h in headers) and not any("newer run" in h for h in headers)
    # another process adds a run: it takes row 0, pushing "older run" to row 2
    intruder = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="intruder")
    store.finish_run(intruder, "stopped")
    at.run()
    headers = [m.value for m in at.markdown if "—" in m.value]
    assert not any("newer run" in h or "intruder" in h for h in headers), headers
    if not headers:  # the selection was dropped, not redirected
        assert any("Select one run to open it" in c.value for c in at.caption)
    at.session_state[_table_key(at)] = {"selection": {"rows": [2], "columns": [], "cells": []}}
    at.run()
    assert any("older run" in m.value for m in at.markdown if "—" in m.value)
    assert at.text_input(key=f"runs.name.{older}").value == "older run"  # rename acts on the id


def _from_url(at, name: str) -> list[str]:
    """What the page's URL holds under ``name`` (AppTest keeps one value as a string)."""
    value = at.query_params.get(name, [])
    return [value] if isinstance(value, str) else list(value)


def test_the_runs_page_keeps_its_selection_and_status_filter_in_the_url(data_dir):
    """A pasted ``/runs?run=ID`` opens with that run selected; the runs and statuses the user
    chooses are written back (a reload or Back opens the same view); a URL that changes under
    the page wins over the table; with nothing selected the URL names no run; reached without
    one, the page opens on the run the user last looked at."""
    store = RunStore(data_dir)
    ids = {}
    for name, status in (("first", "finished"), ("second", "stopped"), ("third", "failed")):
        ids[name] = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name=name)
        store.finish_run(ids[name], status)

    def opened() -> list[str]:
        return [n for n in ids for m in at.markdown if "—" in m.value and f"**{n}**" in m.value]

    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.query_params["run"] = ids["second"]
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    assert opened() == ["second"]
    # the user's choice reaches the URL: two runs, in the order chosen
    shown = at.dataframe[0].value["run_id"].tolist()
    rows = [shown.index(ids["first"]), shown.index(ids["third"])]
    at.session_state[_table_key(at)] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    at.run()
    assert _from_url(at, "run") == [ids["first"], ids["third"]]
    assert at.selectbox(key="runs.metric")  # overlaid
    # a status filter reaches it too; the selected run it hides leaves the selection
    at.multiselect(key="runs.status").set_value(["failed", "stopped"]).run()
    assert _from_url(at, "status") == ["failed", "stopped"]
    assert set(at.dataframe[0].value["run_id"]) == {ids["second"], ids["third"]}
    assert opened() == ["third"] and _from_url(at, "run") == [ids["third"]]
    # Back (the URL changes under the page): the URL's run wins over the table
    at.query_params["run"] = ids["second"]
    at.run()
    assert not at.exception and opened() == ["second"]
    # nothing selected: no run in the URL, so a reload opens none
    at.session_state[_table_key(at)] = {"selection": {"rows": [], "columns": [], "cells": []}}
    at.run()
    assert _from_url(at, "run") == [] and opened() == []
    # … and a run another process adds (a new table) selects nothing either
    ids["fourth"] = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="fourth")
    store.finish_run(ids["fourth"], "failed")
    at.run()
    assert len(at.dataframe[0].value) == 3 and opened() == []
    # reached without a URL (the sidebar), it opens on the run the user last looked at
    at.session_state[_table_key(at)] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    last = _from_url(at, "run")
    at.query_params.clear()
    at.switch_page("pages/train.py").run()
    assert at.selectbox(key="train.view").value == last[0]
    at.query_params.clear()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    assert [ids[n] for n in opened()] == last
    assert at.multiselect(key="runs.status").value == ["failed", "stopped"]
    # a pasted link with a status filter, in another tab
    fresh = AppTest.from_file("../dashboard.py", default_timeout=60)
    fresh.query_params.update(status="finished")
    fresh.run()
    fresh.switch_page("pages/runs.py").run()
    assert fresh.multiselect(key="runs.status").value == ["finished"]
    assert fresh.dataframe[0].value["run_id"].tolist() == [ids["first"]]


def test_a_look_at_the_runs_page_keeps_the_run_the_user_was_looking_at(data_dir):
    """The Runs page's kept status filter hides the run the user looks at elsewhere: visiting
    the page without clicking leaves that run the session's context (the Train page, reached
    from the sidebar, still opens on it)."""
    store = RunStore(data_dir)
    a = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="A")
    store.finish_run(a, "finished")
    b = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="B")
    store.finish_run(b, "failed")
    at = AppTest.from_file("../dashboard.py", default_timeout=60)
    at.run()
    at.switch_page("pages/runs.py").run()
    at.multiselect(key="runs.status").set_value(["failed"]).run()
    at.query_params.clear()
    at.switch_page("pages/train.py").run()
    at.selectbox(key="train.view").set_value(a).run()
    at.query_params.clear()
    at.switch_page("pages/runs.py").run()  # a look, nothing clicked: A is filtered out
    assert not at.exception and at.multiselect(key="runs.status").value == ["failed"]
    at.query_params.clear()
    at.switch_page("pages/train.py").run()
    assert at.selectbox(key="train.view").value == a


def test_overlaying_runs_of_different_envs_warns(data_dir):
    store = RunStore(data_dir)
    for env_id in ("CartPole-v1", "Acrobot-v1"):
        run_id = store.create_run({"env_id": env_id, "total_steps": 10}, name=env_id)
        store.flush(run_id, [(M.EPISODIC_RETURN.key, 1, 0.0, 1.0)], env_steps=1)
        store.finish_run(run_id, "stopped")
    at = app("pages/runs.py")
    at.session_state[_table_key(at)] = {"selection": {"rows": [0, 1], "columns": [], "cells": []}}
    at.run()
    assert not at.exception
    warning = next(w.value for w in at.warning if "different environments" in w.value)
    assert "Acrobot-v1" in warning and "CartPole-v1" in warning
    assert len(at.get("plotly_chart")) == 1  # one overlay chart, one trace per run
    # each named as the pickers name it, algorithm included
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = {t.get("name") for t in spec["data"]}
    assert {run_label(r) for r in store.list_runs()} <= names, names


def test_a_run_name_renders_as_text_in_the_header(data_dir):
    evil = "**bold** [x](javascript:alert(1)) ![i](http://e/x.png) <b>h</b> :red[r] $x^2$"
    store = RunStore(data_dir)
    run_id = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name=evil)
    store.finish_run(run_id, "stopped")
    at = app("pages/runs.py")
    at.session_state[_table_key(at)] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    header = next(m.value for m in at.markdown if "—" in m.value)
    assert markdown_text(evil) in header  # every markdown character escaped: shown as typed


@pytest.mark.parametrize(
    ("broken", "words"),
    [
        ("garbage file", "not a database"),
        ("data folder is a file", "is a file, not a folder"),
        ("read-only folder", "is read-only"),
    ],
)
def test_an_unusable_store_gets_one_message_naming_the_path(tmp_path, monkeypatch, broken, words):
    import streamlit as st

    folder = tmp_path / "data"
    if broken == "garbage file":
        folder.mkdir()
        (folder / "runs.sqlite3").write_bytes(b"garbage" * 500)
        named = folder / "runs.sqlite3"
    elif broken == "data folder is a file":
        folder.write_text("not a folder")
        named = folder
    else:
        RunStore(folder).close()
        named = folder
    monkeypatch.setenv("GAE_CORE_DATA", str(folder))
    st.cache_resource.clear()
    guard = read_only_folder(folder) if broken == "read-only folder" else contextlib.nullcontext()
    try:
        with guard:
            for page in (None, "pages/train.py", "pages/runs.py"):
                at = AppTest.from_file("../dashboard.py", default_timeout=60).run()
                if page:
                    at.switch_page(page).run()
                assert not at.exception
                errors = [e.value for e in at.error]
                assert len(errors) == 1 and str(named) in errors[0] and words in errors[0]
    finally:
        st.cache_resource.clear()


def test_a_run_with_a_corrupt_row_is_listed_and_says_what_is_wrong(data_dir):
    store = RunStore(data_dir)
    good = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="good run")
    store.finish_run(good, "stopped")
    bad = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="bad run")
    store.finish_run(bad, "stopped")
    store.close()
    raw = sqlite3.connect(data_dir / "runs.sqlite3")
    raw.execute("UPDATE runs SET config = '{broken' WHERE id = ?", (bad,))
    raw.commit()
    raw.close()
    at = app("pages/runs.py")
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["run_id"]) == {good, bad}
    assert "config is not a valid JSON object" in table.set_index("run_id").loc[bad, "error"]
    at.session_state[_table_key(at)] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()  # the newest row: the damaged run opens and says why
    assert not at.exception
    header = next(m.value for m in at.markdown if "—" in m.value)
    assert "damaged" in header and "config is not a valid JSON object" in header
    # a link to it from a page that leaves damaged runs out says that is why
    RunStore(data_dir).save_checkpoint(good, 10, b"x", [])  # the lab lists the good run
    linked = AppTest.from_file("../dashboard.py", default_timeout=60)
    linked.query_params.update(run=bad)
    linked.run()
    linked.switch_page("pages/lab.py").run()
    notes = [note for note in said(linked.info) if note.startswith("The link names")]
    assert len(notes) == 1 and f"run '{bad}' is damaged: " in notes[0], notes
    assert "config is not a valid JSON object" in notes[0]


def test_delete_removes_the_opened_run_even_after_another_process_deleted_one(data_dir):
    """The user opens a run and asks to delete it; before the confirmation, another process
    deletes the newest run, so every row moves up one. The confirmation deletes the run that
    was opened, by its id, and nothing else."""
    store = RunStore(data_dir)
    ids = {}
    for name in ("oldest", "middle", "newest"):
        ids[name] = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name=name)
        store.finish_run(ids[name], "stopped")
    at = app("pages/runs.py")
    at.session_state[_table_key(at)] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    assert any("middle" in m.value for m in at.markdown if "—" in m.value)
    at.button(key="runs.delete").click().run()
    assert any("middle" in m.value and ids["middle"] in m.value for m in at.markdown)
    store.delete_run(ids["newest"])  # another process; "oldest" moves into row 1
    at.button(key="runs.delete.confirm").click().run()
    assert not at.exception
    assert [r.name for r in store.list_runs()] == ["oldest"]
    # the deleted run leaves the URL: the page does not call the user's own Delete a stale
    # link, and a link to it opened later says the folder no longer holds it
    assert ids["middle"] not in str(at.query_params.get("run", ""))
    assert not any(i.value.startswith("The link names") for i in at.info)
    later = AppTest.from_file("../dashboard.py", default_timeout=60)
    later.query_params.update(run=ids["middle"])
    later.run()
    later.switch_page("pages/runs.py").run()
    notes = [note for note in said(later.info) if note.startswith("The link names")]
    gone = ids["middle"]
    assert notes == [f"The link names a run this page cannot open: this data folder holds no "
                     f"run '{gone}' (deleted, or a link from another folder)."]  # fmt: skip
    # an empty run in a link (?run=…&run=) is no run to name
    blank = AppTest.from_file("../dashboard.py", default_timeout=60)
    blank.query_params.update(run=[gone, ""])
    blank.run()
    blank.switch_page("pages/runs.py").run()
    assert [note for note in said(blank.info) if note.startswith("The link names")] == notes


def test_choosing_an_env_loads_its_preset_and_every_field_stays_editable(data_dir):
    from gae_core.agent.config import FIELD_SPECS
    from gae_core.agent.presets import TUNED_FIELDS, preset_values

    at = app("pages/train.py")
    assert at.text_input(key="train.total_steps").value == "500000"  # CartPole's preset
    assert any("CartPole-v1's A2C preset" in e.label for e in at.expander)  # and why it is so
    at.text_input(key="train.seed").set_value("7").run()  # a choice no preset makes
    at.selectbox(key="train.env_id").set_value("Pendulum-v1").run()
    assert at.text_input(key="train.seed").value == "7"  # kept
    (toast,) = [t.value for t in at.toast]
    # it names what the preset changed (six fields, then a count), and keeps the rest
    said = re.fullmatch(r"Pendulum-v1, A2C: the tuned settings are its preset, the others as you "
                        r"left them \(new values: (.*)\)\.", toast)  # fmt: skip
    named, _, more = said.group(1).partition(" and ")
    before, preset = preset_values("CartPole-v1"), preset_values("Pendulum-v1")
    differ = [FIELD_SPECS[n].label for n in preset if n in TUNED_FIELDS and before[n] != preset[n]]
    assert named.split(", ") == differ[:6] and more == f"{len(differ) - 6} more"
    assert at.text_input(key="train.total_steps").value == str(preset["total_steps"]) == "1000000"
    assert at.number_input(key="train.gamma").value == 0.9
    assert at.checkbox(key="train.normalize_observations").value is True
    assert at.selectbox(key="train.lr_schedule").value == "linear"
    at.number_input(key="train.gamma").set_value(0.95).run()  # the user's change sticks
    assert at.number_input(key="train.gamma").value == 0.95
    assert not at.error and not at.button(key="train.start").disabled
    # choosing PPO loads Pendulum's PPO preset (the Zoo's row) and keeps the seed
    at.selectbox(key="train.algo").set_value("ppo").run()
    ppo = preset_values("Pendulum-v1", "ppo")
    for name in ("rollout_steps", "num_envs", "minibatch_size", "n_epochs", "total_steps"):
        assert at.text_input(key=f"train.{name}").value == str(ppo[name]), name
    assert at.text_input(key="train.seed").value == "7"
    assert any("Pendulum-v1's PPO preset" in e.label for e in at.expander)
    assert not at.error and not at.button(key="train.start").disabled


def test_a_field_with_no_effect_given_the_forms_choices_is_greyed_with_why(data_dir):
    """Under A2C the PPO fields, with the critic following λ its own λ, on discrete actions the
    Gaussian's: drawn disabled, their help saying why (TrainConfig.idle_fields, in the form's
    words); a choice that gives them an effect enables them at once."""
    at = app("pages/train.py")  # CartPole, A2C
    epochs = at.text_input(key="train.n_epochs")
    assert epochs.disabled and epochs.help.endswith(
        "No effect now: algorithm (algo) is a2c (one gradient step per rollout, no clipping)."
    )
    assert at.number_input(key="train.critic_lambda").disabled
    assert at.checkbox(key="train.use_sde").disabled
    assert (
        "No effect now: CartPole-v1's actions are discrete."
        in at.checkbox(key="train.use_sde").help
    )
    for live in ("train.lambda_", "train.gamma"):
        assert not at.number_input(key=live).disabled, live
    assert not at.text_input(key="train.total_steps").disabled
    at.selectbox(key="train.algo").set_value("ppo").run()
    assert not at.text_input(key="train.n_epochs").disabled
    assert "No effect now" not in at.text_input(key="train.n_epochs").help
    at.selectbox(key="train.critic_target").set_value("fixed_lambda").run()
    assert not at.number_input(key="train.critic_lambda").disabled
    at.selectbox(key="train.env_id").set_value("Pendulum-v1").run()
    assert not at.checkbox(key="train.use_sde").disabled  # a Gaussian policy: gSDE applies
    assert not at.error and not at.button(key="train.start").disabled
    # a value the field cannot take stays editable, idle or not: a greyed box the user could
    # not fix would keep Start disabled
    at.number_input(key="train.critic_lambda").set_value(None).run()
    at.selectbox(key="train.critic_target").set_value("advantage_lambda").run()
    assert not at.number_input(key="train.critic_lambda").disabled
    assert at.error and at.button(key="train.start").disabled
    at.number_input(key="train.critic_lambda").set_value(0.5).run()  # the fix is kept …
    assert at.number_input(key="train.critic_lambda").value == 0.5
    assert not at.error and not at.button(key="train.start").disabled
    at.run()  # … and the field greys on the next rerun (Streamlit drops a disabled box's input)
    assert at.number_input(key="train.critic_lambda").disabled
    assert at.number_input(key="train.critic_lambda").value == 0.5
    # a device this server lacks is the form's error, and greys nothing less
    at.selectbox(key="train.device").set_value("cuda").run()
    assert at.number_input(key="train.critic_lambda").disabled


def test_a_budget_typed_in_the_same_rerun_as_an_env_change_is_kept(data_dir):
    """On a busy server Streamlit can run an env change and a budget typed right after it as
    one rerun, the preset's callback after the typed value arrived: the typed budget wins, the
    rest of the preset loads, and the toast says which was kept."""
    from gae_core.agent.presets import preset_values

    at = app("pages/train.py")
    at.selectbox(key="train.env_id").set_value("Acrobot-v1")
    at.text_input(key="train.total_steps").set_value("2000")
    at.run()  # both in one rerun
    preset = preset_values("Acrobot-v1")
    assert at.text_input(key="train.total_steps").value == "2000"
    assert at.text_input(key="train.num_envs").value == str(preset["num_envs"]) != "8"
    (toast,) = [t.value for t in at.toast]
    assert "kept as you typed: budget (env steps)" in toast and "envs" in toast
    # an algorithm change is the user's choice, never "kept as you typed"
    at.selectbox(key="train.algo").set_value("ppo").run()
    (toast,) = [t.value for t in at.toast]
    assert "kept as you typed" not in toast and "PPO" in toast
    at.selectbox(key="train.algo").set_value("a2c").run()
    # an env change alone still loads the preset's budget over the one typed before it
    at.selectbox(key="train.env_id").set_value("CartPole-v1").run()
    assert at.text_input(key="train.total_steps").value == str(
        preset_values("CartPole-v1")["total_steps"]
    )


def test_a_short_budget_offers_to_fit_checkpoints_and_evaluations_to_it(data_dir):
    """CartPole's preset checkpoints every 50,000 steps: a 20,000-step run would keep one
    checkpoint (nothing for the explorer and the lab to compare). The warning comes with a
    button that spaces them over the budget, and then neither warning is left."""
    at = app("pages/train.py")
    assert not [b for b in at.button if b.key == "train.spacing"]  # the preset's budget: none
    at.text_input(key="train.total_steps").set_value("20000").run()
    assert any("checkpoint every (50,000) exceeds" in w for w in said(at.warning))
    button = at.button(key="train.spacing")
    assert button.label == ("Fit them to this budget: checkpoint every 5,000 and evaluate "
                            "every 2,000 env steps")  # fmt: skip
    button.click().run()
    assert at.text_input(key="train.checkpoint_every").value == "5000"
    assert at.text_input(key="train.eval_every").value == "2000"
    assert not [w for w in said(at.warning) if "every" in w]
    assert not [b for b in at.button if b.key == "train.spacing"]
    assert not at.button(key="train.start").disabled


def test_an_invalid_value_blocks_start_with_the_fields_range(data_dir):
    """γ = 1.5 typed into the form: the error names γ and its range and Start is disabled (the
    browser no longer swallows the value and trains with the last valid one). Three bad fields
    at once: one error each, in the form's order, under the labels the form shows."""
    at = app("pages/train.py")
    at.number_input(key="train.gamma").set_value(1.5).run()
    assert said(at.error) == ["γ (gamma) must be in [0.0, 1.0], got 1.5"]
    assert at.button(key="train.start").disabled
    at.text_input(key="train.num_envs").set_value("0").run()
    at.text_input(key="train.rollout_steps").set_value("5000").run()
    assert said(at.error) == [
        "γ (gamma) must be in [0.0, 1.0], got 1.5",
        "envs (num_envs) must be an integer in [1, 1024], got 0",
        "rollout steps must be an integer in [1, 4096], got 5000",
    ]
    at.text_input(key="train.total_steps").set_value("0").run()  # a label with parentheses
    assert "budget (env steps, total_steps) must be an integer in [1, " in said(at.error)[0]
    at.text_input(key="train.total_steps").set_value("10000").run()
    at.number_input(key="train.gamma").set_value(None).run()  # a cleared box: no silent 0
    assert said(at.error)[0] == "γ (gamma) must be a number in [0.0, 1.0], got nothing"
    at.number_input(key="train.gamma").set_value(0.99).run()
    at.text_input(key="train.num_envs").set_value("8").run()
    at.text_input(key="train.rollout_steps").set_value("5").run()
    assert not at.error and not at.button(key="train.start").disabled


def test_an_int_field_takes_any_text_and_says_in_words_what_is_wrong(data_dir):
    """A seed past 2^53 (a browser number box refused it with a red mark and never sent it, so
    the form could not say why): the box is text, the form names the field and its range and
    Start is disabled; separators, underscores and spaces are read."""
    at = app("pages/train.py")
    at.text_input(key="train.seed").set_value("99999999999999999999").run()
    assert said(at.error) == [
        "seed must be an integer in [0, 2147483647], got 99999999999999999999"
    ]
    assert at.button(key="train.start").disabled
    at.text_input(key="train.seed").set_value("7 seeds").run()
    assert said(at.error) == ["seed must be an integer in [0, 2147483647], got '7 seeds'"]
    assert at.button(key="train.start").disabled
    at.text_input(key="train.seed").set_value(" 42 ").run()
    assert not at.error and not at.button(key="train.start").disabled
    # "1,000" and "1_024" are read as numbers: the form's warning quotes them back
    at.text_input(key="train.total_steps").set_value("1,000").run()
    at.text_input(key="train.num_envs").set_value("1_024").run()
    assert not at.error and not at.button(key="train.start").disabled
    assert any(
        w.value.startswith("budget (env steps, total_steps) (1,000) is smaller than one update")
        and "= 5,120)" in w.value  # 1,024 envs × the preset's 5 steps
        for w in at.warning
    ), [w.value for w in at.warning]
    assert at.text_input(key="train.total_steps").value == "1,000"  # the box keeps the text
    at.text_input(key="train.total_steps").set_value("1.5e3").run()
    assert any("(1,500) is smaller than one update" in w.value for w in at.warning)
    at.text_input(key="train.total_steps").set_value("1,0").run()  # not a thousands separator
    assert said(at.error) == [
        "budget (env steps, total_steps) must be an integer in [1, 10000000000], got '1,0'"
    ]
    # what was typed shows as typed: a link, bold or maths does not act (escaped markdown)
    at.text_input(key="train.total_steps").set_value("[x](e.org) **b** $y$").run()
    assert [e.value for e in at.error] == [
        markdown_text("budget (env steps, total_steps) must be an integer in [1, 10000000000], "
                      "got '[x](e.org) **b** $y$'")
    ]  # fmt: skip


def test_the_sweep_forms_int_fields_and_first_seed_say_in_words_what_is_wrong(data_dir):
    """The compare page's launch form: its config fields are the Train page's text boxes, and
    its first seed too: a value past 2^53 is named with its range and blocks Launch."""
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    at.text_input(key="cmp.first_seed").set_value("99999999999999999999").run()
    assert said(at.error) == [
        "first seed must be an integer in [0, 2147483647], got 99999999999999999999"
    ]
    assert at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.first_seed").set_value("seven").run()
    assert said(at.error) == ["first seed must be an integer in [0, 2147483647], got 'seven'"]
    assert at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.first_seed").set_value("1,000").run()
    assert not at.error and not at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.total_steps").set_value("99999999999999999999").run()
    assert said(at.error) == [
        "budget (env steps, total_steps) must be an integer in [1, 10000000000], got "
        "99999999999999999999"
    ]
    assert at.button(key="cmp.launch").disabled
    at.text_input(key="cmp.total_steps").set_value(" 1_500 ").run()
    assert not at.error and not at.button(key="cmp.launch").disabled


def test_seeds_per_lambda_and_workers_are_typed_named_with_their_range_and_launch_nothing(
    data_dir,
):
    """The sweep's seeds per λ and workers are text read on the server, as its first seed: a
    value past 2^53, text that is no number or one out of range is named in words with the
    box's range (a 5,000-digit one by its start and length), Launch is disabled, and a click
    sent with the typed value (before a rerun disabled it) launches nothing; a value in range
    clears it."""
    store = RunStore(data_dir)
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    cores = os.cpu_count() or 1
    assert at.text_input(key="cmp.seeds").value == "10"
    assert at.text_input(key="cmp.workers").value == str(cores)  # a new study: one per core
    assert not at.error and not at.button(key="cmp.launch").disabled
    lam = label("lambda_")
    for key, name, most in (("cmp.seeds", f"seeds per {lam}", 100),
                            ("cmp.workers", "worker processes", cores)):  # fmt: skip
        assert f"an integer, 1 to {most}" in at.text_input(key=key).help
        for typed, got in (("1e20", "100000000000000000000"), ("abc", "'abc'"), ("0", "0"),
                           (str(most + 1), str(most + 1)), ("2.5", "'2.5'"),
                           ("9" * 5000, "'99999999999999999999…' (5,000 digits)")):  # fmt: skip
            at.text_input(key=key).set_value(typed)  # typed, and Launch clicked before the
            at.button(key="cmp.launch").click().run()  # rerun that would disable it
            assert not at.exception and store.list_sweeps() == [], typed
            assert said(at.error) == [f"{name} must be an integer in [1, {most}], got {got}"]
            assert at.button(key="cmp.launch").disabled
            at.text_input(key=key).set_value(" 1 ").run()
            assert not at.error and not at.button(key="cmp.launch").disabled
    # the budget, set far below Launch, is on it
    budget = int(at.text_input(key="cmp.total_steps").value)
    assert at.button(key="cmp.launch").label.endswith(f"× 1 seed), {budget:,} env steps each")
    # γ values given: the grid sets γ, and the form has no γ box to contradict it
    assert at.number_input(key="cmp.gamma")
    seeds = at.text_input(key="cmp.seeds").value
    at.text_input(key="cmp.gammas").set_value("0.9 0.99").run()
    assert not [w for w in at.number_input if w.key == "cmp.gamma"]
    # … and the seeds are per cell of the grid, the count kept as typed
    assert at.text_input(key="cmp.seeds").label == "seeds per γ × λ cell"
    assert at.text_input(key="cmp.seeds").value == seeds
    assert f" × 2 γ × 1 seed), {budget:,} env steps each" in at.button(key="cmp.launch").label
    # … and while hidden it still follows the env's preset (Pendulum's γ is 0.9)
    at.selectbox(key="cmp.env_id").set_value("Pendulum-v1").run()
    at.text_input(key="cmp.gammas").set_value("").run()
    assert at.number_input(key="cmp.gamma").value == 0.9
    # what was typed shows as typed: a link, bold or a colour directive does not act
    at.text_input(key="cmp.seeds").set_value("[x](e.org) **b** :red[c]").run()
    assert [e.value for e in at.error] == [
        markdown_text(f"seeds per {lam} must be an integer in [1, 100], got "
                      "'[x](e.org) **b** :red[c]'")
    ]  # fmt: skip


def test_the_workers_box_takes_ray_s_range_and_back_on_this_machine_its_cores(data_dir):
    """With Ray the workers box allows up to 256 tasks at once; back on this machine a count
    past its cores becomes its cores (a wrong text stays, named)."""
    if not ray_installed():
        pytest.skip("the backend switch shows with Ray installed")
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    at.segmented_control(key="cmp.backend").set_value("ray").run()
    at.text_input(key="cmp.workers").set_value("257").run()
    assert said(at.error) == ["worker processes must be an integer in [1, 256], got 257"]
    at.text_input(key="cmp.workers").set_value("256").run()
    assert not at.error
    at.segmented_control(key="cmp.backend").set_value("local").run()
    cores = os.cpu_count() or 1
    assert at.text_input(key="cmp.workers").value == str(cores) and not at.error
    at.segmented_control(key="cmp.backend").set_value("ray").run()
    at.text_input(key="cmp.workers").set_value("many").run()
    at.segmented_control(key="cmp.backend").set_value("local").run()
    assert said(at.error) == [f"worker processes must be an integer in [1, {cores}], got 'many'"]


def test_rename_confirms_and_retention_thins_checkpoints(data_dir):
    store = RunStore(data_dir)
    run_id = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="before")
    for step in (100, 200, 300, 400, 500):
        store.save_checkpoint(run_id, step, b"x" * 1000, [b"t" * 500])
    store.finish_run(run_id, "finished")
    at = app("pages/runs.py")
    at.session_state[next(str(e.key) for e in at.dataframe)] = {
        "selection": {"rows": [0], "columns": [], "cells": []}
    }
    at.run()
    # the button is live before the box is (a text box sends its value when it loses focus:
    # a button disabled until then took the first click as that blur); unchanged, it says so
    assert not at.button(key="runs.rename").disabled
    at.button(key="runs.rename").click().run()
    assert "Type the new name in the box, then press Rename." in [i.value for i in at.info]
    assert "runs.renaming" not in at.session_state
    # a name the store would refuse is refused before the dialog asks to confirm it
    for bad, words in (("   ", "run name cannot be empty"), ("x" * 201, "at most 200")):
        at.text_input(key=f"runs.name.{run_id}").set_value(bad).run()
        at.button(key="runs.rename").click().run()
        assert "runs.renaming" not in at.session_state
        assert [e for e in said(at.error) if words in e], said(at.error)
    at.text_input(key=f"runs.name.{run_id}").set_value("after").run()
    at.button(key="runs.rename").click().run()
    assert store.get_run(run_id).name == "before"  # nothing until confirmed
    assert any("Rename" in m.value and "after" in m.value for m in at.markdown)
    at.button(key="runs.rename.confirm").click().run()
    assert store.get_run(run_id).name == "after"
    assert any(c.value.startswith("Store: ") and " MB at " in c.value for c in at.caption)
    at.number_input(key="runs.keep").set_value(2).run()
    at.button(key="runs.thin").click().run()
    assert store.checkpoint_steps(run_id) == [100, 300, 500]  # every 2nd, and the last
    assert trajectory_steps(store, run_id) == [100, 300, 500]
    assert "Removed 2 checkpoints" in at.success[0].value


@pytest.mark.slow
def test_home_quick_start_trains_the_cartpole_preset_and_lists_recent_runs(data_dir):
    from gae_core.agent.presets import preset_config

    at = app()
    assert "None yet." in [c.value for c in at.caption]
    at.button(key="home.quick").click().run()
    assert not at.exception
    (run,) = RunStore(data_dir).list_runs()
    assert run.config == preset_config("CartPole-v1").to_dict()
    _ui.manager().stop(run.id)
    _ui.manager().wait(run.id, 30)
    at = app()
    assert any(markdown_text(run.name) in m.value for m in at.markdown)


def test_a_run_that_ended_before_its_first_update_says_so_instead_of_waiting(data_dir):
    """A sweep's trial cancelled before its turn has no metrics and never will: its charts say
    it ended, where a queued or running run says its first metrics are on their way."""
    store = RunStore(data_dir)
    waiting = store.create_run(TrainConfig(**TINY).to_dict(), name="waits")
    ended = store.create_run(TrainConfig(**TINY).to_dict(), name="cancelled")
    store.finish_run(ended, "stopped")
    at = app("pages/train.py")
    for run_id, text in ((waiting, "No metrics yet: the first ones arrive after the first "
                          "update."), (ended, "No metrics: the run ended before its first "
                                          "update.")):  # fmt: skip
        at.selectbox(key="train.view").set_value(run_id).run()
        assert not at.exception
        assert text in [i.value for i in at.info], [i.value for i in at.info]


def test_the_train_form_keeps_what_the_user_typed_across_pages(data_dir):
    """Going to another page and back does not reset the form to CartPole's preset."""
    at = app("pages/train.py")
    at.selectbox(key="train.env_id").set_value("Pendulum-v1").run()
    at.text_input(key="train.seed").set_value("7").run()
    at.number_input(key="train.gamma").set_value(0.95).run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    at.switch_page("pages/train.py").run()
    assert not at.exception
    assert at.selectbox(key="train.env_id").value == "Pendulum-v1"
    assert at.text_input(key="train.seed").value == "7"
    assert at.number_input(key="train.gamma").value == 0.95


def test_a_ppo_runs_page_draws_its_kl_and_clip_fraction_and_an_a2c_runs_does_not(data_dir):
    """PPO's two diagnostics (approximate KL, clip fraction) are charts of the run's page
    wherever the run logged them, with their CSV links; an A2C run, which logs neither, shows
    no empty chart for them."""
    store = RunStore(data_dir)
    ids = {}
    for algo in ("ppo", "a2c"):
        ids[algo] = store.create_run(TrainConfig(algo=algo).to_dict(), name=f"{algo} run")
        keys = [M.EPISODIC_RETURN, M.POLICY_LOSS] + (
            [M.APPROX_KL, M.CLIP_FRACTION] if algo == "ppo" else []
        )
        rows = [(m.key, 256 * k, 0.1 * k, 0.01 * (k + 1)) for m in keys for k in range(1, 6)]
        store.flush(ids[algo], rows, env_steps=1280)
        store.finish_run(ids[algo], "finished")
    for algo, run_id in ids.items():
        at = AppTest.from_file("../dashboard.py", default_timeout=60)
        at.query_params["run"] = run_id
        at.run()
        at.switch_page("pages/runs.py").run()
        assert not at.exception
        charts = " ".join(str(c.proto.spec) for c in at.get("plotly_chart"))
        drawn = [m.title for m in (M.APPROX_KL, M.CLIP_FRACTION) if m.title in charts]
        assert "Policy loss" in charts
        assert drawn == ([M.APPROX_KL.title, M.CLIP_FRACTION.title] if algo == "ppo" else [])
    # the table and the run pickers say which algorithm each run trained with; a run stored
    # before PPO joined (no algo in its config) trained A2C
    old = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="old run")
    store.finish_run(old, "finished")
    at.run()
    table = at.dataframe[0].value.set_index("run_id")["algo"]
    assert table.to_dict() == {ids["ppo"]: "PPO", ids["a2c"]: "A2C", old: "A2C"}
    assert run_label(store.get_run(ids["ppo"])) == f"ppo run · PPO · {ids['ppo']}"
    store.rename_run(ids["ppo"], "PPO CartPole-v1 seed = 0")  # (a default name says it already)
    assert run_label(store.get_run(ids["ppo"])) == f"PPO CartPole-v1 seed = 0 · {ids['ppo']}"


@pytest.mark.slow
def test_reuse_settings_fills_the_form_with_a_runs_config_and_start_trains_it_again(data_dir):
    """ "Reuse settings" puts the shown run's stored config in the form (the CLI's --like), env,
    algorithm and preset-tuned fields included; Start then stores the same config. A run whose
    env is not registered here cannot be reused, and says why."""
    store = RunStore(data_dir)
    fields = {**TINY, "env_id": "Acrobot-v1", "lambda_": 0.8, "hidden_sizes": (16,),
              "seed": 7, "normalize_rewards": True, "optimizer": "rmsprop"}  # fmt: skip
    old = store.create_run(TrainConfig(**fields).to_dict(), name="*to* [reuse](http://x)")
    store.finish_run(old, "stopped")
    at = app("pages/train.py")
    assert at.selectbox(key="train.env_id").value == "CartPole-v1"  # the form's own
    at.button(key="train.reuse").click().run()
    assert not at.exception, at.exception
    assert at.selectbox(key="train.env_id").value == "Acrobot-v1"
    assert at.text_input(key="train.seed").value == "7"
    assert at.text_input(key="train.hidden_sizes").value == "16"
    assert at.number_input(key="train.lambda_").value == 0.8
    assert at.checkbox(key="train.normalize_rewards").value is True
    said = f"The form now holds the settings of {markdown_text(run_label(store.get_run(old)))}:"
    assert any(t.value.startswith(said) for t in at.toast)  # the name inert
    at.button(key="train.start").click().run()
    (new,) = [r for r in store.list_runs() if r.id != old]
    assert new.config == store.get_run(old).config
    wait_until(lambda: not store.get_run(new.id).active)
    foreign = store.create_run({**TrainConfig(**TINY).to_dict(), "env_id": "Elsewhere/Nope-v0"})
    store.finish_run(foreign, "failed")
    at.run()
    at.selectbox(key="train.view").set_value(foreign).run()
    button = at.button(key="train.reuse")
    unknown = markdown_text("env_id 'Elsewhere/Nope-v0' is not a registered environment")
    assert button.disabled and unknown in button.proto.help, button.proto.help
    # a value today's fields refuse: disabled, naming it (a click had raised on the page)
    odd = store.create_run({**store.get_run(old).config, "lambda_": 1.5})
    at.run()
    at.selectbox(key="train.view").set_value(odd).run()
    button = at.button(key="train.reuse")
    assert button.disabled
    assert markdown_text("lambda_ must be in [0.0, 1.0], got 1.5") in button.proto.help


def test_the_train_pages_links_are_drawn_closed_before_the_first_checkpoint(data_dir):
    """The explorer and lab links are on the page from the start, closed with a reason until
    the run has a checkpoint, then open on it: the page's layout never shifts under a click
    when the first checkpoint lands."""
    store = RunStore(data_dir)
    run_id = store.create_run(TrainConfig(**TINY).to_dict(), name="no checkpoint yet")
    at = app("pages/train.py")
    links = {link.proto.label: link.proto for link in at.get("page_link")}
    for name in ("Explore this run", "Measure it in the lab"):
        assert links[name].disabled, name
        assert links[name].help == "Open once the run has a checkpoint."
    store.save_checkpoint(run_id, 100, b"x" * 100, [])
    at.run()
    links = {link.proto.label: link.proto for link in at.get("page_link")}
    for name, page in (("Explore this run", "explorer"), ("Measure it in the lab", "lab")):
        assert not links[name].disabled, name
        assert (links[name].page, links[name].query_string) == (page, f"run={run_id}")
    # a run that ended without one says so, rather than promising one
    ended = store.create_run(TrainConfig(**TINY).to_dict(), name="ended without one")
    store.finish_run(ended, "stopped")
    at.run()  # (the run box lists it)
    at.selectbox(key="train.view").set_value(ended).run()
    links = {link.proto.label: link.proto for link in at.get("page_link")}
    assert links["Explore this run"].disabled
    assert links["Explore this run"].help == "This run saved no checkpoint."


def test_the_sidebar_keeps_a_finished_lab_job_until_the_lab_page_has_shown_its_end(data_dir):
    """A measurement left running stays listed, with its way back, after it ends (done or
    failed) until the lab page has shown how it ended."""
    from gae_core.lab.jobs import LabJob

    def fails(store, run_id, progress, cancel):
        raise ValueError("no checkpoint")

    at = app()
    jobs = _ui.lab_jobs()
    jobs.clear()
    try:
        jobs["gradient abc123"] = ended = LabJob(None, "abc123", measure=lambda *a, **k: [])
        jobs["def456"] = failed = LabJob(None, "def456", measure=fails)
        assert ended.wait(10) and failed.wait(10)
        at.run()
        bars = [p.proto.text for p in at.sidebar.get("progress")]
        assert bars == ["lab (policy gradient): run abc123 · done",
                        "lab (per state): run def456 · failed"]  # fmt: skip
        links = [link.proto for link in at.sidebar.get("page_link")][-2:]
        assert [(link.label, link.query_string) for link in links] == [
            ("open in the lab", "run=abc123&view=policy+gradient"),
            ("open in the lab", "run=def456&view=per+state"),
        ]
        failed.seen = True  # what the lab page's job_status sets once it shows the end
        at.run()
        assert [p.proto.text for p in at.sidebar.get("progress")] == [bars[0]]
    finally:
        jobs.clear()


def test_a_link_naming_the_start_of_an_id_opens_it_or_says_which_ids_it_begins(
    data_dir, monkeypatch
):
    """``?run=`` and ``?sweep=`` take the start of an id as the CLI does: a start one id has
    becomes that id before the page reads it; a start several ids share is said to be one,
    naming them, not "no such run"."""
    import uuid
    from types import SimpleNamespace

    from conftest import said_plain
    from streamlit.testing.v1 import AppTest

    ids = iter(["abcd12340000", "abcd99990000", "fedc55550000"])
    store = RunStore(data_dir)
    with monkeypatch.context() as patched:  # (only these ids: the app draws its own)
        patched.setattr(uuid, "uuid4", lambda: SimpleNamespace(hex=next(ids) + "0" * 20))
        for name in ("first", "second"):
            store.create_run(TrainConfig(total_steps=1000).to_dict(), name=name)
        sweep_id = store.create_sweep({"seed": [0]}, TrainConfig().to_dict())

    def linked(page: str, **query) -> AppTest:
        at = AppTest.from_file("../dashboard.py", default_timeout=60)
        at.query_params.update(query)
        at.run()
        at.switch_page(page).run()
        assert not at.exception, at.exception
        return at

    shared = linked("pages/runs.py", run="abcd")
    notes = [said_plain(i.value) for i in shared.info if i.value.startswith("The link")]
    assert len(notes) == 1 and (
        "'abcd' begins 2 run ids (abcd12340000, abcd99990000): give more of it" in notes[0]
    ), notes
    one = linked("pages/runs.py", run="abcd9")
    assert one.query_params["run"] in ("abcd99990000", ["abcd99990000"])
    assert not [i for i in one.info if i.value.startswith("The link")]
    assert one.text_input(key="runs.name.abcd99990000").value == "second"  # it opened
    swept = linked("pages/compare.py", sweep=sweep_id[:5])
    assert swept.query_params["sweep"] in (sweep_id, [sweep_id])
