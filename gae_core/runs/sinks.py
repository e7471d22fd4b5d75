"""What a run reports and where it goes: the one message type (:class:`Report`), the one
function that applies a report to the store (:func:`apply`), and the sink the run loop writes
through: :class:`ProxySink` hands each report to a transport (a thread's queue, a pipe, a Ray
inbox) whose other end, the sweep's coordinator, applies it. Whatever the transport, a report
reaches the store through :func:`apply` alone, which is also the one owner of "was the run
deleted?"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gae_core.errors import StoreError
from gae_core.outcome import RunSummary
from gae_core.storage.store import RunStore

__all__ = ["Lost", "MetricRows", "ProxySink", "Report", "RunDeleted", "RunSink", "apply"]

#: Metric rows as the store takes them: ``(key, env step, wall seconds, value)``.
MetricRows = list[tuple[str, int, float, float]]


class RunDeleted(Exception):
    """The run was deleted while it trained (``delete --force``): it ends as ``deleted``."""


@dataclass(frozen=True)
class Report:
    """One message of a run (trial ``index`` of its sweep, 0 alone) to the store's writer:
    ``flush`` (metric ``rows``, the run's ``env_steps`` and return ``summary``),
    ``checkpoint`` (``blob`` at ``env_steps``, with recorded ``trajectories``) or ``finish``
    (``status`` and ``error``). Picklable, so any transport carries it as it is."""

    kind: str
    index: int
    rows: tuple = ()
    env_steps: int = 0
    summary: RunSummary | None = None
    blob: bytes = b""
    trajectories: tuple[bytes, ...] = ()
    status: str | None = None
    error: str | None = None

    @classmethod
    def flush(cls, index: int, rows: MetricRows, env_steps: int, summary: RunSummary) -> Report:
        return cls("flush", index, tuple(rows), env_steps, summary)

    @classmethod
    def checkpoint(
        cls, index: int, env_step: int, blob: bytes, trajectories: Sequence[bytes]
    ) -> Report:
        return cls("checkpoint", index, env_steps=env_step, blob=blob,
                   trajectories=tuple(trajectories))  # fmt: skip

    @classmethod
    def finish(cls, index: int, status: str, error: str | None) -> Report:
        return cls("finish", index, status=status, error=error)


@dataclass(frozen=True)
class Lost:
    """A backend's word that trial ``index``'s worker (process, Ray task) died mid-trial."""

    index: int
    why: str


def apply(store: RunStore, run_id: str, report: Report) -> bool:
    """Write ``report`` of run ``run_id`` into ``store``; whether a stop was requested (a
    flush's answer). :class:`RunDeleted` when the run no longer exists."""
    try:
        if report.kind == "flush":
            return store.flush(run_id, list(report.rows), env_steps=report.env_steps,
                               summary=report.summary)  # fmt: skip
        if report.kind == "checkpoint":
            if not store.run_exists(run_id):
                raise RunDeleted(run_id)
            store.save_checkpoint(run_id, report.env_steps, report.blob, report.trajectories)
        elif report.kind == "finish":
            store.finish_run(run_id, report.status, report.error)
        else:
            raise ValueError(f"unknown report kind {report.kind!r}")
    except StoreError:
        if not store.run_exists(run_id):
            raise RunDeleted(run_id) from None
        raise
    return False


class RunSink(Protocol):
    """Where a run's data goes. ``flush`` returns whether a stop was requested; any method may
    raise :class:`RunDeleted` when the run no longer exists."""

    def claim(self) -> bool: ...

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool: ...

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None: ...

    def finish(self, status: str, error: str | None) -> None: ...


class ProxySink:
    """A sink for a run whose store writer is elsewhere: every call becomes a :class:`Report`
    handed to ``send(report, urgent)`` (``urgent`` for a run's end, which a batching transport
    delivers at once); a stop requested by the writer (a cancel, ``stop``, a deleted run) is
    read through ``stopped()``. The writer claimed the run before sending it, so :meth:`claim`
    is always true."""

    def __init__(
        self, index: int, send: Callable[[Report, bool], None], stopped: Callable[[], bool]
    ) -> None:
        self.index, self.send, self.stopped = index, send, stopped

    def claim(self) -> bool:
        return True

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool:
        self.send(Report.flush(self.index, rows, env_steps, summary), False)
        return bool(self.stopped())

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None:
        self.send(Report.checkpoint(self.index, env_step, blob, trajectories), False)

    def finish(self, status: str, error: str | None) -> None:
        self.send(Report.finish(self.index, status, error), True)
