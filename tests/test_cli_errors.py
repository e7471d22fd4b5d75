"""The CLI when things are wrong: unusable env ids, bad flags, broken or read-only stores, a run
deleted while it trains, and names that try to do things. Every case gets one clear line (no
traceback) and loses nothing."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    TINY_FLAGS,
    FullOnCommit,
    cli,
    cli_env,
    cli_in_process,
    read_only_folder,
)

from gae_core.errors import StoreFull
from gae_core.inert import CSV_FORMULA_PREFIXES
from gae_core.storage.database import Database
from gae_core.storage.store import DB_FILENAME, RunStore
from gae_core.storage.table import RUN_COLUMNS


def one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    return lines[0]


def tiny_run(data: Path, *extra: str) -> str:
    done = cli(
        data, "train", "--total-steps", "400", *TINY_FLAGS, "--json", "--no-progress", *extra
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])["run_id"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "expected"),
    [
        ("LunarLander-v3", "LunarLander-v3 needs a package that is not installed: Box2D"),
        ("Blackjack-v1", "Blackjack-v1 has observation space Tuple"),
        ("FrozenLake-v1", "FrozenLake-v1 has observation space Discrete(16)"),
        ("NoSuchEnv-v0", "'NoSuchEnv-v0' is not a registered environment"),
        ("os:system", "not a 'module:Class' path"),
    ],
)
def test_unusable_env_ids_exit_2_with_one_line_and_leave_no_run(tmp_path, env_id, expected):
    done = cli(tmp_path, "train", "--env", env_id, "--json")
    assert done.returncode == 2
    line = one_line_error(done)
    assert line.startswith("error: --env: env_id") and expected in line
    if "Box2D" in expected:
        assert "pip install" in line  # what to install
    assert done.stdout == ""
    assert not (tmp_path / DB_FILENAME).exists()  # not even a store, let alone a failed run


def test_bad_flags_name_the_field_and_what_it_allows(tmp_path):
    bogus = cli_in_process(tmp_path, "runs", "--status", "bogus")
    assert bogus.returncode == 2
    assert "invalid choice: 'bogus'" in bogus.stderr
    assert "'queued', 'running', 'stopped', 'finished', 'failed', 'interrupted'" in bogus.stderr
    both = cli_in_process(tmp_path, "sweep", "--lambda", "0.9", "--lambdas", "0.9", "1.0")
    assert both.returncode == 2
    assert "--lambdas conflicts with --lambda" in one_line_error(both)
    twice = cli_in_process(tmp_path, "sweep", "--lambdas", "0.9", "--grid", "lambda=0.8,1")
    assert twice.returncode == 2 and "λ is already a grid axis" in one_line_error(twice)
    duplicate = cli_in_process(tmp_path, "sweep", "--lambdas", "0.9", "0.90", "1")
    assert duplicate.returncode == 2
    assert "sweep grid lambda_: duplicate value 0.9" in one_line_error(duplicate)
    unreadable = cli_in_process(tmp_path, "sweep", "--seeds", "0", "--grid", "gamma=0.9,abc")
    assert unreadable.returncode == 2
    line = one_line_error(unreadable)
    assert "--grid gamma" in line and "cannot read 'abc'" in line and "in [0, 1]" in line
    unknown = cli_in_process(tmp_path, "sweep", "--grid", "gama=0.9")
    assert unknown.returncode == 2 and "unknown config field 'gama'" in one_line_error(unknown)
    address = cli_in_process(tmp_path, "sweep", "--seeds", "0", "--address", "head:6379")
    assert address.returncode == 2
    assert "--address: only the ray backend takes a cluster address" in one_line_error(address)
    backend = cli_in_process(tmp_path, "sweep", "--seeds", "0", "--backend", "spark")
    assert backend.returncode == 2 and "invalid choice: 'spark'" in backend.stderr
    population = cli_in_process(tmp_path, "sweep", "--seeds", "0", "--population", "0")
    assert population.returncode == 2
    assert "--population: must be an integer in [1, 256], got 0" in one_line_error(population)
    ray_population = cli_in_process(
        tmp_path, "sweep", "--seeds", "0", "--backend", "ray", "--population", "300"
    )  # refused before Ray is imported or started
    assert ray_population.returncode == 2
    assert "--population: must be an integer in [1, 256], got 300" in one_line_error(ray_population)
    assert not (tmp_path / DB_FILENAME).exists()


def test_train_names_every_bad_flag_at_once_one_a_line_and_takes_no_abbreviation(tmp_path):
    """As the Train form lists every bad field, so does ``train``: one ``error:`` line each,
    in the flags' order, and no run is created."""
    bad = cli_in_process(tmp_path, "train", "--gamma", "2", "--seed", "-1", "--num-envs", "abc",
                         "--max-grad-norm", "-0.5", "--hidden-sizes", "64", "x")  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    # a value its parser cannot read ('abc', 'x') is named with the rest, not alone (argparse
    # stops at the first type error)
    assert bad.stderr.splitlines() == [
        "error: --num-envs: num_envs must be an integer in [1, 1024], got 'abc'",
        "error: --gamma: gamma must be in [0.0, 1.0], got 2.0",
        "error: --max-grad-norm: max_grad_norm must be in [0.0, 1000000.0], got -0.5",
        "error: --hidden-sizes: hidden_sizes: cannot read 'x'; expected 1 to 8 integers in "
        "[1, 4096], written 64x64 or '64, 64'",
        "error: --seed: seed must be an integer in [0, 2147483647], got -1",
    ]
    # a sweep's own counts too, before it prints a line or opens a store
    counts = cli_in_process(tmp_path, "sweep", "--lambdas", "0.9", "--workers", "0",
                            "--retries", "-1")  # fmt: skip
    assert counts.returncode == 2 and counts.stdout == ""
    assert counts.stderr.splitlines() == [
        "error: --workers: workers must be an integer in [1, 256], got 0",
        "error: --retries: retries must be an integer in [0, 10], got -1",
    ]
    # a sweep's own flags and the config's, together; a seed it cannot read, by its flag
    both = cli_in_process(tmp_path, "sweep", "--lambdas", "0.9", "--workers", "0",
                          "--num-envs", "abc")  # fmt: skip
    assert both.returncode == 2 and both.stderr.splitlines() == [
        "error: --num-envs: num_envs must be an integer in [1, 1024], got 'abc'",
        "error: --workers: workers must be an integer in [1, 256], got 0",
    ]
    seeds = cli_in_process(tmp_path, "sweep", "--seeds", "abc")
    assert seeds.returncode == 2 and seeds.stderr.splitlines() == [
        "error: --seeds: seed must be an integer in [0, 2147483647], got 'abc'"
    ]
    # a field the check across fields needs, unread: no check on the preset's value instead
    unread = cli_in_process(tmp_path, "train", "--algo", "ppo", "--num-envs", "abc",
                            "--minibatch-size", "4096")  # fmt: skip
    assert unread.stderr.splitlines() == [
        "error: --num-envs: num_envs must be an integer in [1, 1024], got 'abc'"
    ]
    # and every axis of its grid
    axes = cli_in_process(tmp_path, "sweep", "--lambdas", "0.9", "1.2", "--gammas", "2")
    assert axes.returncode == 2 and axes.stderr.splitlines() == [
        "error: sweep grid lambda_: lambda_ must be in [0.0, 1.0], got 1.2",
        "error: sweep grid gamma: gamma must be in [0.0, 1.0], got 2.0",
    ]
    # the check that spans fields is said with the others
    ppo = cli_in_process(tmp_path, "train", "--algo", "ppo", "--num-envs", "2", "--rollout-steps",
                         "4", "--minibatch-size", "9", "--gamma", "-1")  # fmt: skip
    lines = ppo.stderr.splitlines()
    assert ppo.returncode == 2 and len(lines) == 2, lines
    assert lines[0] == "error: --gamma: gamma must be in [0.0, 1.0], got -1.0"
    assert lines[1].startswith("error: --minibatch-size: minibatch_size must be at most")
    # an abbreviation is refused, not read as the one flag it starts (--lr-schedule)
    short = cli_in_process(tmp_path, "train", "--lr", "3e-4")
    assert short.returncode == 2 and "unrecognized arguments: --lr 3e-4" in short.stderr
    assert not (tmp_path / DB_FILENAME).exists()


