"""Local sweeps: a λ × seed grid (plus any other config field) in worker processes.

Every trial is a normal run in the store, tagged with the sweep's id; the sweep has its own row
(id, grid JSON, status). Trials run in a ``ProcessPoolExecutor`` with the ``spawn`` start method
(no forked torch or SQLite state), each worker with one torch thread, so ``workers`` trials train
truly in parallel. A coordinating thread in the calling process feeds the pool, refreshes the
sweep's heartbeat, reports progress and handles cancellation: pending trials are marked
``stopped`` before they start, running ones are asked to stop through the store (each worker
sees the flag on its next flush, within about a second).

>>> sweep = start_sweep(RunStore(), TrainConfig(total_steps=50_000),
...                     grid_of(lambdas=[0.9, 0.95, 1.0], seeds=[0, 1, 2]), workers=2)
>>> sweep.progress().fraction        # poll from the UI
>>> sweep.cancel()                   # or sweep.wait()
"""

from __future__ import annotations

import concurrent.futures as cf
import concurrent.futures.process  # noqa: F401  (see _install_exit_hook)
import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gae_core.config import ConfigError, TrainConfig
from gae_core.manager import execute_run, reward_threshold
from gae_core.store import RunStore

__all__ = [
    "Sweep",
    "SweepProgress",
    "cancel_sweep",
    "expand_grid",
    "grid_of",
    "run_sweep",
    "start_sweep",
    "sweep_progress",
]

log = logging.getLogger(__name__)

TERMINAL = ("stopped", "finished", "failed", "interrupted")
_POLL_S = 0.25


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
        return sum(self.counts[s] for s in TERMINAL)

    @property
    def fraction(self) -> float:
        """Share of the whole grid's env-step budget spent (ended trials count in full)."""
        return min(1.0, self.env_steps / self.total_steps) if self.total_steps else 1.0


def grid_of(
    lambdas: Sequence[float] | None = None,
    seeds: Sequence[int] | None = None,
    **fields: Sequence[Any],
) -> dict[str, list[Any]]:
    """``{"lambda_": lambdas, "seed": seeds, **fields}`` without the empty entries."""
    grid: dict[str, list[Any]] = {}
    if lambdas is not None:
        grid["lambda_"] = list(lambdas)
    if seeds is not None:
        grid["seed"] = list(seeds)
    grid.update({name: list(values) for name, values in fields.items()})
    return grid


def expand_grid(base: TrainConfig, grid: dict[str, Sequence[Any]]) -> list[TrainConfig]:
    """Every combination of the grid's values applied to ``base`` (last key varies fastest).

    Raises ``ConfigError`` for an unknown field, an empty value list or a bad value, naming the
    field — before anything is started.
    """
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for name, values in grid.items():
        if name not in known:
            raise ConfigError(f"sweep grid: unknown config field {name!r}; known: {sorted(known)}")
        if len(values) == 0:
            raise ConfigError(f"sweep grid: {name} needs at least one value")
    names = list(grid)
    configs = []
    for combo in itertools.product(*(list(grid[n]) for n in names)):
        configs.append(dataclasses.replace(base, **dict(zip(names, combo, strict=True))))
    if not configs:
        configs = [base]
    return configs


def _trial_name(prefix: str, config: TrainConfig, grid: dict[str, Sequence[Any]]) -> str:
    labels = {"lambda_": "λ", "gamma": "γ"}
    parts = [f"{labels.get(n, n)}={getattr(config, n)}" for n in grid]
    return " ".join([prefix, *parts])


def sweep_progress(store: RunStore, sweep_id: str) -> SweepProgress:
    """Progress of any sweep in the store."""
    sweep = store.get_sweep(sweep_id)
    runs = store.list_runs(sweep_id=sweep_id)
    counts = store.sweep_status_counts(sweep_id)
    env_steps = total_steps = 0
    for run in runs:
        budget = int(run.config.get("total_steps", 0))
        total_steps += budget
        env_steps += budget if run.status in TERMINAL else min(run.env_steps, budget)
    return SweepProgress(sweep_id, sweep.status, len(runs), counts, env_steps, total_steps)


def cancel_sweep(store: RunStore, sweep_id: str) -> None:
    """Stop a sweep's trials, from any process: queued ones at once, running ones via the store."""
    for run in store.list_runs(sweep_id=sweep_id, status=("queued", "running")):
        store.request_stop(run.id)


# -- worker side ----------------------------------------------------------------------------

