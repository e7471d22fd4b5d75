"""The store's CSV exports (gae_core.insight.exports): what each URL answers, read from the store
at the request, and a clear one-line answer for every bad request. The browser tests click the
links on the live pages; here the answers are checked cell by cell."""

from __future__ import annotations

import csv
import io
import sqlite3
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd
import pytest
from conftest import read_only_folder

from gae_core import metrics as M
from gae_core.inert import CSV_FORMULA_PREFIXES
from gae_core.insight import exports, figures
from gae_core.storage.store import DB_FILENAME, RunStore


def get(store: RunStore, url: str) -> exports.Answer:
    parts = urlsplit(url)
    return exports.answer(parts.path, parse_qs(parts.query), lambda: store)


def frame_of(answer: exports.Answer) -> pd.DataFrame:
    assert answer.status == 200, answer.body
    return pd.read_csv(io.StringIO(answer.body))


@pytest.fixture
def store(tmp_path):
    store = RunStore(tmp_path, recover=False)
    yield store
    store.close()


def add_run(store: RunStore, name: str, env_id: str, returns: list[float]) -> str:
    run_id = store.create_run({"env_id": env_id, "lambda_": 0.95, "gamma": 0.99}, name=name)
    rows = [(M.EPISODIC_RETURN.key, 10 * (i + 1), 0.5 * i, r) for i, r in enumerate(returns)]
    rows.append((M.VALUE_LOSS.key, 10, 0.0, 1.5))
    store.flush(run_id, rows, env_steps=10 * len(returns))
    return run_id


def test_runs_csv_holds_the_runs_table_filtered_like_the_page(store):
    a = add_run(store, "=HYPERLINK(evil)", "CartPole-v1", [1.0, 2.0])
    b = add_run(store, "pendulum one", "Pendulum-v1", [-1000.0])
    every = frame_of(get(store, exports.runs_url()))
    assert set(every["run_id"]) == {a, b}
    # a formula-looking name is inert (OWASP: prefixed with a quote)
    assert "'=HYPERLINK(evil)" in every["name"].tolist()
    only = frame_of(get(store, exports.runs_url(envs=["Pendulum-v1"])))
    assert only["run_id"].tolist() == [b]
    assert frame_of(get(store, exports.runs_url(text="PENDULUM")))["run_id"].tolist() == [b]
    assert frame_of(get(store, exports.runs_url(statuses=["running"]))).empty
    queued = frame_of(get(store, exports.runs_url(statuses=["queued", "running"])))
    assert set(queued["run_id"]) == {a, b}
    assert get(store, exports.runs_url()).file_name == "runs.csv"


def test_a_run_metric_csv_is_every_stored_point_and_smoothed_like_the_chart(store):
    returns = list(np.random.default_rng(0).normal(size=3000))  # more than a chart draws
    run_id = add_run(store, "long", "CartPole-v1", returns)
    answer = get(store, exports.run_metric_url(run_id, M.EPISODIC_RETURN.key, smoothing=0.6))
    assert answer.file_name == f"{run_id}_episodic_return.csv"
    frame = frame_of(answer)
    assert len(frame) == 3000 > figures.MAX_POINTS
    np.testing.assert_allclose(frame["episodic_return"], returns, rtol=1e-12)
    np.testing.assert_allclose(
        frame["episodic_return_smoothed"], figures.smooth(np.asarray(returns), 0.6), rtol=1e-9
    )
    # it says which run and settings it holds, before the data
    assert list(frame.columns[:7]) == ["run_id", *exports.RUN_SETTINGS, "smoothing"]
    assert set(frame["run_id"]) == {run_id} and set(frame["smoothing"]) == {0.6}
    assert set(frame["env_id"]) == {"CartPole-v1"} and set(frame["lambda_"]) == {0.95}
    raw = frame_of(get(store, exports.run_metric_url(run_id, M.EPISODIC_RETURN.key)))
    assert "episodic_return_smoothed" not in raw and set(raw["smoothing"]) == {0.0}
    # points logged after one click are in the next
    store.flush(run_id, [(M.EPISODIC_RETURN.key, 99_999, 9.0, 7.0)])
    again = frame_of(get(store, exports.run_metric_url(run_id, M.EPISODIC_RETURN.key)))
    assert len(again) == 3001 and again["episodic_return"].iloc[-1] == 7.0


