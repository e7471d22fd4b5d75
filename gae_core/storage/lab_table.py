"""The ``lab_results`` table: the estimator lab's measurements, kept with the run they measured
(a part of :class:`~gae_core.storage.store.RunStore`). The result itself is JSON written by
:meth:`gae_core.lab.measure.LabResult.to_json`; the store keeps it as text, so storage never
imports the lab."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from gae_core.errors import StoreError
from gae_core.storage.database import Database, dumps, new_id

__all__ = ["LabRecord", "LabTable"]


@dataclass(frozen=True)
class LabRecord:
    """One stored measurement: which run, checkpoints and settings, and a short summary."""

    id: str
    run_id: str
    created_at: float
    policy_step: int
    critic_step: int
    summary: dict[str, Any]


class LabTable(Database):
    """Lab results: saved whole, listed per run, loaded by id."""

    def save_lab_result(
        self,
        run_id: str,
        policy_step: int,
        critic_step: int,
        summary: dict[str, Any],
        result: dict[str, Any],
    ) -> str:
        """Store one measurement of ``run_id``; returns its id."""
        result_id = new_id()
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise StoreError(f"no run {run_id!r} in {self.path}")
            conn.execute(
                "INSERT INTO lab_results (id, run_id, created_at, policy_step, critic_step, "
                "summary, result) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    result_id,
                    run_id,
                    time.time(),
                    int(policy_step),
                    int(critic_step),
                    dumps(summary),
                    dumps(result),
                ),
            )
        return result_id

    def lab_records(self, run_id: str | None = None) -> list[LabRecord]:
        """Stored measurements, newest first (of one run, or of all)."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id else ("", ())
        rows = self._read(
            "SELECT id, run_id, created_at, policy_step, critic_step, summary FROM lab_results "
            f"{where} ORDER BY created_at DESC, rowid DESC",
            params,
        )
        return [LabRecord(*row[:5], json.loads(row[5])) for row in rows]

    def load_lab_result(self, result_id: str) -> dict[str, Any]:
        rows = self._read("SELECT result FROM lab_results WHERE id = ?", (result_id,))
        if not rows:
            raise StoreError(f"no lab result {result_id!r} in {self.path}")
        return json.loads(rows[0][0])
