"""Where a run's data goes: the :class:`RunSink` interface the run loop writes through, and the
sink that writes a run store directly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gae_core.errors import StoreError
from gae_core.outcome import RunSummary
from gae_core.runs.store import RunStore

__all__ = ["MetricRows", "RunDeleted", "RunSink", "StoreSink"]

#: Metric rows as the store takes them: ``(key, env step, wall seconds, value)``.
MetricRows = list[tuple[str, int, float, float]]


class RunDeleted(Exception):
    """The run was deleted while it trained (``delete --force``): it ends as ``deleted``."""


class RunSink(Protocol):
    """Where a run's data goes. ``flush`` returns whether a stop was requested; any method may
    raise :class:`RunDeleted` when the run no longer exists."""

    def claim(self) -> bool: ...

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool: ...

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None: ...

    def finish(self, status: str, error: str | None) -> None: ...


class StoreSink:
    """A sink that writes straight into a run store."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def claim(self) -> bool:
        return self.store.claim_run(self.run_id)

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool:
        try:
            return self.store.flush(self.run_id, rows, env_steps=env_steps, summary=summary)
        except StoreError:
            if not self.store.run_exists(self.run_id):
                raise RunDeleted(self.run_id) from None
            raise

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None:
        if not self.store.run_exists(self.run_id):
            raise RunDeleted(self.run_id)
        self.store.save_checkpoint(self.run_id, env_step, blob, trajectories)

    def finish(self, status: str, error: str | None) -> None:
        self.store.finish_run(self.run_id, status, error)
