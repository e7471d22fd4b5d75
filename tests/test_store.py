"""Run store: round trips, WAL, schema version, cascades, crash recovery across processes."""

from __future__ import annotations

import io
import math
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import FullOnCommit, trajectory_steps

import gae_core
from gae_core import errors
from gae_core import metrics as M
from gae_core.errors import StoreError
from gae_core.outcome import ReturnTracker, summarize_returns
from gae_core.storage import ownership
from gae_core.storage.database import Database
from gae_core.storage.records import MetricRow
from gae_core.storage.schema import SCHEMA_VERSION
from gae_core.storage.store import DB_FILENAME, RunStore, resolve_data_dir, to_wide
from gae_core.storage.table import RUN_COLUMNS, runs_frame
from gae_core.version import source_version

CONFIG = {"env_id": "CartPole-v1", "seed": 3, "lambda_": 0.95, "gamma": 0.99}


@pytest.fixture
def store(tmp_path):
    with RunStore(tmp_path) as s:
        yield s


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("GAE_CORE_DATA", raising=False)
    assert resolve_data_dir() == resolve_data_dir(None)
    assert str(resolve_data_dir()) == "runs"
    monkeypatch.setenv("GAE_CORE_DATA", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    with RunStore() as s:
        assert s.path == tmp_path / "env" / DB_FILENAME
        assert s.path.exists()


def test_wal_mode_and_schema_version(store):
    assert store.journal_mode == "wal"
    assert store.schema_version == SCHEMA_VERSION >= 1
    raw = sqlite3.connect(store.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()
    assert store.integrity_check() == "ok"


def test_newer_schema_is_refused(tmp_path):
    RunStore(tmp_path).close()
    raw = sqlite3.connect(tmp_path / DB_FILENAME)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    for read_only in (False, True):  # reading it too: this code cannot know the new columns
        with pytest.raises(StoreError, match=r"schema version .* Upgrade gae_core or use another"):
            RunStore(tmp_path, read_only=read_only)


def test_run_round_trip_and_lifecycle(store):
    run_id = store.create_run(CONFIG, name="first", reward_threshold=475.0)
    run = store.get_run(run_id)
    assert (run.name, run.config, run.status, run.env_steps) == ("first", CONFIG, "queued", 0)
    assert run.started_at is None and run.wall_seconds is None
    assert run.summary.reward_threshold == 475.0

    assert store.claim_run(run_id)
    assert not store.claim_run(run_id)  # only a queued run can be claimed
    assert store.get_run(run_id).status == "running"

    tracker = ReturnTracker(475.0)
    tracker.add(100, 20.0)
    stop = store.flush(
        run_id,
        [MetricRow(M.VALUE_LOSS.key, 64, 0.5, 1.25), (M.EPISODIC_RETURN.key, 100, 0.6, 20.0)],
        env_steps=128,
        summary=tracker.summary(),
    )
    assert stop is False
    store.finish_run(run_id, "finished")
    run = store.get_run(run_id)
    assert run.status == "finished" and run.error is None
    assert run.env_steps == 128
    assert run.ended_at >= run.started_at >= run.created_at
    assert run.summary.episodes == 1
    assert run.summary.final_return == 20.0 and run.summary.best_return is None  # 1 < 100
    assert run.summary.solved is False and run.summary.solved_at_step is None

    long = store.metrics(run_id)
    assert list(long.columns) == ["env_step", "wall_time", "key", "value"]
    assert long.to_dict("records") == [
        {"env_step": 64, "wall_time": 0.5, "key": M.VALUE_LOSS.key, "value": 1.25},
        {"env_step": 100, "wall_time": 0.6, "key": M.EPISODIC_RETURN.key, "value": 20.0},
    ]
    assert store.metrics(run_id, [M.EPISODIC_RETURN.key])["value"].tolist() == [20.0]
    assert store.metrics(run_id, since_step=64)["env_step"].tolist() == [100]

    with pytest.raises(ValueError):
        store.finish_run(run_id, "running")
    with pytest.raises(StoreError):
        store.get_run("nope")


def test_non_finite_values_stored_as_nan(store):
    run_id = store.create_run(CONFIG)
    store.flush(run_id, [(M.POLICY_LOSS.key, 1, 0.0, math.nan), ("x", 2, 0.0, math.inf)])
    values = store.metrics(run_id)["value"]
    assert values.isna().all() and len(values) == 2


def test_metrics_wide_keeps_repeated_values(store):
    run_id = store.create_run(CONFIG)
    store.flush(
        run_id,
        [
            (M.EPISODIC_RETURN.key, 10, 1.0, 5.0),
            (M.EPISODIC_RETURN.key, 10, 1.0, 7.0),  # two envs ended on the same step
            (M.VALUE_LOSS.key, 10, 1.5, 0.25),
            (M.VALUE_LOSS.key, 20, 2.0, 0.125),
        ],
    )
    wide = store.metrics_wide(run_id)
    assert list(wide.columns) == [
        "env_step",
        "wall_time",
        M.EPISODIC_RETURN.key,
        M.VALUE_LOSS.key,
    ]
    assert wide["env_step"].tolist() == [10, 10, 20]
    assert wide[M.EPISODIC_RETURN.key].tolist()[:2] == [5.0, 7.0]
    assert math.isnan(wide[M.EPISODIC_RETURN.key].iloc[2])
    assert wide[M.VALUE_LOSS.key].tolist()[0] == 0.25
    assert math.isnan(wide[M.VALUE_LOSS.key].iloc[1])
    assert wide["wall_time"].tolist() == [1.5, 1.0, 2.0]
    assert to_wide(store.metrics("missing")).columns.tolist() == ["env_step", "wall_time"]


def test_checkpoints_and_trajectories(store):
    run_id = store.create_run(CONFIG)
    store.save_checkpoint(run_id, 100, b"model-100", [b"t0", b"t1"])
    store.save_checkpoint(run_id, 200, b"model-200", [b"u0"])
    store.save_checkpoint(run_id, 300, b"model-300")
    assert store.checkpoint_steps(run_id) == [100, 200, 300]
    assert store.load_checkpoint(run_id) == b"model-300"
    assert store.load_checkpoint(run_id, 100) == b"model-100"
    assert store.trajectory_blobs(run_id, 100) == [b"t0", b"t1"]
    assert store.trajectory_blobs(run_id) == [b"u0"]  # latest checkpoint that has any
    assert trajectory_steps(store, run_id) == [100, 200]
    store.save_checkpoint(run_id, 100, b"again", [b"v"])  # replace at the same step
    assert store.trajectory_blobs(run_id, 100) == [b"v"]
    with pytest.raises(StoreError):
        store.load_checkpoint(run_id, 999)


def test_rename_and_delete_cascade(store):
    keep = store.create_run(CONFIG, name="keep")
    gone = store.create_run(CONFIG, name="gone")
    for run_id in (keep, gone):
        store.flush(run_id, [("a", 1, 0.0, 1.0)])
        store.save_checkpoint(run_id, 1, b"m", [b"t"])
    store.rename_run(gone, "  renamed ")
    assert store.get_run(gone).name == "renamed"
    with pytest.raises(ValueError):
        store.rename_run(gone, " ")
    with pytest.raises(StoreError, match="stop it"):
        store.delete_run(gone)  # still queued
    store.finish_run(gone, "stopped")
    store.delete_run(gone)
    with pytest.raises(StoreError):
        store.get_run(gone)
    raw = sqlite3.connect(store.path)
    for table in ("metrics", "checkpoints", "trajectories"):
        ids = {r[0] for r in raw.execute(f"SELECT run_id FROM {table}")}
        assert ids == {keep}, table
    raw.close()
    assert [r.id for r in store.list_runs()] == [keep]


def test_list_runs_filters_and_frame(store):
    sweep_id = store.create_sweep({"lambda_": [0.9, 1.0]}, CONFIG, name="s")
    a = store.create_run(CONFIG, sweep_id=sweep_id)
    b = store.create_run(CONFIG)
    store.finish_run(b, "failed", "boom")
    assert [r.id for r in store.list_runs()] == [b, a]  # newest first
    assert [r.id for r in store.list_runs(status="failed")] == [b]
    assert [r.id for r in store.list_runs(sweep_id=sweep_id)] == [a]
    frame = runs_frame(store.list_runs())
    assert set(frame["run_id"]) == {a, b} and list(frame.columns) == list(RUN_COLUMNS)
    assert frame.set_index("run_id").loc[a, "lambda_"] == 0.95
    # numbers no run has yet are typed and empty, not a column of None objects ("None" on the
    # Runs page, which shows solved_at_step while no run has solved)
    assert str(frame["solved_at_step"].dtype) == "Int64" and frame["solved_at_step"].isna().all()
    assert frame["final_return"].dtype == float and frame["final_return"].isna().all()
    assert frame.to_csv(index=False).splitlines()[1].count(",,") >= 3
    with pytest.raises(ValueError, match=r"unknown status .'bogus'.; statuses: queued, running"):
        store.list_runs(status="bogus")
    assert store.sweep_status_counts(sweep_id)["queued"] == 1
    sweep = store.get_sweep(sweep_id)
    assert sweep.grid == {"lambda_": [0.9, 1.0]} and sweep.status == "running"
    store.finish_sweep(sweep_id, "finished")
    assert store.list_sweeps()[0].status == "finished"


def test_request_stop(store):
    queued = store.create_run(CONFIG)
    running = store.create_run(CONFIG)
    store.claim_run(running)
    assert store.request_stop(queued) == "stopped"
    assert not store.claim_run(queued)  # a cancelled trial is never started
    assert store.request_stop(running) == "running"
    assert store.flush(running, []) is True


def test_return_tracker_matches_closed_form():
    rng = np.random.default_rng(0)
    returns = rng.normal(100, 30, size=250)
    steps = np.arange(250) * 10
    summary = summarize_returns(steps, returns, reward_threshold=None)
    means = pd.Series(returns).rolling(100).mean()  # full windows only
    assert summary.episodes == 250
    assert summary.final_return == pytest.approx(returns[-100:].mean())
    assert summary.best_return == pytest.approx(means.max())
    assert summary.solved is None and summary.solved_at_step is None
    assert summary.stayed_solved is None
    # Fewer than 100 episodes: no best return at all (a partial window is never "best").
    assert summarize_returns([1, 2], [63.6, 10.0], None).best_return is None
    # Solved: first step where a full 100-episode window averages at least the threshold.
    ramp = np.concatenate([np.zeros(50), np.full(200, 500.0)])
    solved = summarize_returns(np.arange(250), ramp, reward_threshold=475.0)
    window_means = pd.Series(ramp).rolling(100).mean()
    first = int(np.argmax(window_means.to_numpy() >= 475.0))
    assert solved.solved is True and solved.solved_at_step == first
    assert solved.fell_below_at_step is None and solved.stayed_solved is True
    # Fewer than 100 episodes never count as solved, however good.
    assert summarize_returns([1, 2], [500.0, 500.0], 475.0).solved is False


def test_a_collapsed_run_says_it_fell_below():
    """Solved at one step, then the 100-episode mean falls below the threshold: the summary
    keeps both steps and says it did not stay solved; a dip that recovers says so too."""
    up, down = np.full(150, 500.0), np.full(150, 9.0)
    collapsed = summarize_returns(np.arange(300) * 10, np.concatenate([up, down]), 475.0)
    means = pd.Series(np.concatenate([up, down])).rolling(100).mean().to_numpy()
    assert collapsed.solved_at_step == 99 * 10
    first_below = int(np.flatnonzero((np.arange(300) >= 99) & (means < 475.0))[0])
    assert collapsed.fell_below_at_step == first_below * 10
    assert collapsed.stayed_solved is False and collapsed.solved is True
    assert collapsed.final_return == pytest.approx(9.0)
    assert collapsed.best_return == pytest.approx(500.0)
    recovered = summarize_returns(
        np.arange(450), np.concatenate([up, np.full(20, 0.0), np.full(280, 500.0)]), 475.0
    )
    assert recovered.fell_below_at_step is not None and recovered.stayed_solved is True


def test_threads_share_one_store(store):
    run_ids = [store.create_run({**CONFIG, "seed": i}) for i in range(4)]

    def write(run_id, seed):
        for step in range(50):
            store.flush(run_id, [("v", step, 0.0, float(seed))], env_steps=step)

    threads = [threading.Thread(target=write, args=(r, i)) for i, r in enumerate(run_ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, run_id in enumerate(run_ids):
        frame = store.metrics(run_id)
        assert len(frame) == 50 and (frame["value"] == i).all()
        assert store.get_run(run_id).env_steps == 49


_WRITER = textwrap.dedent(
    """
    import sys, time
    from gae_core.storage.store import RunStore
    store = RunStore(sys.argv[1])
    run_id = store.create_run({"seed": int(sys.argv[2])})
    store.claim_run(run_id)
    for step in range(200):
        store.flush(run_id, [("v", step, 0.0, float(sys.argv[2]))], env_steps=step)
    print(run_id, flush=True)
    if sys.argv[3] == "finish":
        store.finish_run(run_id, "finished")
    elif sys.argv[3] == "hold":
        time.sleep(60)
    # "die": exit without closing the run, as a crash would
    """
)


def _writer(tmp_path, seed, mode):
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path), str(seed), mode],
        stdout=subprocess.PIPE,
        text=True,
    )


class _BusyAtFirst:
    """A SQLite connection whose first ``busy`` answers to ``PRAGMA journal_mode`` are
    "database is locked" at once, as SQLite answers where its busy timeout could deadlock."""

    def __init__(self, conn: sqlite3.Connection, busy: int) -> None:
        self.conn, self.busy = conn, busy

    def execute(self, sql, *args):
        if sql.startswith("PRAGMA journal_mode") and self.busy:
            self.busy -= 1
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode, error.sqlite_errorname = sqlite3.SQLITE_BUSY, "SQLITE_BUSY"
            raise error
        return self.conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.conn, name)


