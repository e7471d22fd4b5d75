"""The ``sweeps`` table's reads and writes, a part of :class:`~gae_core.storage.store.RunStore`."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from gae_core.errors import StoreError
from gae_core.inert import clean_name
from gae_core.storage.database import Database, dumps, new_id
from gae_core.storage.ownership import OWNER_COLUMNS
from gae_core.storage.records import STATUSES, SWEEP_STATUSES, SweepRecord

__all__ = ["SweepTable"]

#: The ``sweeps`` columns a :class:`SweepRecord` holds, in the order of its fields.
_SWEEP_COLUMNS = ", ".join(f.name for f in dataclasses.fields(SweepRecord))


class SweepTable(Database):
    """Sweeps: a grid, its base config and status; the trials are runs with its ``sweep_id``."""

    def create_sweep(
        self, grid: dict[str, list[Any]], base_config: dict[str, Any], *, name: str | None = None
    ) -> str:
        sweep_id = new_id()
        name = clean_name(name, field="sweep name") if name else f"sweep-{sweep_id}"
        now = time.time()
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO sweeps (id, name, grid, base_config, status, created_at, "
                f"{OWNER_COLUMNS}) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (sweep_id, name, dumps(grid), dumps(base_config), now, *self.owner.row(now)),
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
        sweep_id, name, grid, base_config, *rest = row
        try:
            grid, base_config = json.loads(grid), json.loads(base_config)
        except (TypeError, ValueError):
            grid, base_config = {}, {}
        return SweepRecord(sweep_id, name, grid, base_config, *rest)

    def get_sweep(self, sweep_id: str) -> SweepRecord:
        rows = self._read(f"SELECT {_SWEEP_COLUMNS} FROM sweeps WHERE id = ?", (sweep_id,))
        if not rows:
            raise StoreError(f"no sweep {sweep_id!r} in {self.path}")
        return self._sweep_from_row(rows[0])

    def resolve_sweep_id(self, text: str) -> str:
        """The sweep id ``text`` names (:meth:`_resolve_id`)."""
        return self._resolve_id("sweeps", "sweep", text)

    def list_sweeps(self) -> list[SweepRecord]:
        rows = self._read(
            f"SELECT {_SWEEP_COLUMNS} FROM sweeps ORDER BY created_at DESC, rowid DESC"
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