_WORKER_STORE: RunStore | None = None
_PARENT_PID: int | None = None
#: How often a worker checks that the coordinating process still lives.
ORPHAN_CHECK_S = 0.5


def _init_worker(data_dir: str) -> None:
    """Pool initializer: one torch thread per worker (the workers are the parallelism)."""
    global _WORKER_STORE, _PARENT_PID
    import torch

    _PARENT_PID = os.getppid()
    # Ctrl-C in a terminal reaches the whole process group; the coordinator turns it into a
    # cancel through the store, so a worker must not die of it mid-write.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _WORKER_STORE = RunStore(data_dir)


def _watch_parent(stop: threading.Event, orphaned: threading.Event, done: threading.Event) -> None:
    while not done.wait(ORPHAN_CHECK_S):
        if os.getppid() != _PARENT_PID:
            orphaned.set()
            stop.set()
            return


def _run_trial(run_id: str, config: dict[str, Any], flush_interval: float) -> dict[str, Any]:
    """One trial in a worker. If the coordinating process dies (killed), the trial stops at its
    next update, is marked ``interrupted`` and the worker exits: no orphan trains on."""
    store = _WORKER_STORE
    assert store is not None, "worker not initialised"
    stop, orphaned, done = threading.Event(), threading.Event(), threading.Event()
    watchdog = threading.Thread(
        target=_watch_parent, args=(stop, orphaned, done), name="gae-sweep-watchdog", daemon=True
    )
    watchdog.start()
    try:
        outcome = execute_run(
            store, run_id, TrainConfig.from_dict(config), stop, flush_interval=flush_interval
        )
    finally:
        done.set()
    if orphaned.is_set():
        store.finish_run(
            run_id,
            "interrupted",
            f"the sweep's coordinating process died; stopped at env step {outcome.env_steps}",
        )
        store.close()
        os._exit(1)
    return dataclasses.asdict(outcome)


# -- coordinator ----------------------------------------------------------------------------

_LIVE_SWEEPS: weakref.WeakSet[Sweep] = weakref.WeakSet()
#: At interpreter exit, how long to wait for cancelled sweeps to wind down.
EXIT_JOIN_S = 15.0
_EXIT_HOOK_INSTALLED = False


def _cancel_live_sweeps() -> None:
    """At interpreter exit: cancel running sweeps so their trials end ``stopped``.

    Registered with ``threading._register_atexit``, which runs before ``concurrent.futures``
    joins its pools (it would otherwise wait for every trial to finish its budget).
    """
    sweeps = [sweep for sweep in list(_LIVE_SWEEPS) if not sweep.done]
    for sweep in sweeps:
        sweep.cancel()
        try:
            cancel_sweep(sweep.store, sweep.sweep_id)
        except Exception:
            log.exception("sweep %s: could not cancel at exit", sweep.sweep_id)
    # Let the coordinators record the end (workers stop within about a second).
    deadline = time.monotonic() + EXIT_JOIN_S
    for sweep in sweeps:
        sweep.wait(max(0.0, deadline - time.monotonic()))


def _install_exit_hook() -> None:
    # Exit hooks run last-registered first. concurrent.futures.process registers its own (join
    # every pool) when it is imported — at the top of this module, so before this one, which
    # therefore runs first and lets the pools wind down instead of waiting out every trial.
    global _EXIT_HOOK_INSTALLED
    if _EXIT_HOOK_INSTALLED:
        return
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_cancel_live_sweeps)
        except RuntimeError:  # already shutting down
            return
    _EXIT_HOOK_INSTALLED = True