@pytest.mark.parametrize("busy", [1, 3])
def test_a_store_busy_while_it_opens_is_waited_for_and_its_runs_kept(tmp_path, monkeypatch, busy):
    """Opening a store another process holds for a moment waits for it (it used to refuse the
    store as "damaged or not a run store" when three workers opened one new store at once)."""
    with RunStore(tmp_path) as store:
        run_id = store.create_run({"seed": 7})
    connect = Database._connect
    monkeypatch.setattr(
        Database, "_connect", lambda self, timeout: _BusyAtFirst(connect(self, timeout), busy)
    )
    with RunStore(tmp_path) as store:
        assert [r.id for r in store.list_runs()] == [run_id]


def test_a_store_locked_past_the_busy_timeout_says_so_and_not_that_it_is_damaged(
    tmp_path, monkeypatch
):
    RunStore(tmp_path).close()
    connect = Database._connect
    monkeypatch.setattr(
        Database, "_connect", lambda self, timeout: _BusyAtFirst(connect(self, timeout), 10**6)
    )
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"stayed locked by another connection for 0\.3 s") as info:
        RunStore(tmp_path, busy_timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert "damaged" not in str(info.value)


def test_a_read_only_open_of_a_store_a_writer_holds_says_so_and_reads_nothing_stale(tmp_path):
    """A read-only open falls back to SQLite's immutable mode only where the file cannot be
    opened read-only otherwise (a read-only folder), never past a writer's lock: immutable
    reads ignore locks and the journal, so it would show what the writer is replacing."""
    with RunStore(tmp_path) as store:
        store.create_run({"seed": 1})
    writer = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None)
    try:
        writer.execute("PRAGMA journal_mode = DELETE")  # a lock that blocks readers
        writer.execute("BEGIN EXCLUSIVE")
        writer.execute("DELETE FROM runs")
        with pytest.raises(StoreError, match="locked by another connection"):
            RunStore(tmp_path, read_only=True, busy_timeout_s=0.2)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    with RunStore(tmp_path, read_only=True) as store:  # once it is released: read as usual
        assert len(store.list_runs()) == 1


