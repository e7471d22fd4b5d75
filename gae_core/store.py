"""The run store: every run's config, status, metrics, checkpoints and trajectories in SQLite.

One database file, ``<data_dir>/runs.sqlite3``, in WAL mode so that readers (the dashboard) never
block the writers (background runs, sweep worker processes) and several processes can share it.
``data_dir`` is the argument, else ``$GAE_CORE_DATA``, else ``./runs``.

Crash safety: every ``running`` (or ``queued``) run records its *owner* — host, pid and a process
start token (``/proc/<pid>/stat`` start time on Linux, so a recycled pid is not mistaken for the
owner) — and a heartbeat the writer refreshes on every flush. Opening the store (or calling
:meth:`RunStore.recover`) marks runs whose owner is gone as ``interrupted``; runs owned by a live
process, in this process or another one, are left alone. Everything flushed before a crash stays
readable: each flush is one committed transaction.

Metrics are long rows ``(run_id, key, env_step, wall_time, value)`` with namespaced keys
(``charts/episodic_return``, ``losses/value_loss``); ``wall_time`` is seconds since the run
started. :meth:`RunStore.metrics` returns them as a long DataFrame, :meth:`RunStore.metrics_wide`
as one column per key.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 1
DB_FILENAME = "runs.sqlite3"
DATA_ENV_VAR = "GAE_CORE_DATA"
DEFAULT_DATA_DIR = "runs"

STATUSES = ("queued", "running", "stopped", "finished", "failed", "interrupted")
ACTIVE_STATUSES = ("queued", "running")
SWEEP_STATUSES = ("running", "finished", "cancelled", "failed", "interrupted")

#: A heartbeat older than this marks the owner dead when its pid cannot be checked (other host).
HEARTBEAT_STALE_S = 120.0
#: Episodes in the moving window for the final return and the "solved" test (Gym's convention).
SOLVED_WINDOW = 100

_SCHEMA = f"""
CREATE TABLE sweeps (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    grid TEXT NOT NULL,
    base_config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN {SWEEP_STATUSES!r}),
    error TEXT,
    created_at REAL NOT NULL,
    ended_at REAL,
    owner_host TEXT,
    owner_pid INTEGER,
    owner_token TEXT,
    heartbeat_at REAL
);
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN {STATUSES!r}),
    error TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    env_steps INTEGER NOT NULL DEFAULT 0,
    sweep_id TEXT REFERENCES sweeps(id) ON DELETE SET NULL,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    owner_host TEXT,
    owner_pid INTEGER,
    owner_token TEXT,
    heartbeat_at REAL,
    episodes INTEGER NOT NULL DEFAULT 0,
    best_return REAL,
    final_return REAL,
    reward_threshold REAL,
    solved INTEGER,
    solved_at_step INTEGER
);
CREATE INDEX runs_sweep ON runs(sweep_id);
CREATE INDEX runs_status ON runs(status);
CREATE TABLE metrics (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    env_step INTEGER NOT NULL,
    wall_time REAL NOT NULL,
    value REAL
);
CREATE INDEX metrics_run_key_step ON metrics(run_id, key, env_step);
CREATE TABLE checkpoints (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    env_step INTEGER NOT NULL,
    created_at REAL NOT NULL,
    blob BLOB NOT NULL,
    PRIMARY KEY (run_id, env_step)
);
CREATE TABLE trajectories (
    run_id TEXT NOT NULL,
    env_step INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    blob BLOB NOT NULL,
    PRIMARY KEY (run_id, env_step, idx),
    FOREIGN KEY (run_id, env_step) REFERENCES checkpoints(run_id, env_step) ON DELETE CASCADE
);
"""


class StoreError(RuntimeError):
    """The store cannot do what was asked (unknown run, newer schema, run still active, ...)."""


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class RunSummary:
    """Headline numbers of a run, kept up to date on every flush."""

    episodes: int = 0
    #: Best moving mean of the last (up to) 100 episode returns seen during training.
    best_return: float | None = None
    #: Mean return of the last (up to) 100 episodes.
    final_return: float | None = None
    #: The environment's reward threshold (gymnasium spec), or None where it has none.
    reward_threshold: float | None = None
    #: Whether a 100-episode moving mean reached the threshold; None where there is no threshold.
    solved: bool | None = None
    #: The env step at which it first did; None if it never did.
    solved_at_step: int | None = None


@dataclass(frozen=True)
class RunRecord:
    """One row of the ``runs`` table."""

    id: str
    name: str
    config: dict[str, Any]
    status: str
    error: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    env_steps: int
    sweep_id: str | None
    stop_requested: bool
    summary: RunSummary = field(default_factory=RunSummary)

    @property
    def wall_seconds(self) -> float | None:
        """Seconds from start to end (or to now while it runs); None before it starts."""
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else time.time()
        return max(0.0, end - self.started_at)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


@dataclass(frozen=True)
class SweepRecord:
    """One row of the ``sweeps`` table; ``grid`` maps a config field to its list of values."""

    id: str
    name: str
    grid: dict[str, list[Any]]
    base_config: dict[str, Any]
    status: str
    error: str | None
    created_at: float
    ended_at: float | None


@dataclass(frozen=True)
class MetricRow:
    """One metric value; ``wall_time`` is seconds since the run started."""

    key: str
    env_step: int
    wall_time: float
    value: float


# ---------------------------------------------------------------------------------------------
# Summary of episode returns


class ReturnTracker:
    """Incremental moving mean of the last ``window`` episode returns, for :class:`RunSummary`.

    ``best_return`` is the best moving mean over the run, ``final_return`` the latest one; both
    average over fewer episodes until ``window`` have finished. "Solved" follows Gym's convention:
    the mean of ``window`` consecutive episodes reaches the env's reward threshold.
    """

    def __init__(self, reward_threshold: float | None, window: int = SOLVED_WINDOW) -> None:
        self.reward_threshold = reward_threshold
        self.window = window
        self._returns: deque[float] = deque(maxlen=window)
        self._sum = 0.0
        self.episodes = 0
        self.best_return: float | None = None
        self.solved_at_step: int | None = None

    def add(self, env_step: int, return_: float) -> None:
        if len(self._returns) == self.window:
            self._sum -= self._returns[0]
        self._returns.append(float(return_))
        self._sum += float(return_)
        self.episodes += 1
        mean = self.final_return
        assert mean is not None
        if self.best_return is None or mean > self.best_return:
            self.best_return = mean
        if (
            self.solved_at_step is None
            and self.reward_threshold is not None
            and len(self._returns) == self.window
            and mean >= self.reward_threshold
        ):
            self.solved_at_step = int(env_step)

    @property
    def final_return(self) -> float | None:
        if not self._returns:
            return None
        # Re-sum rather than trust the running sum forever: it drifts after many episodes.
        return math.fsum(self._returns) / len(self._returns)

    def summary(self) -> RunSummary:
        solved = None if self.reward_threshold is None else self.solved_at_step is not None
        return RunSummary(
            episodes=self.episodes,
            best_return=self.best_return,
            final_return=self.final_return,
            reward_threshold=self.reward_threshold,
            solved=solved,
            solved_at_step=self.solved_at_step,
        )


def summarize_returns(
    env_steps: Sequence[int], returns: Sequence[float], reward_threshold: float | None
) -> RunSummary:
    """:class:`RunSummary` of episodes given in the order they finished."""
    tracker = ReturnTracker(reward_threshold)
    for step, value in zip(env_steps, returns, strict=True):
        tracker.add(int(step), float(value))
    return tracker.summary()


# ---------------------------------------------------------------------------------------------
# Process ownership


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_start_token(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    state, starttime = fields[0], fields[19]
    if state in ("Z", "X", "x"):
        return None
    return starttime


_HAS_PROC = Path("/proc/self/stat").exists()


@dataclass(frozen=True)
class Owner:
    """Who owns an active run: host, pid and a token that tells this process from a later one
    that reuses the pid."""

    host: str
    pid: int
    token: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        start = _proc_start_token(pid) if _HAS_PROC else None
        token = f"{_boot_id()}:{start}" if start is not None else f"nostat:{uuid.uuid4().hex}"
        return cls(socket.gethostname(), pid, token)


def owner_alive(
    host: str | None,
    pid: int | None,
    token: str | None,
    heartbeat_at: float | None,
    now: float | None = None,
) -> bool:
    """Whether the process that owns a run still lives.

    On this host with ``/proc``: the pid exists, is not a zombie and has the recorded start token.
    Elsewhere (another host sharing the folder, or no ``/proc``): the heartbeat is fresh.
    """
    now = time.time() if now is None else now
    if host is None or pid is None:
        return False
    if host == socket.gethostname() and _HAS_PROC and token and not token.startswith("nostat:"):
        boot, _, start = token.partition(":")
        if boot != _boot_id():
            return False  # the machine rebooted since
        return _proc_start_token(pid) == start
    if host == socket.gethostname() and os.name == "posix":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return heartbeat_at is not None and now - heartbeat_at < HEARTBEAT_STALE_S


# ---------------------------------------------------------------------------------------------
# The store


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``data_dir``, else ``$GAE_CORE_DATA``, else ``./runs``."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_ENV_VAR) or DEFAULT_DATA_DIR
    return Path(data_dir).expanduser()


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {value!r}")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, sort_keys=True, allow_nan=False)


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class RunStore:
    """Thread-safe handle on the run database; share one per process.

    One SQLite connection guarded by a lock (``check_same_thread=False``); every write is one
    ``BEGIN IMMEDIATE`` transaction, so concurrent processes queue on SQLite's busy timeout
    instead of failing. Methods return dataclasses or pandas DataFrames, never cursors.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        busy_timeout_s: float = 30.0,
        recover: bool = True,
        recover_every_s: float | None = 5.0,
    ) -> None:
        self.data_dir = resolve_data_dir(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / DB_FILENAME
        self.owner = Owner.current()
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            self.path,
            timeout=busy_timeout_s,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"could not switch {self.path} to WAL mode (got {mode!r})")
        # NORMAL is durable across process crashes in WAL mode (only power loss can drop the
        # last commits), and much faster than FULL.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()
        # A long-lived reader (the dashboard) re-checks owners now and then, so a CLI run killed
        # while the page is open turns "interrupted" without reopening the store.
        self._recover_every_s = recover_every_s if recover else None
        self._last_recover = -math.inf
        if recover:
            self.recover()

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _migrate(self) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}; this gae_core reads up to "
                    f"{SCHEMA_VERSION}. Upgrade gae_core or use another --data-dir."
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        return self._read("PRAGMA journal_mode")[0][0]

    @property
    def schema_version(self) -> int:
        return self._read("PRAGMA user_version")[0][0]

    def integrity_check(self) -> str:
        """``"ok"`` when SQLite finds the database intact."""
        return "\n".join(row[0] for row in self._read("PRAGMA integrity_check"))

    # -- crash recovery ---------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Mark active runs (and sweeps) whose owner process is gone as ``interrupted``.

        Returns the ids of the runs it marked. Live owners — this process or any other — keep
        their runs.
        """
        now = time.time()
        self._last_recover = time.monotonic()
        rows = self._read(
            "SELECT id, owner_host, owner_pid, owner_token, heartbeat_at FROM runs "
            "WHERE status IN ('queued', 'running')"
        )
        dead = [row for row in rows if not owner_alive(*row[1:], now=now)]
        sweep_rows = self._read(
            "SELECT id, owner_host, owner_pid, owner_token, heartbeat_at FROM sweeps "
            "WHERE status = 'running'"
        )
        dead_sweeps = [row[0] for row in sweep_rows if not owner_alive(*row[1:], now=now)]
        if not dead and not dead_sweeps:
            return []
        with self._write() as conn:
            for run_id, _, pid, token, _ in dead:
                # Only if the owner is still the dead one: a live worker may have claimed the
                # run since it was read.
                conn.execute(
                    "UPDATE runs SET status = 'interrupted', ended_at = COALESCE(heartbeat_at, ?),"
                    " error = COALESCE(error, 'the process running it stopped without closing "
                    "the run (killed or crashed)') WHERE id = ? AND status IN ('queued', "
                    "'running') AND owner_pid IS ? AND owner_token IS ?",
                    (now, run_id, pid, token),
                )
            for sweep_id in dead_sweeps:
                conn.execute(
                    "UPDATE sweeps SET status = 'interrupted', ended_at = ? "
                    "WHERE id = ? AND status = 'running'",
                    (now, sweep_id),
                )
        return [row[0] for row in dead]

    # -- runs -------------------------------------------------------------------------------

    def create_run(
        self,
        config: dict[str, Any],
        *,
        name: str | None = None,
        sweep_id: str | None = None,
        run_id: str | None = None,
        reward_threshold: float | None = None,
    ) -> str:
        """Insert a ``queued`` run owned by this process; returns its id."""
        run_id = run_id or new_id()
        now = time.time()
        owner = self.owner
        with self._write() as conn:
            conn.execute(
                "INSERT INTO runs (id, name, config, status, created_at, sweep_id, owner_host, "
                "owner_pid, owner_token, heartbeat_at, reward_threshold) "
                "VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    name or run_id,
                    _dumps(config),
                    now,
                    sweep_id,
                    owner.host,
                    owner.pid,
                    owner.token,
                    now,
                    _finite_or_none(reward_threshold),
                ),
            )
        return run_id

    def claim_run(self, run_id: str) -> bool:
        """Move a ``queued`` run to ``running`` owned by this process.

        False when the run is no longer queued (cancelled, or claimed by someone else).
        """
        now = time.time()
        owner = self.owner
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE runs SET status = 'running', started_at = ?, heartbeat_at = ?, "
                "owner_host = ?, owner_pid = ?, owner_token = ? "
                "WHERE id = ? AND status = 'queued'",
                (now, now, owner.host, owner.pid, owner.token, run_id),
            )
            return cursor.rowcount == 1

    def flush(
        self,
        run_id: str,
        rows: Iterable[MetricRow | tuple[str, int, float, float]] = (),
        *,
        env_steps: int | None = None,
        summary: RunSummary | None = None,
    ) -> bool:
        """Append metric rows and update progress in one transaction; refreshes the heartbeat.

        Non-finite values are stored as NULL (SQLite has no NaN). Returns whether a stop was
        requested for the run (see :meth:`request_stop`), so a writer in another process can
        be stopped through the database.
        """
        now = time.time()
        params = []
        for row in rows:
            key, env_step, wall_time, value = (
                (row.key, row.env_step, row.wall_time, row.value)
                if isinstance(row, MetricRow)
                else row
            )
            params.append((run_id, key, int(env_step), float(wall_time), _finite_or_none(value)))
        with self._write() as conn:
            if params:
                conn.executemany(
                    "INSERT INTO metrics (run_id, key, env_step, wall_time, value) "
                    "VALUES (?, ?, ?, ?, ?)",
                    params,
                )
            sets, values = ["heartbeat_at = ?"], [now]
            if env_steps is not None:
                sets.append("env_steps = ?")
                values.append(int(env_steps))
            if summary is not None:
                sets += [
                    "episodes = ?",
                    "best_return = ?",
                    "final_return = ?",
                    "solved = ?",
                    "solved_at_step = ?",
                ]
                values += [
                    summary.episodes,
                    _finite_or_none(summary.best_return),
                    _finite_or_none(summary.final_return),
                    None if summary.solved is None else int(summary.solved),
                    summary.solved_at_step,
                ]
                if summary.reward_threshold is not None:
                    sets.append("reward_threshold = ?")
                    values.append(summary.reward_threshold)
            row = conn.execute(
                f"UPDATE runs SET {', '.join(sets)} WHERE id = ? RETURNING stop_requested",
                (*values, run_id),
            ).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r}")
        return bool(row[0])

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        """Close a run: ``finished``, ``stopped``, ``failed`` or ``interrupted``."""
        if status not in STATUSES or status in ACTIVE_STATUSES:
            raise ValueError(f"status must be one of stopped/finished/failed/interrupted: {status}")
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET status = ?, error = ?, ended_at = ?, heartbeat_at = ? "
                "WHERE id = ?",
                (status, error, time.time(), time.time(), run_id),
            )

    def request_stop(self, run_id: str) -> str:
        """Ask a run to stop, wherever it runs: a queued run is stopped at once, a running one
        sees the flag on its next flush. Returns the run's status after the request."""
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "UPDATE runs SET status = 'stopped', ended_at = ?, stop_requested = 1 "
                "WHERE id = ? AND status = 'queued'",
                (now, run_id),
            )
            conn.execute(
                "UPDATE runs SET stop_requested = 1 WHERE id = ? AND status = 'running'", (run_id,)
            )
            row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r}")
        return row[0]

    def stop_requested(self, run_id: str) -> bool:
        rows = self._read("SELECT stop_requested FROM runs WHERE id = ?", (run_id,))
        return bool(rows and rows[0][0])

    _RUN_COLUMNS = (
        "id, name, config, status, error, created_at, started_at, ended_at, env_steps, sweep_id, "
        "stop_requested, episodes, best_return, final_return, reward_threshold, solved, "
        "solved_at_step"
    )

    @staticmethod
    def _run_from_row(row: Sequence[Any]) -> RunRecord:
        (rid, name, config, status, error, created, started, ended, steps, sweep_id, stop) = row[
            :11
        ]
        episodes, best, final, threshold, solved, solved_at = row[11:]
        return RunRecord(
            id=rid,
            name=name,
            config=json.loads(config),
            status=status,
            error=error,
            created_at=created,
            started_at=started,
            ended_at=ended,
            env_steps=steps,
            sweep_id=sweep_id,
            stop_requested=bool(stop),
            summary=RunSummary(
                episodes=episodes,
                best_return=best,
                final_return=final,
                reward_threshold=threshold,
                solved=None if solved is None else bool(solved),
                solved_at_step=solved_at,
            ),
        )

    def _maybe_recover(self) -> None:
        every = self._recover_every_s
        if every is not None and time.monotonic() - self._last_recover >= every:
            self.recover()

    def get_run(self, run_id: str) -> RunRecord:
        self._maybe_recover()
        rows = self._read(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return self._run_from_row(rows[0])

    def list_runs(
        self, *, status: str | Sequence[str] | None = None, sweep_id: str | None = None
    ) -> list[RunRecord]:
        """Runs, newest first, optionally filtered by status and sweep.

        Like :meth:`get_run`, re-checks the owners of active runs every ``recover_every_s``.
        """
        self._maybe_recover()
        where, params = [], []
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params += statuses
        if sweep_id is not None:
            where.append("sweep_id = ?")
            params.append(sweep_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {self._RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC, rowid DESC",
            params,
        )
        return [self._run_from_row(row) for row in rows]

    def runs_frame(self, **filters: Any) -> pd.DataFrame:
        """:meth:`list_runs` as a flat DataFrame (one row per run, config fields prefixed)."""
        records = []
        for run in self.list_runs(**filters):
            record = {
                "run_id": run.id,
                "name": run.name,
                "status": run.status,
                "error": run.error,
                "created_at": run.created_at,
                "started_at": run.started_at,
                "ended_at": run.ended_at,
                "wall_seconds": run.wall_seconds,
                "env_steps": run.env_steps,
                "sweep_id": run.sweep_id,
                **{k: getattr(run.summary, k) for k in RunSummary.__dataclass_fields__},
            }
            record.update({f"config.{k}": v for k, v in run.config.items()})
            records.append(record)
        return pd.DataFrame.from_records(records)

    def rename_run(self, run_id: str, name: str) -> None:
        name = name.strip()
        if not name:
            raise ValueError("a run name cannot be empty")
        with self._write() as conn:
            if conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id)).rowcount == 0:
                raise StoreError(f"no run {run_id!r}")

    def delete_run(self, run_id: str, *, force: bool = False) -> None:
        """Delete a run and its metrics, checkpoints and trajectories.

        A run that is still active (its owner alive) is refused unless ``force``: stop it first.
        """
        run = self.get_run(run_id)
        if run.active and not force:
            raise StoreError(f"run {run_id} is {run.status}; stop it before deleting it")
        with self._write() as conn:
            # Explicit deletes in dependency order: cascades do it too, but this keeps working
            # on a connection where foreign keys were left off.
            conn.execute("DELETE FROM trajectories WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    # -- metrics ----------------------------------------------------------------------------

    def metrics(
        self,
        run_id: str,
        keys: Sequence[str] | None = None,
        *,
        since_step: int | None = None,
    ) -> pd.DataFrame:
        """Long DataFrame with columns ``env_step, wall_time, key, value`` in insertion order.

        ``since_step`` keeps rows with ``env_step > since_step`` (for incremental polling).
        Values stored as non-finite come back as NaN.
        """
        where, params = ["run_id = ?"], [run_id]
        if keys is not None:
            keys = list(keys)
            if not keys:
                return _empty_metrics()
            where.append(f"key IN ({', '.join('?' * len(keys))})")
            params += keys
        if since_step is not None:
            where.append("env_step > ?")
            params.append(int(since_step))
        rows = self._read(
            "SELECT env_step, wall_time, key, value FROM metrics "
            f"WHERE {' AND '.join(where)} ORDER BY rowid",
            params,
        )
        if not rows:
            return _empty_metrics()
        frame = pd.DataFrame(rows, columns=["env_step", "wall_time", "key", "value"])
        frame["env_step"] = frame["env_step"].astype("int64")
        frame["wall_time"] = frame["wall_time"].astype("float64")
        frame["value"] = frame["value"].astype("float64")
        return frame

    def metrics_wide(self, run_id: str, keys: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per env step and one column per key: ``env_step, wall_time, <keys...>``.

        Several values of one key at the same env step (two parallel envs ending an episode on
        the same step) become consecutive rows, so nothing is averaged away.
        """
        return to_wide(self.metrics(run_id, keys))

    def metric_keys(self, run_id: str) -> list[str]:
        rows = self._read(
            "SELECT DISTINCT key FROM metrics WHERE run_id = ? ORDER BY key", (run_id,)
        )
        return [row[0] for row in rows]

    # -- checkpoints and trajectories -------------------------------------------------------

    def save_checkpoint(
        self,
        run_id: str,
        env_step: int,
        blob: bytes,
        trajectories: Sequence[bytes] = (),
    ) -> None:
        """Store a model checkpoint and the trajectories recorded with it (replacing any at the
        same env step)."""
        with self._write() as conn:
            conn.execute(
                "DELETE FROM trajectories WHERE run_id = ? AND env_step = ?", (run_id, env_step)
            )
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, env_step, created_at, blob) "
                "VALUES (?, ?, ?, ?)",
                (run_id, int(env_step), time.time(), sqlite3.Binary(blob)),
            )
            conn.executemany(
                "INSERT INTO trajectories (run_id, env_step, idx, blob) VALUES (?, ?, ?, ?)",
                [
                    (run_id, int(env_step), i, sqlite3.Binary(traj))
                    for i, traj in enumerate(trajectories)
                ],
            )

    def checkpoint_steps(self, run_id: str) -> list[int]:
        rows = self._read(
            "SELECT env_step FROM checkpoints WHERE run_id = ? ORDER BY env_step", (run_id,)
        )
        return [row[0] for row in rows]

    def load_checkpoint(self, run_id: str, env_step: int | None = None) -> bytes:
        """The checkpoint at ``env_step``, or the latest one."""
        if env_step is None:
            rows = self._read(
                "SELECT blob FROM checkpoints WHERE run_id = ? ORDER BY env_step DESC LIMIT 1",
                (run_id,),
            )
        else:
            rows = self._read(
                "SELECT blob FROM checkpoints WHERE run_id = ? AND env_step = ?",
                (run_id, int(env_step)),
            )
        if not rows:
            at = "" if env_step is None else f" at env step {env_step}"
            raise StoreError(f"run {run_id} has no checkpoint{at}")
        return bytes(rows[0][0])

    def trajectory_blobs(self, run_id: str, env_step: int | None = None) -> list[bytes]:
        """Serialized trajectories recorded at checkpoint ``env_step`` (or the latest one that
        has any), in recording order."""
        if env_step is None:
            rows = self._read("SELECT MAX(env_step) FROM trajectories WHERE run_id = ?", (run_id,))
            if rows[0][0] is None:
                return []
            env_step = rows[0][0]
        rows = self._read(
            "SELECT blob FROM trajectories WHERE run_id = ? AND env_step = ? ORDER BY idx",
            (run_id, int(env_step)),
        )
        return [bytes(row[0]) for row in rows]

    def trajectories(self, run_id: str, env_step: int | None = None) -> list[Any]:
        """:meth:`trajectory_blobs` decoded with ``gae_core.trainer.Trajectory.from_bytes``."""
        from gae_core.trainer import Trajectory  # lazy: the store does not need torch

        return [Trajectory.from_bytes(b) for b in self.trajectory_blobs(run_id, env_step)]

    def trajectory_steps(self, run_id: str) -> list[int]:
        """Checkpoint env steps that have recorded trajectories."""
        rows = self._read(
            "SELECT DISTINCT env_step FROM trajectories WHERE run_id = ? ORDER BY env_step",
            (run_id,),
        )
        return [row[0] for row in rows]

    # -- sweeps -----------------------------------------------------------------------------

    def create_sweep(
        self,
        grid: dict[str, list[Any]],
        base_config: dict[str, Any],
        *,
        name: str | None = None,
        sweep_id: str | None = None,
    ) -> str:
        sweep_id = sweep_id or new_id()
        now = time.time()
        owner = self.owner
        with self._write() as conn:
            conn.execute(
                "INSERT INTO sweeps (id, name, grid, base_config, status, created_at, owner_host,"
                " owner_pid, owner_token, heartbeat_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, "
                "?, ?)",
                (
                    sweep_id,
                    name or f"sweep-{sweep_id}",
                    _dumps(grid),
                    _dumps(base_config),
                    now,
                    owner.host,
                    owner.pid,
                    owner.token,
                    now,
                ),
            )
        return sweep_id

    def heartbeat_sweep(self, sweep_id: str) -> None:
        """Refresh the heartbeat of the sweep and of its queued trials (owned by the sweep's
        coordinating process until a worker claims them)."""
        now = time.time()
        with self._write() as conn:
            conn.execute("UPDATE sweeps SET heartbeat_at = ? WHERE id = ?", (now, sweep_id))
            conn.execute(
                "UPDATE runs SET heartbeat_at = ? WHERE sweep_id = ? AND status = 'queued'",
                (now, sweep_id),
            )

    def finish_sweep(self, sweep_id: str, status: str, error: str | None = None) -> None:
        if status not in SWEEP_STATUSES or status == "running":
            raise ValueError(f"bad final sweep status {status!r}")
        with self._write() as conn:
            conn.execute(
                "UPDATE sweeps SET status = ?, error = ?, ended_at = ? WHERE id = ?",
                (status, error, time.time(), sweep_id),
            )

    @staticmethod
    def _sweep_from_row(row: Sequence[Any]) -> SweepRecord:
        sid, name, grid, base, status, error, created, ended = row
        return SweepRecord(
            id=sid,
            name=name,
            grid=json.loads(grid),
            base_config=json.loads(base),
            status=status,
            error=error,
            created_at=created,
            ended_at=ended,
        )

    _SWEEP_COLUMNS = "id, name, grid, base_config, status, error, created_at, ended_at"

    def get_sweep(self, sweep_id: str) -> SweepRecord:
        rows = self._read(f"SELECT {self._SWEEP_COLUMNS} FROM sweeps WHERE id = ?", (sweep_id,))
        if not rows:
            raise StoreError(f"no sweep {sweep_id!r} in {self.path}")
        return self._sweep_from_row(rows[0])

    def list_sweeps(self) -> list[SweepRecord]:
        rows = self._read(
            f"SELECT {self._SWEEP_COLUMNS} FROM sweeps ORDER BY created_at DESC, rowid DESC"
        )
        return [self._sweep_from_row(row) for row in rows]

    def sweep_status_counts(self, sweep_id: str) -> dict[str, int]:
        """How many of the sweep's trials are in each status (every status present as a key)."""
        counts = dict.fromkeys(STATUSES, 0)
        for status, count in self._read(
            "SELECT status, COUNT(*) FROM runs WHERE sweep_id = ? GROUP BY status", (sweep_id,)
        ):
            counts[status] = count
        return counts

    def delete_sweep(self, sweep_id: str, *, runs: bool = True, force: bool = False) -> None:
        """Delete a sweep row and (by default) its trials."""
        if runs:
            for run in self.list_runs(sweep_id=sweep_id):
                self.delete_run(run.id, force=force)
        with self._write() as conn:
            conn.execute("DELETE FROM sweeps WHERE id = ?", (sweep_id,))


def _empty_metrics() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "env_step": pd.Series(dtype="int64"),
            "wall_time": pd.Series(dtype="float64"),
            "key": pd.Series(dtype="object"),
            "value": pd.Series(dtype="float64"),
        }
    )


def to_wide(long: pd.DataFrame) -> pd.DataFrame:
    """Long metrics (``env_step, wall_time, key, value``) to ``env_step, wall_time, <keys>``.

    Rows are ordered by env step; the n-th value of a key at one env step lands on the n-th row
    of that step, so repeated values are kept, not averaged. ``wall_time`` is the latest one
    among the values of the row.
    """
    if long.empty:
        return pd.DataFrame(
            {"env_step": pd.Series(dtype="int64"), "wall_time": pd.Series(dtype="float64")}
        )
    frame = long.copy()
    frame["_n"] = frame.groupby(["env_step", "key"]).cumcount()
    values = frame.pivot(index=["env_step", "_n"], columns="key", values="value")
    wall = frame.groupby(["env_step", "_n"])["wall_time"].max()
    wide = values.join(wall).reset_index().sort_values(["env_step", "_n"], kind="stable")
    keys = sorted(frame["key"].unique())
    wide = wide[["env_step", "wall_time", *keys]]
    wide.columns.name = None
    return wide.reset_index(drop=True)