class Sweep:
    """Handle on a running sweep; see :func:`start_sweep`."""

    def __init__(
        self,
        store: RunStore,
        sweep_id: str,
        trials: list[tuple[str, TrainConfig]],
        workers: int,
        on_progress: Callable[[SweepProgress], None] | None,
        flush_interval: float,
    ) -> None:
        self.store = store
        self.sweep_id = sweep_id
        self.run_ids = [run_id for run_id, _ in trials]
        self.workers = workers
        self._trials = trials
        self._on_progress = on_progress
        self._flush_interval = flush_interval
        self._cancel = threading.Event()
        self._error: str | None = None
        self._thread = threading.Thread(
            target=self._coordinate, name=f"gae-sweep-{sweep_id}", daemon=True
        )

    def progress(self) -> SweepProgress:
        return sweep_progress(self.store, self.sweep_id)

    def cancel(self) -> None:
        """Stop pending trials and ask running ones to stop; returns at once."""
        self._cancel.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Join the coordinator; True when the sweep has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _report(self, last: SweepProgress | None) -> SweepProgress | None:
        if self._on_progress is None:
            return None
        progress = self.progress()
        if progress != last:
            try:
                self._on_progress(progress)
            except Exception:
                log.exception("sweep %s: progress callback failed", self.sweep_id)
        return progress

    def _coordinate(self) -> None:
        status = "failed"
        try:
            status = self._drive_pool()
        except Exception:
            self._error = traceback.format_exc()
            log.error("sweep %s failed: %s", self.sweep_id, self._error)
        finally:
            # Whatever did not run (pool broken, coordinator crashed) must not stay "queued".
            self.store.recover()
            for run in self.store.list_runs(sweep_id=self.sweep_id, status="queued"):
                self.store.finish_run(run.id, "interrupted", "the sweep ended before it started")
            self.store.finish_sweep(self.sweep_id, status, self._error)
            self._report(None)

    def _drive_pool(self) -> str:
        context = multiprocessing.get_context("spawn")
        last: SweepProgress | None = None
        cancelled = False
        with cf.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(str(self.store.data_dir),),
        ) as pool:
            futures = {
                pool.submit(_run_trial, run_id, config.to_dict(), self._flush_interval): run_id
                for run_id, config in self._trials
            }
            pending = set(futures)
            while pending:
                finished, pending = cf.wait(pending, timeout=_POLL_S)
                for future in finished:
                    if future.cancelled():
                        continue
                    exc = future.exception()
                    if exc is not None:  # a worker died (BrokenProcessPool) or the store failed
                        self._error = f"trial {futures[future]}: {type(exc).__name__}: {exc}"
                if self._cancel.is_set() and not cancelled:
                    cancelled = True
                    for future in pending:
                        future.cancel()
                    cancel_sweep(self.store, self.sweep_id)
                self.store.heartbeat_sweep(self.sweep_id)
                last = self._report(last)
        counts = self.store.sweep_status_counts(self.sweep_id)
        if self._error is not None:
            return "failed"
        if cancelled or counts["stopped"] > 0:
            return "cancelled"
        return "finished"


def start_sweep(
    store: RunStore,
    base: TrainConfig,
    grid: dict[str, Sequence[Any]],
    *,
    workers: int | None = None,
    name: str | None = None,
    on_progress: Callable[[SweepProgress], None] | None = None,
    flush_interval: float = 1.0,
) -> Sweep:
    """Create the sweep and its trials (``queued``) in the store and start it; returns at once.

    ``workers`` defaults to the CPU count, capped at the number of trials. ``on_progress`` is
    called from the coordinating thread whenever the progress changes (about 4 times a second
    at most). Bad grid values raise ``ConfigError`` before anything is created.
    """
    configs = expand_grid(base, grid)
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    workers = min(workers, len(configs))
    grid_json = {n: list(v) for n, v in grid.items()}
    sweep_id = store.create_sweep(grid_json, base.to_dict(), name=name)
    prefix = name or f"sweep-{sweep_id}"
    trials = []
    for config in configs:
        run_id = store.create_run(
            config.to_dict(),
            name=_trial_name(prefix, config, grid),
            sweep_id=sweep_id,
            reward_threshold=reward_threshold(config.env_id),
        )
        trials.append((run_id, config))
    sweep = Sweep(store, sweep_id, trials, workers, on_progress, flush_interval)
    _install_exit_hook()
    _LIVE_SWEEPS.add(sweep)
    sweep._thread.start()
    return sweep


def run_sweep(
    store: RunStore,
    base: TrainConfig,
    grid: dict[str, Sequence[Any]],
    *,
    workers: int | None = None,
    name: str | None = None,
    on_progress: Callable[[SweepProgress], None] | None = None,
    flush_interval: float = 1.0,
) -> SweepProgress:
    """:func:`start_sweep` and wait for it; Ctrl-C cancels the sweep and waits for the trials to
    stop (their data is kept)."""
    sweep = start_sweep(
        store,
        base,
        grid,
        workers=workers,
        name=name,
        on_progress=on_progress,
        flush_interval=flush_interval,
    )
    try:
        while not sweep.wait(0.2):
            pass
    except KeyboardInterrupt:
        sweep.cancel()
        while not sweep.wait(0.2):
            pass
    return sweep.progress()


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass (tests, scripts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