@pytest.mark.slow
def test_processes_write_concurrently(tmp_path):
    procs = [_writer(tmp_path, seed, "finish") for seed in range(3)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    with RunStore(tmp_path) as s:
        for seed, run_id in enumerate(outputs):
            run = s.get_run(run_id)
            assert run.status == "finished" and run.env_steps == 199
            frame = s.metrics(run_id)
            assert len(frame) == 200 and (frame["value"] == seed).all()
        assert s.integrity_check() == "ok"


def test_dead_owner_interrupted_live_owner_kept(tmp_path):
    dead = _writer(tmp_path, 1, "die")
    dead_id = dead.communicate(timeout=60)[0].strip()
    live = _writer(tmp_path, 2, "hold")
    try:
        live_id = live.stdout.readline().strip()
        with RunStore(tmp_path) as s:
            assert s.get_run(dead_id).status == "interrupted"
            assert "killed or crashed" in s.get_run(dead_id).error
            assert s.get_run(live_id).status == "running"  # its owner is alive
            assert len(s.metrics(dead_id)) == 200
            mine = s.create_run(CONFIG)
            s.claim_run(mine)
            assert s.recover() == []  # this process owns `mine`: alive
            assert s.get_run(mine).status == "running"
        live.kill()
        live.wait(timeout=10)
        with RunStore(tmp_path) as s:
            assert s.get_run(live_id).status == "interrupted"
            assert s.get_run(mine).status == "running"  # still ours
            assert s.integrity_check() == "ok"
    finally:
        live.kill()
        live.wait(timeout=10)


def test_zombie_and_recycled_pid_count_as_dead(tmp_path, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(1.0)  # exited but not yet reaped: a zombie
    owner = ownership.Owner.current()
    assert not ownership.owner_alive(owner.host, proc.pid, owner.token, time.time())
    proc.wait()
    # Our own pid with another start token: a different process that reused the pid.
    boot = owner.token.partition(":")[0]
    assert ownership.owner_alive(owner.host, owner.pid, owner.token, None)
    assert not ownership.owner_alive(owner.host, owner.pid, f"{boot}:1", time.time())
    # Another host: only the heartbeat tells.
    assert ownership.owner_alive("elsewhere", 1, "x:1", time.time())
    assert not ownership.owner_alive("elsewhere", 1, "x:1", time.time() - 3600)


def test_reads_never_recover_the_manager_does(tmp_path):
    """get_run/list_runs are pure reads; a long-lived process finds dead owners through the run
    manager's recovery schedule."""
    from gae_core.runs.manager import RunManager

    store = RunStore(tmp_path)
    live = _writer(tmp_path, 5, "hold")
    try:
        run_id = live.stdout.readline().strip()
        assert store.get_run(run_id).status == "running"
        live.kill()
        live.wait(timeout=10)
        time.sleep(0.3)
        assert store.get_run(run_id).status == "running"  # reading changed nothing
        assert [r.status for r in store.list_runs()] == ["running"]
        manager = RunManager(store, recover_every_s=0.1)
        try:
            deadline = time.monotonic() + 10
            while store.get_run(run_id).status != "interrupted" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.get_run(run_id).status == "interrupted"
        finally:
            manager.shutdown()
    finally:
        live.kill()
        live.wait(timeout=10)
        store.close()


def test_a_version_1_store_is_migrated_in_place(tmp_path):
    """A store written by the first release (schema 1) opens: its runs keep their data and the
    newer columns and tables appear (v2: stayed-solved columns, v3: lab results, v4: the code a
    run was created with)."""
    from gae_core.storage import schema

    raw = sqlite3.connect(tmp_path / DB_FILENAME)
    for statement in schema._SCHEMA_V1.split(";"):
        if statement.strip():
            raw.execute(statement)
    raw.execute(
        "INSERT INTO runs (id, name, config, status, created_at, env_steps, best_return) "
        "VALUES ('old', 'old run', ?, 'finished', 1.0, 500, 12.5)",
        ('{"env_id": "CartPole-v1"}',),
    )
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    with RunStore(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        run = store.get_run("old")
        assert run.name == "old run" and run.env_steps == 500 and run.summary.best_return == 12.5
        assert run.summary.fell_below_at_step is None and store.lab_records("old") == []
        assert run.code is None  # (v4) stored before runs recorded their code
        # a run created now records the code it was created with
        new = store.get_run(store.create_run({"env_id": "CartPole-v1"}))
        assert new.code == source_version() and new.code["version"] == gae_core.__version__


def test_orphans_are_dropped_and_space_given_back(tmp_path):
    with RunStore(tmp_path) as store:
        run_id = store.create_run(CONFIG)
        store.flush(run_id, [(M.VALUE_LOSS.key, i, 0.0, 1.0) for i in range(5000)])
        store.save_checkpoint(run_id, 10, b"x" * 200_000, [b"t" * 100_000])
        store.finish_run(run_id, "finished")
    raw = sqlite3.connect(tmp_path / DB_FILENAME)  # an older writer, foreign keys off
    raw.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    raw.commit()
    raw.close()
    with RunStore(tmp_path) as store:
        assert store.drop_orphans() == 5000 + 1 + 1
        assert store.metrics(run_id).empty and store.checkpoint_steps(run_id) == []
        assert store.vacuum() > 200_000
        assert store.integrity_check() == "ok"


def _full_disk_message_names(error: BaseException, path) -> None:
    message = str(error)
    assert isinstance(error, errors.StoreFull), repr(error)
    assert f"the disk holding {path} is full" in message, message
    assert "damaged" not in message and "\n" not in message


def test_a_full_disk_is_named_rolled_back_and_reads_go_on(tmp_path):
    key = M.EPISODIC_RETURN.key
    with RunStore(tmp_path) as store:
        run_id = store.create_run(CONFIG, name="r")
        store.flush(run_id, [(key, 10, 0.0, 1.0)], env_steps=10)
        real = store._conn
        store._conn = FullOnCommit(real)  # the commit fails
        with pytest.raises(StoreError) as caught:
            store.flush(run_id, [(key, 20, 1.0, 2.0)], env_steps=20)
        _full_disk_message_names(caught.value, store.path)
        store._conn = real
        assert store.metrics(run_id)["env_step"].tolist() == [10]  # rolled back
        assert store.get_run(run_id).env_steps == 10
        store.flush(run_id, [(key, 20, 1.0, 2.0)], env_steps=20)  # no transaction left open
        # a real SQLITE_FULL: the database may not grow past the pages it has
        pages = real.execute("PRAGMA page_count").fetchone()[0]
        real.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StoreError) as caught:
            store.flush(run_id, [(key, 100 + i, 0.0, 1.0) for i in range(5000)])
        _full_disk_message_names(caught.value, store.path)
        assert store.metrics(run_id)["env_step"].tolist() == [10, 20]  # reads go on
        # a run that failed on it keeps the store's one line, not the traceback around it
        trace = (
            f"Traceback (most recent call last):\n  …\ngae_core.errors.StoreFull: {caught.value}"
        )
        store.finish_run(run_id, "failed", trace)
        assert store.get_run(run_id).error == str(caught.value)
        store.finish_run(run_id, "failed", "Traceback ...\nValueError: something else")
        assert store.get_run(run_id).error.endswith("ValueError: something else")


def test_opening_on_a_full_disk_writes_nothing_and_is_not_called_damage(tmp_path, monkeypatch):
    with RunStore(tmp_path) as store:
        run_id = store.create_run(CONFIG, name="kept")
        boot = store.owner.token.partition(":")[0]
    raw = sqlite3.connect(tmp_path / DB_FILENAME)  # owned by a process that is gone
    raw.execute(
        "UPDATE runs SET status = 'running', owner_token = ? WHERE id = ?", (f"{boot}:1", run_id)
    )
    raw.commit()
    raw.close()
    connect = Database._connect
    monkeypatch.setattr(Database, "_connect", lambda self, t: FullOnCommit(connect(self, t)))
    with RunStore(tmp_path) as store:  # recovering the dead run fails: it waits for space
        assert [r.name for r in store.list_runs()] == ["kept"]
        assert store.get_run(run_id).status == "running"
        with pytest.raises(StoreError) as caught:
            store.create_run(CONFIG)
        _full_disk_message_names(caught.value, store.path)
    with pytest.raises(StoreError) as caught:  # a new store cannot be made on a full disk
        RunStore(tmp_path / "new")
    _full_disk_message_names(caught.value, tmp_path / "new" / DB_FILENAME)
    monkeypatch.undo()
    with RunStore(tmp_path) as store:  # space again: the dead run is recovered
        assert store.get_run(run_id).status == "interrupted"


def test_another_programs_database_is_refused_and_left_unchanged(tmp_path):
    path = tmp_path / DB_FILENAME
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    raw.execute("INSERT INTO notes (text) VALUES ('mine')")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    for read_only in (False, True):
        with pytest.raises(StoreError) as caught:
            RunStore(tmp_path, read_only=read_only)
        message = str(caught.value)
        assert str(path) in message and "not a run store" in message, message
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [DB_FILENAME]  # no -wal, no -shm
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    raw.close()


def test_a_file_that_is_not_a_database_is_refused_and_no_connection_is_left_open(
    tmp_path, monkeypatch
):
    """Opening a store whose file is not SQLite tries each URI and names the file; every
    connection it opened on the way is closed (they were left open before)."""
    from gae_core.storage import database

    opened = []
    real_connect = sqlite3.connect

    def tracking_connect(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(database.sqlite3, "connect", tracking_connect)
    store_file = tmp_path / database.DB_FILENAME
    store_file.write_bytes(b"this is not an SQLite database, just text " * 100)
    for read_only in (False, True):
        with pytest.raises(StoreError, match="cannot open the run store"):
            Database(tmp_path, read_only=read_only)
    assert opened  # every URI was tried with a connection of its own
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")


def test_new_ids_are_never_read_back_as_numbers(monkeypatch):
    """An id is 12 hex digits with a letter other than "e" among them: pandas reads every
    one back from a CSV as text, even where uuid4 drew all digits or digits around one "e"
    (it did: "41e026164208" came back as inf)."""
    from gae_core.storage import database

    draws = iter(["012345678901" + "0" * 20, "41e026164208" + "0" * 20, "41e02616420b" + "0" * 20])
    monkeypatch.setattr(database.uuid, "uuid4", lambda: SimpleNamespace(hex=next(draws)))
    assert database.new_id() == "41e02616420b"  # the first two are drawn again
    monkeypatch.undo()
    ids = [database.new_id() for _ in range(2000)]
    frame = pd.read_csv(io.StringIO("run_id\n" + "\n".join(ids)))
    assert frame["run_id"].tolist() == ids


def test_a_run_id_resolves_from_itself_or_a_prefix_it_alone_begins(store, monkeypatch):
    """``resolve_run_id`` and ``resolve_sweep_id``: the full id, or a prefix of at least
    SHORT_ID characters that one stored id of its table begins (git's rule); several or none
    is an UnknownId (a StoreError) naming them; LIKE's wildcards in the text are plain
    characters."""
    import uuid

    from gae_core.errors import UnknownId
    from gae_core.storage.store import SHORT_ID

    ids = iter(["abcd12340000", "abcd99990000", "bcde00000000"])
    monkeypatch.setattr(uuid, "uuid4", lambda: SimpleNamespace(hex=next(ids) + "0" * 20))
    first, second, third = (store.create_run(CONFIG) for _ in range(3))
    assert (first, second, third) == ("abcd12340000", "abcd99990000", "bcde00000000")
    assert store.resolve_run_id(first) == first
    assert store.resolve_run_id("abcd1") == first and store.resolve_run_id("bcde") == third
    assert SHORT_ID == 4
    with pytest.raises(UnknownId, match=r"'abcd' begins 2 run ids \(abcd12340000, "
                       r"abcd99990000\): give more of it"):  # fmt: skip
        store.resolve_run_id("abcd")
    with pytest.raises(UnknownId, match=r"no run 'bcd' .*at least 4 characters"):
        store.resolve_run_id("bcd")
    for text in ("abc%", "abc_", "abcd_234", "ffff", "abcd\udcff"):  # (a non-UTF-8 byte)
        with pytest.raises(UnknownId, match=re.escape(f"no run {text!r} in ")):
            store.resolve_run_id(text)
    # a sweep's id, by the same rule: runs' ids do not count
    ids = iter(["abcd55550000", "abcd66660000"])
    first_sweep, _ = (store.create_sweep({"seed": [0]}, CONFIG) for _ in range(2))
    assert store.resolve_sweep_id("abcd5") == first_sweep == "abcd55550000"
    with pytest.raises(UnknownId, match=r"'abcd' begins 2 sweep ids \(abcd55550000, "):
        store.resolve_sweep_id("abcd")
    with pytest.raises(UnknownId, match="no sweep 'bcde' in "):
        store.resolve_sweep_id("bcde")