@pytest.mark.slow
def test_delete_force_stops_a_running_run_and_its_process_exits_0(tmp_path):
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gae_core", "--data-dir", str(tmp_path), "train"),
            *("--total-steps", "100000000", *TINY_FLAGS, "--json", "--no-progress"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 60
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            if (tmp_path / DB_FILENAME).exists():
                with RunStore(tmp_path, recover=False) as store:
                    running = [r for r in store.list_runs() if r.env_steps > 0]
                    run_id = running[0].id if running else None
            time.sleep(0.1)
        assert run_id is not None
        deleted = cli(tmp_path, "delete", run_id, "--force")
        assert deleted.returncode == 0, deleted.stderr
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    result = json.loads(stdout.splitlines()[-1])
    assert result["run_id"] == run_id and result["status"] in ("stopped", "deleted")
    assert set(RUN_COLUMNS) <= set(result)  # a deleted run's line has every column too (None)
    with RunStore(tmp_path) as store:
        assert store.list_runs() == []
        assert store.metrics(run_id).empty and store.checkpoint_steps(run_id) == []


@pytest.mark.slow
def test_a_garbage_file_or_a_file_as_data_folder_gets_one_line_naming_the_path(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / DB_FILENAME).write_bytes(b"this is not a database\n" * 200)
    before = (garbage / DB_FILENAME).read_bytes()
    for args in (["runs"], ["train", "--total-steps", "100", *TINY_FLAGS]):
        done = cli(garbage, *args)
        assert done.returncode == 1
        line = one_line_error(done)
        assert str(garbage / DB_FILENAME) in line and "not" in line
    assert (garbage / DB_FILENAME).read_bytes() == before  # nothing written into it
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    done = cli(a_file, "runs")
    assert done.returncode == 1
    assert f"{a_file} is a file, not a folder" in one_line_error(done)


@pytest.mark.slow
def test_corrupt_json_in_a_row_keeps_the_rest_readable(tmp_path):
    good, bad = tiny_run(tmp_path), tiny_run(tmp_path)
    raw = sqlite3.connect(tmp_path / DB_FILENAME)
    raw.execute("UPDATE runs SET config = '{broken' WHERE id = ?", (bad,))
    raw.commit()
    raw.close()
    listed = cli(tmp_path, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["run_id"]: row for row in json.loads(listed.stdout.splitlines()[-1])}
    assert rows[good]["env_id"] == "CartPole-v1" and rows[good]["error"] is None
    assert "config is not a valid JSON object" in rows[bad]["error"]
    exported = cli(tmp_path, "export", bad, "--csv", "-")
    assert exported.returncode == 0 and len(pd.read_csv(io.StringIO(exported.stdout))) > 0


@pytest.mark.slow
def test_a_damaged_database_is_refused_for_writing_and_left_untouched(tmp_path):
    tiny_run(tmp_path, "--total-steps", "3000")
    path = tmp_path / DB_FILENAME
    with RunStore(tmp_path, recover=False) as store:
        assert store.integrity_check() == "ok"
    page = 4096
    data = bytearray(path.read_bytes())
    assert len(data) > 6 * page
    data[3 * page : 5 * page] = os.urandom(2 * page)  # two b-tree pages of garbage
    path.write_bytes(bytes(data))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    done = cli(tmp_path, "train", "--total-steps", "100", *TINY_FLAGS)
    assert done.returncode == 1
    line = one_line_error(done)
    assert str(path) in line and "damaged" in line and "refusing to write" in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


@pytest.mark.slow
def test_read_only_folder_still_lists_and_exports(tmp_path):
    run_id = tiny_run(tmp_path)
    with read_only_folder(tmp_path):
        listed = cli(tmp_path, "runs", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [r["run_id"] for r in json.loads(listed.stdout.splitlines()[-1])] == [run_id]
        exported = cli(tmp_path, "export", run_id, "--csv", "-")
        assert exported.returncode == 0, exported.stderr
        assert len(pd.read_csv(io.StringIO(exported.stdout))) > 0
        train = cli(tmp_path, "train", "--total-steps", "100", *TINY_FLAGS)
        assert train.returncode == 1
        line = one_line_error(train)
        assert f"{tmp_path} is read-only" in line and "`runs` and `export` still work" in line


@pytest.mark.slow
def test_names_are_inert_in_csv_and_terminal_output(tmp_path):
    formula = '=HYPERLINK("http://evil.example","click")'
    run_id = tiny_run(tmp_path, "--name", formula)
    csv = cli(tmp_path, "runs", "--csv", "-")
    assert csv.returncode == 0
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert frame.loc[0, "name"] == "'" + formula  # OWASP: a quote before a formula
    assert frame.loc[0, "lambda_"] == 0.95 and list(frame.columns)[:4] == [
        "run_id",
        "name",
        "algo",
        "env_id",
    ]
    for prefix in ("+", "-", "@", "\t", "\r"):
        renamed = cli(tmp_path, "rename", run_id, "--", f"{prefix}cmd|calc")
        assert renamed.returncode == 0, renamed.stderr
        cell = pd.read_csv(io.StringIO(cli(tmp_path, "runs", "--csv", "-").stdout)).loc[0, "name"]
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), repr(cell)
    escape = "\x1b[2J\x1b[31mred\x07 name\x7f"
    assert cli(tmp_path, "rename", run_id, escape).returncode == 0
    with RunStore(tmp_path) as store:
        assert store.get_run(run_id).name == "[2J[31mred name"  # control characters dropped
    table = cli(tmp_path, "runs")
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout and "red name" in table.stdout
    empty = cli(tmp_path, "rename", run_id, "\x1b\x07  ")
    assert empty.returncode == 2 and "run name cannot be empty" in one_line_error(empty)


def _address_space_limited(gib: int):
    """A ``preexec_fn`` capping the child's address space: a lab that tried to build what it
    cannot hold fails fast with MemoryError instead of taking the machine's memory."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib * 2**30, gib * 2**30))

    return limit


@pytest.mark.slow
def test_lab_settings_past_the_memory_limit_exit_2_with_one_line(tmp_path):
    """16.7 M continuations (4,096 states × 4,096) with their 111 estimators each would need
    about 15 GiB: refused before any work, one line naming the fields and the limit, nothing
    stored. (The child's address space is capped, so a lab that tries fails fast.)"""
    run_id = tiny_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gae_core", "--data-dir", str(tmp_path), "lab", run_id,
         "--states", "4096", "--continuations", "4096", "--segment", "2000"],
        capture_output=True, text=True, timeout=300, env=cli_env(),
        preexec_fn=_address_space_limited(6),
    )  # fmt: skip
    line = one_line_error(done)
    assert done.returncode == 2, done.stderr
    assert line.startswith("error: the lab would need about") and "GiB of memory" in line
    from gae_core.lab.measure import MEMORY_LIMIT

    assert f"limit of {MEMORY_LIMIT / 2**30:g} GiB" in line
    assert "states 4,096" in line and "continuations 4,096" in line and "lower states" in line
    with RunStore(tmp_path) as store:
        assert store.lab_records(run_id) == []