def test_overlay_csv_is_long_with_one_label_per_run(store):
    a = add_run(store, "first", "CartPole-v1", [1.0, 2.0])
    b = add_run(store, "second", "Pendulum-v1", [3.0])
    store.create_run({"env_id": "CartPole-v1"}, name="not asked for")
    answer = get(store, exports.overlay_url([a, b], M.EPISODIC_RETURN.key))
    frame = frame_of(answer)
    assert frame["run"].tolist() == [
        f"first · A2C · {a}",
        f"first · A2C · {a}",
        f"second · A2C · {b}",
    ]  # as the legend names them
    assert frame["episodic_return"].tolist() == [1.0, 2.0, 3.0]
    assert set(frame["smoothing"]) == {0.0}
    # each row names its run as a run's own CSV does (its id and the settings that tell runs
    # apart), so a long file can be grouped without parsing the label
    assert frame["run_id"].tolist() == [a, a, b]
    assert frame["env_id"].tolist() == ["CartPole-v1", "CartPole-v1", "Pendulum-v1"]
    assert set(frame["lambda_"]) == {0.95} and set(frame["gamma"]) == {0.99}
    assert list(frame.columns[:2]) == ["smoothing", "run"]
    # saved under a name of its own runs: the same runs in any order, the same name
    assert answer.file_name == exports.download_name("overlay_episodic_return.csv",
                                                     {"run_ids": f"{a} {b}"})  # fmt: skip
    again = get(store, exports.overlay_url([b, a], M.EPISODIC_RETURN.key))
    alone = get(store, exports.overlay_url([a], M.EPISODIC_RETURN.key))
    assert again.file_name == answer.file_name != alone.file_name


def test_a_run_is_named_by_its_id_or_a_start_of_it_as_the_cli_takes_it(store, monkeypatch):
    """A URL may carry a run's first ``SHORT_ID`` or more characters, as the CLI's commands do:
    the CSV and its file name hold the full id; a start that several ids share is a 404 naming
    them."""
    import uuid
    from types import SimpleNamespace

    ids = iter(["abcd12340000", "abcd99990000"])
    monkeypatch.setattr(uuid, "uuid4", lambda: SimpleNamespace(hex=next(ids) + "0" * 20))
    first = add_run(store, "first", "CartPole-v1", [1.0, 2.0])
    second = add_run(store, "second", "CartPole-v1", [3.0])
    answer = get(store, exports.run_metric_url("abcd1", M.EPISODIC_RETURN.key))
    assert answer.status == 200 and answer.file_name == f"{first}_episodic_return.csv"
    assert set(frame_of(answer)["run_id"]) == {first}
    # an overlay too, and a run named twice (by its start and in full) is one run
    both = get(store, exports.overlay_url(["abcd1", first, "abcd9"], M.EPISODIC_RETURN.key))
    assert frame_of(both)["run_id"].tolist() == [first, first, second]
    assert both.file_name == exports.download_name("overlay_episodic_return.csv",
                                                   {"run_ids": f"{first} {second}"})  # fmt: skip
    shared = get(store, exports.run_metric_url("abcd", M.EPISODIC_RETURN.key))
    assert shared.status == 404 and "'abcd' begins 2 run ids" in shared.body
    assert "abcd12340000, abcd99990000" in shared.body


def test_a_download_is_named_after_the_run_or_sweep_it_is_of():
    import hashlib

    assert exports.download_name("lab_k.csv", {"run_id": "a1b2c3", "seed": 0}) == "a1b2c3_lab_k.csv"
    assert exports.download_name("grid.csv", {"sweep_id": "f00d"}) == "sweep-f00d_grid.csv"
    picked = exports.download_name("curves.csv", {"run_ids": "bb aa cc", "group_by": "gamma"})
    digest = hashlib.sha256(b"aa bb cc").hexdigest()[:8]  # the sorted ids
    assert picked == f"runs-{digest}_curves.csv"
    assert exports.download_name("curves.csv", {"run_ids": "aa bb"}) != picked
    # a run's id leads where both are given (a run of a sweep); nothing to name: the base alone
    assert exports.download_name("x.csv", {"run_id": "ab", "sweep_id": "cd"}) == "ab_x.csv"
    assert exports.download_name("chain_exact.csv", {"gamma": 0.9}) == "chain_exact.csv"
    assert exports.download_name("chain_exact.csv") == "chain_exact.csv"
    # never a path or a header's end, whatever an id holds
    assert exports.download_name("x.csv", {"sweep_id": '../"a b\r\n'}) == "sweep-..__a_b___x.csv"


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/export/runs.csv?status=bogus", 400, ["status must be among", "'bogus'"]),
        ("/export/runs/{run}/episodic_return.csv?smoothing=1.5", 400, ["smoothing", "[0, 1)"]),
        ("/export/runs/{run}/episodic_return.csv?smoothing=abc", 400, ["smoothing", "'abc'"]),
        ("/export/runs/{run}/no_such_metric.csv", 404, ["unknown metric", "episodic_return"]),
        ("/export/runs/0123456789ab/episodic_return.csv", 404, ["no run '0123456789ab' in "]),
        ("/export/runs/..%2F..%2Fetc/episodic_return.csv", 404, ["no run '..%2F..%2Fetc' in "]),
        ("/export/overlay/episodic_return.csv", 400, ["run must be given 1 to 50 times"]),
        ("/export/nothing/here.csv", 404, ["no export at"]),
    ],
)
def test_bad_requests_get_one_line_naming_the_field(store, url, status, words):
    run_id = add_run(store, "r", "CartPole-v1", [1.0])
    answer = get(store, url.format(run=run_id))
    assert answer.status == status and answer.file_name is None
    assert "\n" not in answer.body
    for word in words:
        assert word in answer.body, answer.body


