"""The run store's database: opening (and refusing) the SQLite file, transactions, crash
recovery. :class:`~gae_core.storage.store.RunStore` builds its tables' reads and writes on this.

One database file, ``<data_dir>/runs.sqlite3``, in WAL mode so that readers (the dashboard) never
block the writer and several processes can share it. ``data_dir`` is the argument, else
``$GAE_CORE_DATA``, else ``./runs``.

A damaged store is refused, never written into: opening one for writing runs
``PRAGMA quick_check``; a file that is not a database, another program's database (tables but
no run store's), a data folder that is a file or a folder that cannot be written gets a
:class:`~gae_core.errors.StoreError` naming the path, and the file is left as it was. A
read-only folder can still be read (``read_only=True``). A full disk is named as such
(:class:`~gae_core.errors.StoreFull`): the write is rolled back, and opening an up-to-date store
writes nothing, so reads go on.

Crash safety: active runs record their owner process (:mod:`gae_core.storage.ownership`) and a
heartbeat; :meth:`Database.recover` marks runs whose owner is gone as ``interrupted``. Reads never
recover: a long-lived process (the dashboard's run manager) calls it on its own schedule.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from gae_core.errors import NoStore, StoreError, StoreFull, UnknownId
from gae_core.storage.ownership import OWNER_COLUMNS, Owner, owner_alive
from gae_core.storage.schema import SCHEMA_VERSION, migrate, refuse_newer

__all__ = [
    "DATA_ENV_VAR",
    "DB_FILENAME",
    "ID_LENGTH",
    "SHORT_ID",
    "Database",
    "folder_is_writable",
    "new_id",
    "no_store",
    "resolve_data_dir",
]

DB_FILENAME = "runs.sqlite3"
DATA_ENV_VAR = "GAE_CORE_DATA"
DEFAULT_DATA_DIR = "runs"


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``data_dir``, else ``$GAE_CORE_DATA``, else ``./runs``."""
    if data_dir is None or str(data_dir) == "":
        data_dir = os.environ.get(DATA_ENV_VAR) or DEFAULT_DATA_DIR
    return Path(data_dir).expanduser()


def no_store(path: Path) -> NoStore:
    """What opening a store that must exist says where ``path`` (its file) is missing."""
    return NoStore(f"no run store at {path}")


def folder_is_writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (tried, not guessed from permission bits:
    root ignores those, and a read-only mount or an immutable folder refuses even root)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def is_disk_full(exc: BaseException) -> bool:
    """Whether a SQLite error says the disk (or the database's page limit) is full."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)


#: Hex digits no reader takes for part of a number ("e" makes "12e45" a float)
_LETTERS = frozenset("abcdf")
#: The fewest characters of a run's or sweep's id that name it (git's rule for short hashes).
SHORT_ID = 4
#: The characters of a run's or sweep's id (:func:`new_id`).
ID_LENGTH = 12


def new_id() -> str:
    """:data:`ID_LENGTH` random hex digits, at least one of them a letter other than "e", so
    pandas and spreadsheets read it back from the CSV exports as text (an id of digits, or of
    digits around one "e", reads as a number)."""
    while True:
        candidate = uuid.uuid4().hex[:ID_LENGTH]
        if not _LETTERS.isdisjoint(candidate):
            return candidate


def json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {value!r}")


def dumps(value: Any) -> str:
    return json.dumps(value, default=json_default, sort_keys=True, allow_nan=False)


def finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


#: The ``runs`` columns a :class:`~gae_core.storage.records.RunRecord` is read from.
RUN_COLUMNS = (
    "id", "name", "config", "status", "error", "created_at", "started_at", "ended_at",
    "env_steps", "sweep_id", "stop_requested", "episodes", "best_return", "final_return",
    "reward_threshold", "solved_at_step", "fell_below_at_step", "stayed_solved", "code",
)  # fmt: skip


def _busy(exc: BaseException) -> bool:
    """Whether SQLite answered that another connection holds the file (busy or locked)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary result code
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class _Busy(Exception):
    """SQLite answered busy while a store was being opened (:meth:`Database._prepare_when_free`)."""