@pytest.mark.slow
def test_a_garbage_checkpoint_blob_gets_one_line_naming_the_run_and_step(tmp_path):
    """A checkpoint blob overwritten with garbage, straight in the database: the lab says which
    run's checkpoint at which step cannot be read, in one line, never suggesting
    ``weights_only=False`` (no code is ever run from a checkpoint)."""
    run_id = tiny_run(tmp_path)
    with RunStore(tmp_path) as store:
        (step,) = store.checkpoint_steps(run_id)
    raw = sqlite3.connect(tmp_path / DB_FILENAME)
    raw.execute(
        "UPDATE checkpoints SET blob = ? WHERE run_id = ? AND env_step = ?",
        (b"\x80\x04garbage, not a checkpoint" * 40, run_id, step),
    )
    raw.commit()
    raw.close()
    small = ["--states", "2", "--rollouts", "2", "--continuations", "2", "--segment", "3"]
    done = cli(tmp_path, "lab", run_id, *small)  # with the progress bar: still one line
    assert done.returncode == 1
    line = one_line_error(done)
    assert f"run {run_id}" in line and f"env step {step:,}" in line, line
    assert "cannot be read" in line and "weights_only" not in line, line
    with RunStore(tmp_path) as store:
        assert store.lab_records(run_id) == []


