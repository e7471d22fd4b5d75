"""Keeping the run store small: thin out old checkpoints, drop orphaned rows, give the space back
(a part of :class:`~gae_core.storage.store.RunStore`).

Checkpoints (with their recorded trajectories) are most of a store's size. Thinning keeps every
N-th checkpoint of each ended run and always its last one, so the explorer and the lab keep an
early, a middle and the final policy; active runs are never touched.
"""

from __future__ import annotations

import itertools
import sqlite3

from gae_core.storage.database import Database

__all__ = ["RetentionTable"]


class RetentionTable(Database):
    """Retention operations; each is one transaction and returns how many rows it removed."""

    def thin_checkpoints(self, keep_every: int) -> int:
        """Keep every ``keep_every``-th checkpoint (by step, from the first) and the last one of
        every ended run; delete the others with their trajectories."""
        if isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 1:
            raise ValueError(f"keep_every must be an integer >= 1, got {keep_every!r}")
        drop = []
        with self._write() as conn:
            rows = conn.execute(
                "SELECT run_id, env_step FROM checkpoints WHERE run_id IN (SELECT id FROM runs "
                "WHERE status NOT IN ('queued', 'running')) ORDER BY run_id, env_step"
            ).fetchall()
            for run_id, run_rows in itertools.groupby(rows, key=lambda row: row[0]):
                steps = [step for _, step in run_rows]
                drop += [(run_id, s) for i, s in enumerate(steps[:-1]) if i % keep_every != 0]
            for table in ("trajectories", "checkpoints"):
                conn.executemany(f"DELETE FROM {table} WHERE run_id = ? AND env_step = ?", drop)
        return len(drop)

    def drop_orphans(self) -> int:
        """Delete metrics, checkpoints, trajectories and lab results whose run no longer exists
        (stores written without foreign keys on can hold them)."""
        removed = 0
        with self._write() as conn:
            for table in ("trajectories", "checkpoints", "metrics", "lab_results"):
                cursor = conn.execute(
                    f"DELETE FROM {table} WHERE run_id NOT IN (SELECT id FROM runs)"
                )
                removed += cursor.rowcount
        return removed

    def vacuum(self) -> int:
        """Give deleted space back to the file system; returns the bytes saved."""
        before = self.size_bytes()
        with self._lock:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._conn.execute("VACUUM")
            except sqlite3.Error as exc:  # VACUUM needs room for a copy of the database
                raise self._refused(exc, f"cannot vacuum {self.path}: {exc}") from None
        return before - self.size_bytes()
