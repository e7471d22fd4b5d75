"""The run store's SQLite schema and its migrations.

``PRAGMA user_version`` holds the schema version. A new store gets the whole schema; an older
one is migrated step by step inside the opening transaction; a newer one is refused (this code
cannot know what the newer columns mean).
"""

from __future__ import annotations

import sqlite3

from gae_core.errors import StoreError
from gae_core.storage.records import STATUSES, SWEEP_STATUSES

__all__ = ["SCHEMA_VERSION", "migrate"]

SCHEMA_VERSION = 4

_SCHEMA_V1 = f"""
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

# v2: a run says whether it stayed solved (gae_core.outcome), full windows only.
_V1_TO_V2 = """
ALTER TABLE runs ADD COLUMN fell_below_at_step INTEGER;
ALTER TABLE runs ADD COLUMN stayed_solved INTEGER;
"""

# v3: the estimator lab's results, listed per run (gae_core.lab).
_V2_TO_V3 = """
CREATE TABLE lab_results (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    created_at REAL NOT NULL,
    policy_step INTEGER NOT NULL,
    critic_step INTEGER NOT NULL,
    summary TEXT NOT NULL,
    result TEXT NOT NULL
);
CREATE INDEX lab_results_run ON lab_results(run_id);
"""

# v4: the code a run was created (and trained) with: gae_core.version.source_version()'s JSON.
_V3_TO_V4 = """
ALTER TABLE runs ADD COLUMN code TEXT;
"""

_MIGRATIONS = {1: _V1_TO_V2, 2: _V2_TO_V3, 3: _V3_TO_V4}


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript would COMMIT the surrounding transaction; run statement by statement.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def refuse_newer(path: object, version: int) -> None:
    """``StoreError`` naming ``path`` when its schema is newer than this code reads (writing or
    reading it: this code cannot know what the newer columns mean)."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}; this gae_core reads up to "
            f"{SCHEMA_VERSION}. Upgrade gae_core or use another --data-dir."
        )


def migrate(conn: sqlite3.Connection, path: object) -> int:
    """Bring the database to :data:`SCHEMA_VERSION` inside the caller's transaction; returns the
    version found. ``StoreError`` naming ``path`` for a newer schema."""
    found = version = conn.execute("PRAGMA user_version").fetchone()[0]
    refuse_newer(path, version)
    if version == 0:
        _run_script(conn, _SCHEMA_V1)
        version = 1
    while version < SCHEMA_VERSION:
        _run_script(conn, _MIGRATIONS[version])
        version += 1
    if found != SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return found
