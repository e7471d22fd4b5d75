"""The run store: every run's config, status, metrics, checkpoints and trajectories, and the
sweeps they belong to, as reads and writes of the SQLite tables (:mod:`gae_core.storage.database`
opens the file, refuses a damaged one and recovers runs of dead processes).

Everything flushed before a crash stays readable: each flush is one committed transaction, and a
checkpoint is written together with the run's step count, so a checkpoint is never ahead of the
steps the run reports. Metrics are long rows ``(run_id, key, env_step, wall_time, value)`` with
the keys of :mod:`gae_core.metrics`; ``wall_time`` is seconds since the run started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from gae_core.errors import StoreError, StoreFull
from gae_core.inert import clean_name
from gae_core.outcome import RunSummary
from gae_core.storage.database import (
    DATA_ENV_VAR,
    DB_FILENAME,
    ID_LENGTH,
    RUN_COLUMNS,
    SHORT_ID,
    Database,
    dumps,
    finite_or_none,
    flag,
    folder_is_writable,
    new_id,
    no_store,
    resolve_data_dir,
)
from gae_core.storage.lab_table import LabTable
from gae_core.storage.ownership import OWNER_COLUMNS
from gae_core.storage.records import ACTIVE_STATUSES, STATUSES, MetricRow, RunRecord
from gae_core.storage.retention import RetentionTable
from gae_core.storage.sweep_table import SweepTable
from gae_core.version import source_version

__all__ = [
    "DATA_ENV_VAR",
    "DB_FILENAME",
    "ID_LENGTH",
    "SHORT_ID",
    "RunStore",
    "folder_is_writable",
    "new_id",
    "open_for_reading",
    "require_store",
    "resolve_data_dir",
    "to_wide",
]


class RunStore(SweepTable, LabTable, RetentionTable, Database):
    """The run store (see the module docstring); methods return dataclasses or pandas
    DataFrames, never cursors."""

    # -- runs -------------------------------------------------------------------------------

    def create_run(
        self,
        config: dict[str, Any],
        *,
        name: str | None = None,
        sweep_id: str | None = None,
        reward_threshold: float | None = None,
    ) -> str:
        """Insert a ``queued`` run owned by this process; returns its id. The name is cleaned
        (:func:`gae_core.inert.clean_name`): ``ValueError`` if nothing printable is left."""
        run_id = new_id()
        name = clean_name(name, field="run name") if name is not None else run_id
        now = time.time()
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO runs (id, name, config, status, created_at, sweep_id, {OWNER_COLUMNS}"
                ", reward_threshold, code) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    name,
                    dumps(config),
                    now,
                    sweep_id,
                    *self.owner.row(now),
                    finite_or_none(reward_threshold),
                    dumps(source_version()),
                ),
            )
        return run_id

    def claim_run(self, run_id: str) -> bool:
        """Move a ``queued`` run to ``running`` owned by this process.

        False when the run is no longer queued (cancelled, or claimed by someone else).
        """
        now = time.time()
        with self._write() as conn:
            cursor = conn.execute(
                f"UPDATE runs SET status = 'running', started_at = ?, ({OWNER_COLUMNS}) = "
                "(?, ?, ?, ?) WHERE id = ? AND status = 'queued'",
                (now, *self.owner.row(now), run_id),
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
        be stopped through the database. ``StoreError`` if the run no longer exists.
        """
        now = time.time()
        params = []
        for row in rows:
            key, env_step, wall_time, value = (
                (row.key, row.env_step, row.wall_time, row.value)
                if isinstance(row, MetricRow)
                else row
            )
            params.append((run_id, key, int(env_step), float(wall_time), finite_or_none(value)))
        sets, values = ["heartbeat_at = ?"], [now]
        if env_steps is not None:
            sets.append("env_steps = MAX(env_steps, ?)")
            values.append(int(env_steps))
        if summary is not None:
            columns = {
                "episodes": summary.episodes,
                "best_return": finite_or_none(summary.best_return),
                "final_return": finite_or_none(summary.final_return),
                "solved": flag(summary.solved),
                "solved_at_step": summary.solved_at_step,
                "fell_below_at_step": summary.fell_below_at_step,
                "stayed_solved": flag(summary.stayed_solved),
            }
            if summary.reward_threshold is not None:
                columns["reward_threshold"] = summary.reward_threshold
            sets += [f"{column} = ?" for column in columns]
            values += columns.values()
        with self._write() as conn:
            row = conn.execute(
                f"UPDATE runs SET {', '.join(sets)} WHERE id = ? RETURNING stop_requested",
                (*values, run_id),
            ).fetchone()
            if row is None:
                raise StoreError(f"no run {run_id!r} in {self.path} (deleted?)")
            if params:
                conn.executemany(
                    "INSERT INTO metrics (run_id, key, env_step, wall_time, value) "
                    "VALUES (?, ?, ?, ?, ?)",
                    params,
                )
        return bool(row[0])

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        """Close a run: ``finished``, ``stopped``, ``failed`` or ``interrupted``. A full disk's
        refusal is kept as its one-line reason, not the traceback that carried it; a retried run
        keeps :meth:`reset_run`'s note of its lost attempt as the first line of ``error``."""
        if status not in STATUSES or status in ACTIVE_STATUSES:
            raise ValueError(f"status must be one of stopped/finished/failed/interrupted: {status}")
        refusal = self.last_refusal
        if status == "failed" and error and refusal and error.rstrip().endswith(refusal):
            error = refusal
        now = time.time()
        with self._write() as conn:
            conn.execute(  # SET reads the row as it was: an active run keeps reset_run's note
                "UPDATE runs SET status = ?1, ended_at = ?3, heartbeat_at = ?3, error = CASE WHEN"
                " status IN ('queued', 'running') AND error IS NOT NULL THEN error || "
                "COALESCE(char(10) || ?2, '') ELSE ?2 END WHERE id = ?4",
                (status, error, now, run_id),
            )

    def reset_run(self, run_id: str, note: str) -> None:
        """Put a run back to ``queued`` with no data, for a retry (its trial died): metrics,
        checkpoints and progress are dropped; ``note`` is kept in ``error`` so the retry shows."""
        with self._write() as conn:
            for table in ("trajectories", "checkpoints", "metrics"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute(
                "UPDATE runs SET status = 'queued', error = ?, started_at = NULL, ended_at = NULL,"
                " env_steps = 0, episodes = 0, best_return = NULL, final_return = NULL,"
                " solved = NULL, solved_at_step = NULL, fell_below_at_step = NULL,"
                f" stayed_solved = NULL, stop_requested = 0, ({OWNER_COLUMNS}) = (?, ?, ?, ?)"
                " WHERE id = ?",
                (note, *self.owner.row(time.time()), run_id),
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
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return row[0]

    @staticmethod
    def _run_from_row(row: Sequence[Any]) -> RunRecord:
        """A row of :data:`~gae_core.storage.database.RUN_COLUMNS` as a record: the summary's
        columns become its :class:`RunSummary`, the rest its fields of the same names."""
        run = dict(zip(RUN_COLUMNS, row, strict=True))
        summary = {f.name: run.pop(f.name) for f in dataclasses.fields(RunSummary)}
        stayed = summary["stayed_solved"]
        summary["stayed_solved"] = None if stayed is None else bool(stayed)
        damaged = None
        try:
            run["config"] = json.loads(run["config"])
            if not isinstance(run["config"], dict):
                raise ValueError("not an object")
        except (TypeError, ValueError) as exc:
            run["config"], damaged = {}, f"its config is not a valid JSON object ({exc})"
        run.update(stop_requested=bool(run["stop_requested"]), code=_code(run["code"]))
        return RunRecord(**run, summary=RunSummary(**summary), damaged=damaged)

    def get_run(self, run_id: str) -> RunRecord:
        """The run's record (a pure read; see :meth:`recover`)."""
        rows = self._read(f"SELECT {self._run_select} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return self._run_from_row(rows[0])

    def list_runs(
        self, *, status: str | Sequence[str] | None = None, sweep_id: str | None = None
    ) -> list[RunRecord]:
        """Runs, newest first, optionally filtered by status and sweep (a pure read)."""
        where, params = [], []
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            unknown = sorted(set(statuses) - set(STATUSES))
            if unknown:
                raise ValueError(f"unknown status {unknown}; statuses: {', '.join(STATUSES)}")
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params += statuses
        if sweep_id is not None:
            where.append("sweep_id = ?")
            params.append(sweep_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(
            f"SELECT {self._run_select} FROM runs {clause} ORDER BY created_at DESC, rowid DESC",
            params,
        )
        return [self._run_from_row(row) for row in rows]

    def rename_run(self, run_id: str, name: str) -> str:
        """Rename a run; returns the cleaned name (``ValueError`` for an empty one)."""
        name = clean_name(name, field="run name")
        with self._write() as conn:
            if conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id)).rowcount == 0:
                raise StoreError(f"no run {run_id!r} in {self.path}")
        return name

    def delete_run(self, run_id: str, *, force: bool = False) -> None:
        """Delete a run and its metrics, checkpoints and trajectories.

        A run that is still active is refused unless ``force``. With ``force`` the caller is
        expected to have asked it to stop first (the CLI's ``delete --force`` does, and waits);
        a writer that finds its run gone ends with status ``deleted`` instead of failing.
        """
        run = self.get_run(run_id)
        if run.active and not force:
            raise StoreError(f"run {run_id} is {run.status}; stop it before deleting it")
        with self._write() as conn:
            # Explicit deletes in dependency order: cascades do it too, but this keeps working
            # on a connection where foreign keys were left off.
            for table in ("trajectories", "checkpoints", "metrics", "lab_results"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def run_exists(self, run_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM runs WHERE id = ?", (run_id,)))

    def resolve_run_id(self, text: str) -> str:
        """The run id ``text`` names (:meth:`_resolve_id`)."""
        return self._resolve_id("runs", "run", text)

    # -- metrics ----------------------------------------------------------------------------

    def metrics(
        self, run_id: str, keys: Sequence[str] | None = None, *, since_step: int | None = None
    ) -> pd.DataFrame:
        """Long DataFrame with columns ``env_step, wall_time, key, value`` in insertion order.

        ``since_step`` keeps rows with ``env_step > since_step`` (for incremental polling).
        Values stored as non-finite come back as NaN.
        """
        where, params = ["run_id = ?"], [run_id]
        if keys is not None:
            keys = list(keys)
            where.append(f"key IN ({', '.join('?' * len(keys))})")  # (none: SQLite finds no row)
            params += keys
        if since_step is not None:
            where.append("env_step > ?")
            params.append(int(since_step))
        rows = self._read(
            "SELECT env_step, wall_time, key, value FROM metrics "
            f"WHERE {' AND '.join(where)} ORDER BY rowid",
            params,
        )
        frame = pd.DataFrame(rows, columns=["env_step", "wall_time", "key", "value"])
        return frame.astype(_NUMBERS)

    def metrics_wide(self, run_id: str, keys: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per env step and one column per key: ``env_step, wall_time, <keys...>``."""
        return to_wide(self.metrics(run_id, keys))

    # -- checkpoints and trajectories -------------------------------------------------------

    def save_checkpoint(
        self, run_id: str, env_step: int, blob: bytes, trajectories: Sequence[bytes] = ()
    ) -> None:
        """Store a model checkpoint and the trajectories recorded with it (replacing any at the
        same env step); the run's step count moves up to ``env_step`` in the same transaction."""
        env_step = int(env_step)
        with self._write() as conn:
            conn.execute(
                "DELETE FROM trajectories WHERE run_id = ? AND env_step = ?", (run_id, env_step)
            )
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, env_step, created_at, blob) "
                "VALUES (?, ?, ?, ?)",
                (run_id, env_step, time.time(), blob),
            )
            conn.executemany(
                "INSERT INTO trajectories (run_id, env_step, idx, blob) VALUES (?, ?, ?, ?)",
                [(run_id, env_step, i, traj) for i, traj in enumerate(trajectories)],
            )
            conn.execute(
                "UPDATE runs SET env_steps = MAX(env_steps, ?) WHERE id = ?", (env_step, run_id)
            )

    def checkpoint_steps(self, run_id: str) -> list[int]:
        rows = self._read(
            "SELECT env_step FROM checkpoints WHERE run_id = ? ORDER BY env_step", (run_id,)
        )
        return [row[0] for row in rows]

    def load_checkpoint(self, run_id: str, env_step: int | None = None) -> bytes:
        """The checkpoint at ``env_step``, or the latest one."""
        exact = "" if env_step is None else " AND env_step = ?"
        params = (run_id,) if env_step is None else (run_id, int(env_step))
        rows = self._read(
            f"SELECT blob FROM checkpoints WHERE run_id = ?{exact} ORDER BY env_step DESC LIMIT 1",
            params,
        )
        if not rows:
            at = "" if env_step is None else f" at env step {env_step}"
            raise StoreError(f"run {run_id} has no checkpoint{at}")
        return bytes(rows[0][0])

    def trajectory_blobs(self, run_id: str, env_step: int | None = None) -> list[bytes]:
        """Serialized trajectories (``gae_core.trajectory.Trajectory.to_bytes``) recorded at
        checkpoint ``env_step`` (or the latest one that has any), in recording order."""
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

    def runs_with_trajectories(self) -> set[str]:
        """Ids of the runs that have at least one recorded trajectory (one query)."""
        return {row[0] for row in self._read("SELECT DISTINCT run_id FROM trajectories")}


def require_store(data_dir: str | os.PathLike[str] | None = None) -> None:
    """:class:`~gae_core.errors.NoStore` where ``data_dir`` holds no store (for what acts on
    stored runs and must not make an empty store); a path that is a file passes (opening it
    says so)."""
    folder = resolve_data_dir(data_dir)
    if not folder.is_file() and not (folder / DB_FILENAME).is_file():
        raise no_store(folder / DB_FILENAME)


def open_for_reading(data_dir: str | os.PathLike[str] | None = None, *, recover=True) -> RunStore:
    """The store at ``data_dir`` for what only reads it (``runs``, ``export``, the dashboard's
    CSV exports): opened for writing where it can be (a live store is read with its latest
    writes; recovered when ``recover``), read-only where the folder refuses new files or the
    disk is full."""
    folder = resolve_data_dir(data_dir)
    try:
        if not folder.is_dir() or folder_is_writable(folder):
            return RunStore(folder, recover=recover)
    except StoreFull:
        if not (folder / DB_FILENAME).is_file():
            raise
    return RunStore(folder, read_only=True)


#: The types of the metrics frame's number columns (typed even when the frame is empty).
_NUMBERS = {"env_step": "int64", "wall_time": "float64", "value": "float64"}


def to_wide(long: pd.DataFrame) -> pd.DataFrame:
    """Long metrics (``env_step, wall_time, key, value``) to ``env_step, wall_time, <keys>``.

    Rows are ordered by env step; the n-th value of a key at one env step lands on the n-th row
    of that step, so repeated values (two envs ending an episode on the same step) are kept, not
    averaged. ``wall_time`` is the latest one among the values of the row.
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


def _code(text: str | None) -> dict[str, Any] | None:
    """A run's stored code (JSON), or None where it is missing or unreadable."""
    try:
        code = json.loads(text) if text else None
    except ValueError:
        return None
    return code if isinstance(code, dict) else None
