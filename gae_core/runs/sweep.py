"""Sweeps: every combination of a grid (λ × seed × any config field) as its own run; and the
one way any run trains (a dashboard run is a sweep of one, :mod:`gae_core.runs.manager`).

A coordinating thread in the process that starts the sweep is the only writer to the store: it
claims each trial, hands it to a backend worker (:mod:`~gae_core.runs.pool` local,
:mod:`~gae_core.runs.ray_pool` Ray, picked in :mod:`~gae_core.runs.backends`) and applies the
reports the worker streams back, so a worker on another machine needs no access to the store.

Failures stay local: a worker that dies (killed, out of memory) costs only the trials it held
(one, or the members of its population), each retried once by default from the start (a trial
alone is deterministic per seed; a member may rejoin another population, so its rerun matches in
distribution) and otherwise ended ``interrupted`` with the worker's pid and exit code; the other
trials run to the end. A coordinator killed with -9 leaves its trials owned by a dead process:
the next recovery marks every one of them ``interrupted``; its workers exit when its pipes close.

>>> sweep = start_sweep(RunStore(), TrainConfig(total_steps=50_000),
...                     grid_of(lambdas=[0.9, 0.95, 1.0], seeds=[0, 1, 2]), workers=2)
>>> sweep.progress().fraction        # poll from the UI; sweep.cancel() or sweep.wait()
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gae_core.agent.config import TrainConfig, field_spec
from gae_core.agent.envs import reward_threshold
from gae_core.agent.field_spec import int_problem
from gae_core.errors import ConfigError, StoreError, StoreFull
from gae_core.labels import assignment
from gae_core.runs.backends import Backend, BackendFactory
from gae_core.runs.execute import call_before_thread_shutdown
from gae_core.runs.pool import LocalPool
from gae_core.runs.sinks import Lost, Report, RunDeleted, apply
from gae_core.runs.trials import (
    check_sweep_name,
    checked_name,
    expand_grid,
    grid_of,
    hold_critic_target,
    trial_name,
)
from gae_core.storage.records import ENDED_STATUSES
from gae_core.storage.store import RunStore

__all__ = [
    "Sweep",
    "SweepProgress",
    "cancel_sweep",
    "check_sweep_name",
    "expand_grid",
    "grid_of",
    "hold_critic_target",
    "run_sweep",
    "start_sweep",
    "sweep_progress",
]

log = logging.getLogger(__name__)

_POLL_S = 0.25
_HEARTBEAT_S = 5.0


@dataclass(frozen=True)
class SweepProgress:
    """Where a sweep stands, read from the store (works for sweeps of other processes too)."""

    sweep_id: str
    status: str
    total: int
    counts: dict[str, int]
    env_steps: int
    total_steps: int

    @property
    def done(self) -> int:
        """Trials that have ended, however they ended."""
        return sum(self.counts[s] for s in ENDED_STATUSES)

    @property
    def fraction(self) -> float:
        """Share of the grid's env-step budget spent (ended trials count in full), in [0, 1]."""
        return min(1.0, self.env_steps / self.total_steps) if self.total_steps else 1.0


def sweep_progress(store: RunStore, sweep_id: str) -> SweepProgress:
    """Progress of any sweep in the store."""
    sweep = store.get_sweep(sweep_id)
    runs = store.list_runs(sweep_id=sweep_id)
    counts = store.sweep_status_counts(sweep_id)
    env_steps = total_steps = 0
    for run in runs:
        budget = run.total_steps
        total_steps += budget
        env_steps += budget if run.status in ENDED_STATUSES else min(run.env_steps, budget)
    return SweepProgress(sweep_id, sweep.status, len(runs), counts, env_steps, total_steps)


def cancel_sweep(store: RunStore, sweep_id: str) -> None:
    """Stop a sweep's trials, from any process: queued ones at once, running ones on their next
    flush (its coordinator relays the stop flag); a sweep run in this process is cancelled."""
    for live in [sweep for sweep in list(_LIVE_SWEEPS) if sweep.sweep_id == sweep_id]:
        live.cancel()
    for run in store.list_runs(sweep_id=sweep_id, status=("queued", "running")):
        store.request_stop(run.id)


# -- coordinator ----------------------------------------------------------------------------

