"""The run store's records: runs, sweeps and metric rows as frozen dataclasses, and the statuses
they can be in. Plain data: no database, no agent."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gae_core.outcome import RunSummary

__all__ = [
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "NOT_STARTED",
    "STATUSES",
    "SWEEP_STATUSES",
    "MetricRow",
    "RunRecord",
    "SweepRecord",
]

STATUSES = ("queued", "running", "stopped", "finished", "failed", "interrupted")
ACTIVE_STATUSES = ("queued", "running")
ENDED_STATUSES = ("stopped", "finished", "failed", "interrupted")
#: How tables and counts say "stopped" of a run that never trained a step (a sweep's trial
#: still queued when it was cancelled).
NOT_STARTED = "not started"
SWEEP_STATUSES = ("running", "finished", "cancelled", "failed", "interrupted")


@dataclass(frozen=True)
class RunRecord:
    """One row of the ``runs`` table.

    ``damaged`` says why a row could not be read whole (its config is not valid JSON, say); such
    a run is listed, with an empty config, so the rest of the store stays usable.
    """

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
    damaged: str | None = None
    #: The code it was created with (:func:`gae_core.version.source_version` in the creating
    #: process, which local workers share; a Ray node trains with what it has installed); None
    #: for a run stored before runs recorded it.
    code: dict[str, Any] | None = None

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

    @property
    def never_started(self) -> bool:
        """Stopped before it trained a step (a sweep's trial still queued when it was
        cancelled): "stopped" alone would read as if it had trained."""
        return self.status == "stopped" and self.env_steps == 0

    @property
    def shown_status(self) -> str:
        """The status as tables and counts say it: :data:`NOT_STARTED` for
        :attr:`never_started`."""
        return NOT_STARTED if self.never_started else self.status

    @property
    def total_steps(self) -> int:
        return int(self.config.get("total_steps", 0) or 0)


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