CONFIG = {"env_id": "CartPole-v1", "lambda_": 0.95, "gamma": 0.99, "seed": 0}


def test_a_carriage_return_in_a_stored_name_never_starts_a_csv_row(tmp_path):
    """`runs --csv` quotes or strips whatever is stored, such as a name written by an older
    version or straight into the database."""
    with RunStore(tmp_path) as store:
        run_id = store.create_run(CONFIG, name="placeholder")
    raw = sqlite3.connect(tmp_path / DB_FILENAME)
    raw.execute("UPDATE runs SET name = ? WHERE id = ?", ("abc\r=1+1", run_id))
    raw.commit()
    raw.close()
    done = cli(tmp_path, "runs", "--csv", "-")
    assert done.returncode == 0, done.stderr
    written = cli_in_process(tmp_path, "runs", "--csv", str(tmp_path / "runs.csv"))
    assert written.returncode == 0, written.stderr
    with open(tmp_path / "runs.csv", newline="") as file:
        written_text = file.read()
    for text in (done.stdout, written_text):
        header, *records = csv.reader(io.StringIO(text, newline=""))
        assert len(records) == 1, repr(text)
        assert len(records[0]) == len(header), repr(text)
        assert not any(cell.startswith(CSV_FORMULA_PREFIXES) for cell in records[0]), records
        name = records[0][header.index("name")]
        assert name.startswith("abc") and "=1+1" in name, records