_LIVE_SWEEPS: weakref.WeakSet[Sweep] = weakref.WeakSet()
#: At interpreter exit, how long to wait for cancelled sweeps to wind down.
EXIT_JOIN_S = 15.0
#: The most workers a sweep runs at once (trials in flight: processes here, or Ray tasks).
MOST_WORKERS = 256


def _cancel_live_sweeps() -> None:
    """At interpreter exit: cancel running sweeps (the manager's runs too): trials end stopped."""
    sweeps = [sweep for sweep in list(_LIVE_SWEEPS) if not sweep.done]
    for sweep in sweeps:
        sweep.cancel()
    deadline = time.monotonic() + EXIT_JOIN_S
    for sweep in sweeps:
        sweep.wait(max(0.0, deadline - time.monotonic()))


@dataclass
class _Trial:
    run_id: str
    config: TrainConfig
    attempts: int = 0
    status: str = "queued"
    error: str | None = None


class Sweep:
    """Handle on a running sweep and its coordinating thread (:func:`start_sweep`); without a
    ``sweep_id``, the run manager's run, a sweep of one that no stored sweep holds."""

    def __init__(
        self,
        store: RunStore,
        sweep_id: str | None,
        trials: list[tuple[str, TrainConfig]],
        workers: int,
        on_progress: Callable[[SweepProgress], None] | None,
        flush_interval: float,
        retries: int,
        backend: BackendFactory = LocalPool,
    ) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.run_ids = [run_id for run_id, _ in trials]
        self.workers = workers
        self.retries = retries
        self._trials = [_Trial(run_id, config) for run_id, config in trials]
        self._on_progress = on_progress
        self._flush_interval = flush_interval
        self._backend_factory = backend
        self._backend: Backend | None = None
        self._position: dict[int, int] = {}  # trial index → its place in the dispatch order
        self._cancel = threading.Event()
        self._cancelled = False
        self._error: str | None = None
        self.status: str | None = None  # how it ended, as decided (stored unless the disk is full)
        self.error: str | None = None
        # its end, as an event: a Thread.join interrupted by Ctrl-C leaves the thread looking
        # dead on Python 3.11 (is_alive() False while it runs), an Event.wait does not
        self._ended = threading.Event()
        self._thread = threading.Thread(
            target=self._coordinate, name=f"gae-sweep-{sweep_id or self.run_ids[0]}", daemon=True
        )

    def start(self) -> Sweep:
        """Start the coordinator; one still running at interpreter exit is cancelled."""
        call_before_thread_shutdown(_cancel_live_sweeps)
        _LIVE_SWEEPS.add(self)
        self._thread.start()
        return self

    def progress(self) -> SweepProgress:
        return sweep_progress(self.store, self.sweep_id)

    def cancel(self) -> None:
        """Stop pending trials and ask running ones to stop (at once, not at the coordinator's
        next poll); returns at once."""
        self._cancel.set()
        self._stop_running(self._backend)  # read once: the coordinator drops it when it ends

    def outcomes(self) -> dict[str, tuple[str, str | None]]:
        """``{run id: (status, error)}`` of each trial as the coordinator decided it (what the
        store says, unless the disk was too full to write it)."""
        return {t.run_id: (t.status, t.error) for t in self._trials}

    def trial_pids(self) -> dict[str, int]:
        """``{run id: pid}`` of the trials training now (a worker process, or a Ray task's
        process on its node)."""
        backend = self._backend
        if backend is None:
            return {}
        return {self._trials[i].run_id: pid for i, pid in backend.trial_pids().items()}

    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the coordinator to end; True when the sweep has ended."""
        return self._ended.wait(timeout)

    # -- the coordinating thread ------------------------------------------------------------

    def _report(self, last: SweepProgress | None) -> SweepProgress | None:
        if self._on_progress is None:
            return None
        progress = self.progress()
        try:
            self._on_progress(progress) if progress != last else None
        except Exception:  # a UI callback must not take the sweep down
            log.exception("sweep %s: progress callback failed", self.sweep_id)
        return progress

    def _coordinate(self) -> None:
        status, full = "failed", False
        try:
            status = self._drive()
        except Exception as exc:  # a full disk: one line naming it, no traceback
            full = isinstance(exc, StoreFull)
            if full:  # a sweep says so; a run's own reason is the full disk
                self._error = f"the sweep stopped: {exc}" if self.sweep_id else str(exc)
            else:
                self._error = traceback.format_exc()
            if self.sweep_id is not None or not full:  # a run's full disk: its caller says so
                who = f"sweep {self.sweep_id}" if self.sweep_id else f"run {self.run_ids[0]}"
                log.error("%s failed: %s", who, self._error)
        finally:
            # Nothing stays queued or running (on a full disk, recovery marks them once it can)
            for trial in self._trials:
                if trial.status in ("queued", "running"):
                    trial.status = "failed" if full else "interrupted"
                    trial.error = self._error if full or self.sweep_id is None else (
                        "the sweep ended before this trial did")  # fmt: skip
                    with contextlib.suppress(StoreError):
                        self.store.finish_run(trial.run_id, trial.status, trial.error)
            self.status, self.error = status, self._error
            with contextlib.suppress(StoreError):
                if self.sweep_id is not None:
                    self.store.finish_sweep(self.sweep_id, status, self._error)
            try:
                self._report(None)
            finally:
                self._ended.set()

    def _drive(self) -> str:
        backend = self._backend = self._backend_factory(
            self.workers, len(self._trials), self._flush_interval
        )
        last_report: SweepProgress | None = None
        last_heartbeat = 0.0
        try:
            pending = deque(self._plan(backend))
            while pending or any(t.status == "running" for t in self._trials):
                if self._cancel.is_set() and not self._cancelled:
                    self._cancel_all(backend, pending)
                while pending and backend.can_take(
                    self._trials[pending[0]].config.to_dict(), pending[0]
                ):
                    self._dispatch(backend, pending.popleft())
                for event in backend.events(_POLL_S):
                    self._handle(backend, event, pending)
                now = time.monotonic()
                if self.sweep_id is not None and now - last_heartbeat >= _HEARTBEAT_S:
                    self.store.heartbeat_sweep(self.sweep_id)
                    last_heartbeat = now
                last_report = self._report(last_report)
        finally:
            backend.close()
            self._backend = None  # its workers' handles go with it (a manager keeps its runs)
        return self._final_status()

    def _plan(self, backend: Backend) -> list[int]:
        """The backend's order to submit the trials in (``RuntimeError`` if it is not theirs)."""
        count = len(self._trials)
        order = list(backend.dispatch_order([t.config.to_dict() for t in self._trials]))
        if sorted(order) != list(range(count)):
            raise RuntimeError(f"backend {backend.name}: its dispatch order is not the trials'")
        self._position = {index: place for place, index in enumerate(order)}
        return order

    def _dispatch(self, backend: Backend, index: int) -> None:
        trial = self._trials[index]
        # The coordinator owns every running trial: if it dies, recovery marks them interrupted.
        if not self.store.claim_run(trial.run_id):
            trial.status = self.store.get_run(trial.run_id).status  # stopped before it started
            return
        trial.status = "running"
        backend.submit(index, trial.run_id, trial.config.to_dict())

    def _handle(self, backend: Backend, event: Report | Lost, pending: deque[int]) -> None:
        index = event.index
        trial = self._trials[index]
        if trial.status != "running":
            return  # a late message of a trial that ended or was deleted
        if isinstance(event, Lost):
            self._retry_or_interrupt(index, event.why, pending)
            return
        try:
            stop = apply(self.store, trial.run_id, event)
            if event.kind == "finish":  # once stored: an end the disk refused ends it failed
                trial.status, trial.error = event.status, event.error
            if event.kind == "flush" and (stop or self._cancelled):
                backend.stop(index)
        except RunDeleted:  # deleted from the UI or the CLI
            trial.status = "deleted"
            backend.stop(index)

    def _retry_or_interrupt(self, index: int, why: str, pending: deque[int]) -> None:
        """A worker died mid-trial: start the trial again from scratch, or end it
        ``interrupted`` once its retries are used up."""
        trial = self._trials[index]
        log.warning("sweep %s: trial %s: %s", self.sweep_id, trial.run_id, why)
        if trial.attempts < self.retries and not self._cancelled:
            trial.attempts += 1
            trial.status = "queued"
            self.store.reset_run(trial.run_id, f"attempt {trial.attempts + 1}: the previous {why}")
            # back in dispatch order (pending is): a lost population's members queue up again
            # in the order they had, ahead of the trials never started
            place = self._position.__getitem__
            pending.insert(bisect.bisect_left(pending, place(index), key=place), index)
        else:
            trial.status, trial.error = "interrupted", f"{why}; retries used up"
            self.store.finish_run(trial.run_id, "interrupted", trial.error)

    def _cancel_all(self, backend: Backend, pending: deque[int]) -> None:
        self._cancelled = True
        for index in pending:
            self.store.request_stop(self._trials[index].run_id)
            self._trials[index].status = "stopped"
        pending.clear()
        self._stop_running(backend)

    def _stop_running(self, backend: Backend | None) -> None:
        for index, trial in enumerate(self._trials):
            if trial.status == "running" and backend is not None:
                backend.stop(index)

    def _final_status(self) -> str:
        """``cancelled`` if the sweep itself was cancelled (:meth:`cancel`) or every trial was
        stopped; else ``failed`` if none finished and some failed, else ``finished``. A trial
        stopped alone (``stop RUN_ID``) is no failure: ``self._error`` counts the stopped ones."""
        live = [t for t in self._trials if t.status != "deleted"]
        stopped = [t for t in live if t.status == "stopped"]
        if self._cancelled or (live and len(stopped) == len(live)):
            return "cancelled"
        broken = [t for t in live if t.status not in ("finished", "stopped")]
        parts = [f"{len(stopped)} of {len(live)} trials stopped by request"] if stopped else []
        if broken:
            names = ", ".join(f"{t.run_id} ({assignment('lambda_', t.config.lambda_)} "
                              f"{assignment('seed', t.config.seed)}): {t.status}"
                              for t in broken[:5])  # fmt: skip
            names += f" and {len(broken) - 5} more" if len(broken) > 5 else ""
            parts.insert(0, f"{len(broken)} of {len(live)} trials did not finish: {names}")
        self._error = "; ".join(parts) or None
        return "failed" if broken and not any(t.status == "finished" for t in live) else "finished"