class Database:
    """Thread-safe handle on the run database; share one per process.

    One SQLite connection guarded by a lock (``check_same_thread=False``); every write is one
    ``BEGIN IMMEDIATE`` transaction, so concurrent processes queue on SQLite's busy timeout
    instead of failing. Any SQLite failure surfaces as ``StoreError`` naming the file.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        busy_timeout_s: float = 30.0,
        recover: bool = True,
    ) -> None:
        self.data_dir = resolve_data_dir(data_dir)
        self.path = self.data_dir / DB_FILENAME
        self.read_only = read_only
        self.owner = Owner.current()
        self._lock = threading.RLock()
        #: the message of the last write this handle refused (a full disk, an I/O error)
        self.last_refusal: str | None = None
        self._conn = self._connect(busy_timeout_s)
        try:
            self._prepare_when_free(busy_timeout_s)
        except BaseException:
            self._conn.close()
            raise
        if recover and not read_only:
            with contextlib.suppress(StoreFull):  # the runs are marked once there is space
                self.recover()

    # -- opening ----------------------------------------------------------------------------

    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        folder = self.data_dir
        if folder.exists() and not folder.is_dir():
            raise StoreError(f"{folder} is a file, not a folder: choose another data folder")
        if self.read_only:
            if not self.path.is_file():
                raise no_store(self.path)
            # mode=ro needs the -shm file (or a writable folder to make one); a read-only
            # folder whose store was closed cleanly has neither, so fall back to immutable.
            uris = [f"file:{self.path}?mode=ro", f"file:{self.path}?immutable=1"]
        else:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the data folder {folder}: {exc.strerror}"
                ) from None
            if not folder_is_writable(folder):
                raise StoreError(
                    f"{folder} is read-only: the run store needs to write there (read-only "
                    "commands such as `runs` and `export` still work)"
                )
            uris = [f"file:{self.path}"]
        last: Exception | None = None
        for uri in uris:
            conn = None
            try:
                conn = sqlite3.connect(
                    uri,
                    uri=True,
                    timeout=busy_timeout_s,  # SQLite's busy timeout
                    isolation_level=None,  # autocommit; transactions are explicit
                    check_same_thread=False,
                )
                conn.execute("PRAGMA schema_version").fetchone()  # fails on a non-database
                return conn
            except sqlite3.Error as exc:
                last = exc
                if conn is not None:  # opened, but not a database: not left open
                    conn.close()
                if _busy(exc):  # held by a writer: immutable would read around its lock
                    raise StoreError(
                        f"{self.path} is locked by another connection (SQLite: {exc}); try "
                        "again when it is done"
                    ) from None
        raise StoreError(f"cannot open the run store {self.path}: {last}")

    def _prepare_when_free(self, busy_timeout_s: float) -> None:
        """:meth:`_prepare`, again while another connection holds the file, for up to
        ``busy_timeout_s``: SQLite answers "database is locked" at once, without its busy
        timeout, where waiting could deadlock (e.g. several workers opening one new store)."""
        deadline = time.monotonic() + busy_timeout_s
        pause = 0.01
        while True:
            try:
                self._prepare()
                return
            except _Busy as busy:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"{self.path} stayed locked by another connection for "
                        f"{busy_timeout_s:g} s (SQLite: {busy.__cause__}); try again when it "
                        "is done"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 0.2)

    def _prepare(self) -> None:
        conn = self._conn
        try:
            if self.read_only:
                refuse_newer(self.path, conn.execute("PRAGMA user_version").fetchone()[0])
            else:
                self._refuse_foreign()  # before anything in the file is changed
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise StoreError(f"could not switch {self.path} to WAL mode (got {mode!r})")
                check = conn.execute("PRAGMA quick_check").fetchall()
                if [row[0] for row in check] != ["ok"]:
                    first = check[0][0] if check else "no answer"
                    raise StoreError(
                        f"{self.path} is damaged (SQLite quick_check: {first}); refusing to "
                        "write into it. Move it away (or restore a backup) and start again."
                    )
                # NORMAL is durable across process crashes in WAL mode (only power loss can
                # drop the last commits), and much faster than FULL.
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
                if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                    with self._write() as tx:  # an up-to-date store is opened without a write
                        migrate(tx, self.path)
            names = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        except sqlite3.DatabaseError as exc:
            if is_disk_full(exc):
                raise self._refused(exc) from None
            if _busy(exc):
                raise _Busy from exc  # another process holds it: not damage (above)
            if self.read_only:
                raise StoreError(f"{self.path} cannot be read as a run store: {exc}") from None
            raise StoreError(
                f"{self.path} is damaged or not a run store (SQLite: {exc}); refusing to write "
                "into it. Move it away (or restore a backup) and start again."
            ) from None
        if self.read_only and not names:
            raise StoreError(f"{self.path} holds no runs table: not a run store")
        # an older store opened read-only lacks the newer columns: read them as NULL
        self._run_select = ", ".join(c if c in names else f"NULL AS {c}" for c in RUN_COLUMNS)

    def _refuse_foreign(self) -> None:
        """``StoreError`` for another program's database: tables, but not a run store's (no
        ``runs`` table, or no schema version)."""
        conn = self._conn
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' "
                "ESCAPE '!' ORDER BY name"
            )
        ]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if tables and ("runs" not in tables or version == 0):
            shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
            raise StoreError(
                f"{self.path} is not a run store: it holds another program's tables ({shown}); "
                f"refusing to change it. Choose another data folder (--data-dir or "
                f"${DATA_ENV_VAR})."
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _refused(self, exc: sqlite3.Error, message: str | None = None) -> StoreError:
        """The error for a write SQLite refused (``message``, else a full disk's or SQLite's
        own); remembered as :attr:`last_refusal`."""
        if is_disk_full(exc):
            error: StoreError = StoreFull(
                f"the disk holding {self.path} is full (SQLite: {exc}): nothing more was "
                "written; free some space and try again (what is stored is intact and can "
                "still be read)"
            )
        else:
            error = StoreError(message or f"{self.path}: {exc}")
        self.last_refusal = str(error)
        return error

    def _rollback(self) -> None:
        # SQLite rolls back by itself on some errors (a full disk); ROLLBACK would then fail
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` … ``COMMIT`` transaction; anything that fails in it or in
        its commit rolls it back and, for SQLite, raises ``StoreError`` (``StoreFull`` for a
        full disk)."""
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only")
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._refused(exc, f"cannot write to {self.path}: {exc}") from None
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error):
                    raise self._refused(exc) from exc
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read {self.path}: {exc}") from None

    def _resolve_id(self, table: str, what: str, text: str) -> str:
        """The id of ``table`` (``runs``, ``sweeps``) that ``text`` names: itself, or the one
        stored id it begins with at least :data:`SHORT_ID` characters (git's rule for short
        hashes); :class:`UnknownId` naming the candidates where it begins several, or none."""
        missing = f"no {what} {text!r} in {self.path}"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a typed byte that is not UTF-8: no id holds one
            raise UnknownId(missing) from None
        if self._read(f"SELECT 1 FROM {table} WHERE id = ?", (text,)):
            return text
        if len(text) < SHORT_ID:
            raise UnknownId(f"{missing} (a short id needs at least {SHORT_ID} characters)")
        rows = self._read(f"SELECT id FROM {table} WHERE substr(id, 1, ?) = ? ORDER BY id",
                          (len(text), text))  # fmt: skip
        if len(rows) == 1:
            return rows[0][0]
        if not rows:
            raise UnknownId(missing)
        raise UnknownId(f"{text!r} begins {len(rows)} {what} ids "
                        f"({', '.join(r[0] for r in rows)}): give more of it",
                        tuple(r[0] for r in rows))  # fmt: skip

    @property
    def journal_mode(self) -> str:
        return self._read("PRAGMA journal_mode")[0][0]

    @property
    def schema_version(self) -> int:
        return self._read("PRAGMA user_version")[0][0]

    def integrity_check(self) -> str:
        """``"ok"`` when SQLite finds the database intact."""
        return "\n".join(row[0] for row in self._read("PRAGMA integrity_check"))

    def size_bytes(self) -> int:
        """Bytes on disk: the database file and its write-ahead log."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += Path(f"{self.path}{suffix}").stat().st_size
        return total

    # -- crash recovery ---------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Mark active runs (and sweeps) whose owner process is gone as ``interrupted``.

        Returns the ids of the runs it marked. Live owners — this process or any other — keep
        their runs. Does nothing on a read-only store.
        """
        if self.read_only:
            return []
        now = time.time()
        rows = self._read(
            f"SELECT id, {OWNER_COLUMNS} FROM runs WHERE status IN ('queued', 'running')"
        )
        dead = [row for row in rows if not owner_alive(*row[1:], now=now)]
        sweep_rows = self._read(f"SELECT id, {OWNER_COLUMNS} FROM sweeps WHERE status = 'running'")
        dead_sweeps = [row[0] for row in sweep_rows if not owner_alive(*row[1:], now=now)]
        if not dead and not dead_sweeps:
            return []
        with self._write() as conn:
            for run_id, _, pid, token, _ in dead:
                # Only if the owner is still the dead one: a live process may have claimed the
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