def test_a_store_that_cannot_be_opened_is_a_503_naming_its_path(tmp_path):
    from gae_core.errors import StoreError

    def broken() -> RunStore:
        raise StoreError(f"{tmp_path} is a file, not a folder")

    answer = exports.answer("/export/runs.csv", {}, broken)
    assert answer.status == 503 and str(tmp_path) in answer.body


def test_urls_quote_what_they_carry():
    url = exports.runs_url(text="a&b=c #d", envs=["CartPole-v1"])
    assert parse_qs(urlsplit(url).query) == {"text": ["a&b=c #d"], "env": ["CartPole-v1"]}
    assert exports.run_metric_url("abc", M.EPISODIC_RETURN.key, smoothing=0.0).endswith(
        "/abc/episodic_return.csv"
    )


def csv_records(text: str) -> list[list[str]]:
    """The records of a CSV text as a spreadsheet reads them: a carriage return ends a row
    as a line feed does, unless it is quoted."""
    return list(csv.reader(io.StringIO(text, newline="")))


def test_a_carriage_return_in_a_stored_name_never_starts_a_row(store):
    """A name written by an older version or straight into the database (clean_name never let
    a carriage return in) is still one cell, whatever is stored."""
    a = add_run(store, "placeholder", "CartPole-v1", [1.0, 2.0])
    raw = sqlite3.connect(store.path)
    raw.execute("UPDATE runs SET name = ? WHERE id = ?", ("abc\r=1+1", a))
    raw.commit()
    raw.close()
    for url, column, rows in [
        (exports.runs_url(), "name", 1),
        (exports.overlay_url([a], M.EPISODIC_RETURN.key), "run", 2),
    ]:
        answer = get(store, url)
        assert answer.status == 200, answer.body
        header, *records = csv_records(answer.body)
        assert len(records) == rows, answer.body
        for record in records:
            assert len(record) == len(header), answer.body
            assert not any(cell.startswith(CSV_FORMULA_PREFIXES) for cell in record), record
            cell = record[header.index(column)]
            assert cell.startswith("abc") and "=1+1" in cell, record
        assert len(pd.read_csv(io.StringIO(answer.body))) == rows


def _export_from_the_app(url: str):
    """``GET url`` answered by the dashboard server's own route handler (app.py)."""
    from starlette.requests import Request

    import app

    parts = urlsplit(url)
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "server": ("localhost", 8501),
        "path": parts.path,
        "root_path": "",
        "query_string": parts.query.encode(),
        "headers": [],
    }
    response = app._export(Request(scope))
    return response.status_code, response.body.decode()


def test_the_server_exports_a_read_only_data_folder(tmp_path, monkeypatch):
    """The CLI lists and exports a read-only folder; so does the dashboard's server."""
    monkeypatch.setenv("GAE_CORE_DATA", str(tmp_path))
    with RunStore(tmp_path) as store:
        run_id = add_run(store, "kept", "CartPole-v1", [1.0, 2.0])
    with read_only_folder(tmp_path):
        status, body = _export_from_the_app(exports.runs_url())
        assert status == 200, body
        assert pd.read_csv(io.StringIO(body))["run_id"].tolist() == [run_id]
        status, body = _export_from_the_app(exports.run_metric_url(run_id, M.EPISODIC_RETURN.key))
        assert status == 200, body
        assert pd.read_csv(io.StringIO(body))["episodic_return"].tolist() == [1.0, 2.0]


def test_the_server_never_serves_a_store_that_was_moved_away(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("GAE_CORE_DATA", str(data))
    with RunStore(data) as store:
        old = add_run(store, "old", "CartPole-v1", [1.0])
    status, body = _export_from_the_app(exports.runs_url())
    assert status == 200 and pd.read_csv(io.StringIO(body))["run_id"].tolist() == [old]
    moved = tmp_path / "moved"
    moved.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if (data / f"{DB_FILENAME}{suffix}").exists():
            (data / f"{DB_FILENAME}{suffix}").rename(moved / f"{DB_FILENAME}{suffix}")
    status, body = _export_from_the_app(exports.runs_url())
    assert status == 200, body
    assert old not in body and pd.read_csv(io.StringIO(body)).empty, body
    with RunStore(data) as store:  # a new store in its place is the one served
        new = add_run(store, "new", "CartPole-v1", [2.0])
    status, body = _export_from_the_app(exports.runs_url())
    assert status == 200 and pd.read_csv(io.StringIO(body))["run_id"].tolist() == [new], body