def start_sweep(
    store: RunStore,
    base: TrainConfig,
    grid: dict[str, Sequence[Any]],
    *,
    workers: int | None = None,
    name: str | None = None,
    on_progress: Callable[[SweepProgress], None] | None = None,
    flush_interval: float = 1.0,
    retries: int = 1,
    backend: BackendFactory = LocalPool,
) -> Sweep:
    """Create the sweep and its trials (``queued``) in the store and start it; returns at once.
    ``workers`` defaults to the CPU count, capped at the number of trials; ``retries``: how
    often a trial whose worker died is started again; ``backend(workers, trials,
    flush_interval)`` builds where trials train; ``on_progress`` is called from the coordinator
    whenever the progress changes. Bad grid values raise ``ConfigError`` before anything is
    created."""
    configs = expand_grid(base, grid)
    if workers is None:
        workers = os.cpu_count() or 1
    problem = int_problem("workers", workers, 1, MOST_WORKERS)
    if problem or (problem := int_problem("retries", retries, 0, 10)):
        raise ConfigError(problem)
    workers = min(workers, len(configs))
    if name:  # refused before anything is stored
        name = checked_name(name, configs, grid)
    grid_json = {field_spec(n).name: list(v) for n, v in grid.items()}
    sweep_id = store.create_sweep(grid_json, base.to_dict(), name=name)
    prefix = store.get_sweep(sweep_id).name
    trials = []
    for config in configs:
        run_id = store.create_run(
            config.to_dict(),
            name=trial_name(prefix, config, grid),
            sweep_id=sweep_id,
            reward_threshold=reward_threshold(config.env_id),
        )
        trials.append((run_id, config))
    return Sweep(
        store, sweep_id, trials, workers, on_progress, flush_interval, retries, backend
    ).start()


def run_sweep(
    store: RunStore, base: TrainConfig, grid: dict[str, Sequence[Any]], **options: Any
) -> SweepProgress:
    """:func:`start_sweep` (same options) and wait for it; Ctrl-C cancels the sweep and waits for
    the trials to stop (their data is kept)."""
    sweep = start_sweep(store, base, grid, **options)
    try:
        while not sweep.wait(0.2):
            pass
    except KeyboardInterrupt:
        sweep.cancel()
        while not sweep.wait(0.2):
            pass
    return sweep.progress()