def test_a_full_disk_is_named_and_reads_go_on(tmp_path, monkeypatch):
    """Every later command used to call the healthy store "damaged … move it away"."""
    with RunStore(tmp_path) as store:
        run_id = store.create_run(CONFIG, name="kept")
    connect = Database._connect
    monkeypatch.setattr(Database, "_connect", lambda self, t: FullOnCommit(connect(self, t)))
    listed = cli_in_process(tmp_path, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout.splitlines()[-1])] == [run_id]
    exported = cli_in_process(tmp_path, "export", run_id, "--csv", "-")
    assert exported.returncode == 0, exported.stderr
    renamed = cli_in_process(tmp_path, "rename", run_id, "other")
    assert renamed.returncode == 1
    line = one_line_error(renamed)
    assert f"the disk holding {tmp_path / DB_FILENAME} is full" in line, line
    assert "damaged" not in line


def test_a_full_disk_during_train_fails_the_run_with_one_line(tmp_path, monkeypatch):
    RunStore(tmp_path).close()
    connect = Database._connect

    def no_room(self, timeout):  # the file may not grow: SQLite's own SQLITE_FULL
        conn = connect(self, timeout)
        conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        return conn

    monkeypatch.setattr(Database, "_connect", no_room)
    done = cli_in_process(
        tmp_path, "train", "--total-steps", "2000", *TINY_FLAGS, "--json", "--no-progress"
    )
    assert done.returncode == 1, done.stderr
    full = f"the disk holding {tmp_path / DB_FILENAME} is full"
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "failed" and result["error"].startswith(full), result["error"]
    assert "Traceback" not in result["error"] and "\n" not in result["error"]
    assert "Traceback" not in done.stderr and done.stderr.count(full) == 1, done.stderr
    assert "sweep None" not in done.stderr, done.stderr  # a run is no sweep
    monkeypatch.undo()
    with RunStore(tmp_path) as store:
        run = store.get_run(result["run_id"])
        assert run.status == "failed" and run.error == result["error"]


def test_a_full_disk_at_the_runs_end_fails_it_instead_of_finishing(tmp_path, monkeypatch):
    """The disk fills as the run's end is written: the command says ``failed`` with the disk
    line and exits 1 (not 0 with the run left ``running``)."""
    real = RunStore.finish_run

    def refuse_the_end(self, run_id, status, error=None):
        if status == "finished":
            raise StoreFull(f"the disk holding {self.path} is full (test)")
        return real(self, run_id, status, error)

    monkeypatch.setattr(RunStore, "finish_run", refuse_the_end)
    done = cli_in_process(
        tmp_path, "train", "--total-steps", "2000", *TINY_FLAGS, "--json", "--no-progress"
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "failed" and "is full (test)" in result["error"], result
    monkeypatch.undo()
    with RunStore(tmp_path) as store:
        run = store.get_run(result["run_id"])
        assert run.status == "failed" and "is full (test)" in run.error


def test_the_train_progress_bar_ends_at_the_budget(tmp_path):
    """The bar reads the run's stored step count while it trains and ends at the budget (the
    steps after its last poll counted too)."""
    done = cli_in_process(tmp_path, "train", "--total-steps", "20000", *TINY_FLAGS)
    assert done.returncode == 0, done.stderr
    last = done.stderr.replace("\r", "\n").splitlines()
    shown = [line for line in last if "/20.0k" in line]
    assert shown and shown[-1].lstrip().startswith("100%") and "20.0k/20.0k" in shown[-1], shown


def test_a_name_that_is_not_utf8_is_refused_naming_the_field(tmp_path):
    """`--name $'\\xff'`: Python hands the undecodable byte over as a lone surrogate."""
    bad = "ab\udcff"
    for args, field in [
        (["train", "--name", bad, "--total-steps", "100", *TINY_FLAGS], "--name: run name"),
        (["sweep", "--name", bad, "--seeds", "0", "--total-steps", "100"], "--name: sweep name"),
    ]:
        done = cli_in_process(tmp_path, *args)
        assert done.returncode == 2, done.stderr
        line = one_line_error(done)
        assert line.startswith(f"error: {field} is not valid UTF-8"), line
        assert "byte 0xff" in line and "codec" not in line, line
    with RunStore(tmp_path) as store:
        assert store.list_runs() == [] and store.list_sweeps() == []
        run_id = store.create_run(CONFIG, name="fine")
        with pytest.raises(ValueError, match="run name is not valid UTF-8"):
            store.create_run(CONFIG, name=b"ab\xff")
    renamed = cli_in_process(tmp_path, "rename", run_id, bad)
    assert renamed.returncode == 2
    assert "run name is not valid UTF-8" in one_line_error(renamed)


def test_the_data_folder_path_is_shown_without_control_characters(tmp_path):
    folder = tmp_path / "a\x1b[31mb\x07"
    done = cli_in_process(folder, "train", "--total-steps", "100", *TINY_FLAGS, "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr + done.stdout and "\x07" not in done.stderr
    assert f"{tmp_path}/a[31mb/{DB_FILENAME}" in done.stderr, done.stderr
    listed = cli_in_process(folder, "runs", "--csv", str(folder / "x.csv"))
    assert listed.returncode == 0 and "\x1b" not in listed.stderr, listed.stderr
    a_file = tmp_path / "f\x1b[2Jile"
    a_file.write_text("x")
    refused = cli_in_process(a_file, "runs")
    assert refused.returncode == 1
    line = one_line_error(refused)
    assert "\x1b" not in line and "f[2Jile is a file, not a folder" in line, line


@pytest.mark.parametrize(
    "command",
    [["runs"], ["export", "abc", "--csv", "-"], ["summary", "abc"], ["lab", "abc"],
     ["stop", "abc"], ["rename", "abc", "new"], ["delete", "abc"]],
)  # fmt: skip
def test_a_command_on_a_folder_without_a_store_names_it_and_creates_nothing(tmp_path, command):
    """A mistyped --data-dir: every command that acts on stored runs says there is no store
    there (exit 1, one line) and leaves no folder or empty store behind."""
    missing = tmp_path / "typo"
    done = cli_in_process(missing, *command)
    assert done.returncode == 1, done.stderr
    line = one_line_error(done)
    assert f"no run store at {missing / DB_FILENAME}: name its folder with --data-dir" in line
    assert not missing.exists()


def test_runs_names_a_missing_sweep_and_the_store_it_read_and_writes_a_csv_alone(tmp_path):
    with RunStore(tmp_path) as store:
        run_id = store.create_run({"env_id": "CartPole-v1", "total_steps": 10}, name="one")
    missing = cli_in_process(tmp_path, "runs", "--sweep", "nosuch")
    assert missing.returncode == 1 and "no sweep 'nosuch'" in missing.stderr, missing.stderr
    with RunStore(tmp_path / "empty"):
        pass
    empty = cli_in_process(tmp_path / "empty", "runs")
    assert empty.returncode == 0
    assert empty.stderr.strip() == f"no runs in {tmp_path / 'empty' / DB_FILENAME}"
    csv = cli_in_process(tmp_path, "runs", "--csv", str(tmp_path / "runs.csv"))
    assert csv.returncode == 0 and csv.stdout == "", csv.stdout  # the file, not the table too
    assert run_id in (tmp_path / "runs.csv").read_text()


def test_commands_take_a_short_run_id_and_name_an_ambiguous_one(tmp_path, monkeypatch):
    """export, rename, stop, delete and train --like take a run's first characters where they
    name one run, summary and runs --sweep a sweep's; where they name several, the error lists
    them (exit 1) and nothing changes."""
    import uuid
    from types import SimpleNamespace

    ids = iter(["abcd11110000", "abcd22220000", "bcde00000000", "cdef00000000", "def000000000"])
    monkeypatch.setattr(uuid, "uuid4", lambda: SimpleNamespace(hex=next(ids) + "0" * 20))
    with RunStore(tmp_path) as store:
        first, _, third, fourth = (store.create_run({"env_id": "CartPole-v1", "total_steps": 10})
                                   for _ in range(4))  # fmt: skip
        assert store.claim_run(fourth)  # running, owned by this process
    renamed = cli_in_process(tmp_path, "rename", "abcd1", "named by its first characters")
    assert renamed.returncode == 0, renamed.stderr
    exported = cli_in_process(tmp_path, "export", "abcd1", "--csv", "-")
    assert exported.returncode == 0 and exported.stdout.startswith("env_step,"), exported.stderr
    liked = cli_in_process(tmp_path, "train", "--like", "abcd1", "--dry-run")
    assert liked.returncode == 0 and f"like run {first}" in liked.stdout, liked.stderr
    for command in (["stop", "abcd"], ["delete", "abcd"], ["export", "abcd", "--csv", "-"],
                    ["lab", "abcd"], ["train", "--like", "abcd"]):  # fmt: skip
        refused = cli_in_process(tmp_path, *command)
        assert refused.returncode == 1, (command, refused.stderr)
        line = one_line_error(refused)
        assert "'abcd' begins 2 run ids (abcd11110000, abcd22220000): give more" in line, line
    stopped = cli_in_process(tmp_path, "stop", "bcde")  # a queued run, then an ended one
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stderr == f"run {third}: stopped before it started\n"
    again = cli_in_process(tmp_path, "stop", "bcde")
    assert again.stderr == f"run {third}: already stopped: nothing to stop\n"
    running = cli_in_process(tmp_path, "stop", "cdef")
    assert (
        running.stderr
        == f"run {fourth}: asked to stop: it stops on its next flush, its data kept\n"
    )
    with RunStore(tmp_path) as store:
        sweep = store.create_sweep({"seed": [0]}, {"env_id": "CartPole-v1"})
    listed = cli_in_process(tmp_path, "runs", "--sweep", "def0", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    summary = cli_in_process(tmp_path, "summary", "def0")
    assert summary.stderr.startswith(f"sweep {sweep} has no finished episode yet"), summary.stderr
    with RunStore(tmp_path) as store:
        assert store.get_run(first).name == "named by its first characters"
        assert [r.id for r in store.list_runs()] == [fourth, third, "abcd22220000", first]


def test_train_json_says_deleted_for_a_run_deleted_after_it_ended(tmp_path, monkeypatch):
    """``delete --force`` stops a run, then deletes it: where the row goes just as ``train``
    reads the run's end (after the coordinator reported it), the JSON says "deleted" (with
    every column), exit 0, instead of failing on the missing row."""
    from gae_core.runs.sweep import Sweep

    outcomes, get_run = Sweep.outcomes, RunStore.get_run
    ended: list[str] = []

    def reported(self):
        found = outcomes(self)
        ended.extend(found)
        return found

    def deleted_as_read(self, run_id):
        if run_id in ended:  # the end's read: the row goes first (once)
            ended.remove(run_id)
            with RunStore(tmp_path) as store:
                store.delete_run(run_id, force=True)
        return get_run(self, run_id)

    monkeypatch.setattr(Sweep, "outcomes", reported)
    monkeypatch.setattr(RunStore, "get_run", deleted_as_read)
    done = cli_in_process(tmp_path, "train", "--total-steps", "100", *TINY_FLAGS, "--json",
                          "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "deleted" and set(RUN_COLUMNS) <= set(result)
    with RunStore(tmp_path) as store:
        assert store.list_runs() == []
