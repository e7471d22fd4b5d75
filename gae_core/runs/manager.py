"""Background training runs: one daemon thread per run, a stop event each, all data in the store.

Each thread runs :func:`~gae_core.runs.execute.execute_run` with a
:class:`~gae_core.runs.execute.StoreSink`. The manager also owns the store's recovery schedule:
every ``recover_every_s`` it marks runs whose owner process died (a CLI run killed with -9) as
``interrupted``, so reads of the store never have side effects.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import weakref
from typing import Any

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.errors import StoreError
from gae_core.runs.child import RunProcess
from gae_core.runs.execute import (
    RunOutcome,
    StoreSink,
    call_before_thread_shutdown,
    default_run_name,
    execute_run,
)
from gae_core.storage.store import RunStore

__all__ = ["RunManager"]

log = logging.getLogger(__name__)


_LIVE_MANAGERS: weakref.WeakSet[RunManager] = weakref.WeakSet()
_ENDED = threading.Event()  # the stop event of a run whose process has ended: setting it is moot
#: At interpreter exit, how long to wait for stopped runs to close themselves.
EXIT_JOIN_S = 3.0


def _shutdown_live_managers() -> None:
    """At interpreter exit: stop every run so it ends ``stopped`` with its data, instead of
    being cut off mid-update and found ``interrupted`` later."""
    managers = list(_LIVE_MANAGERS)
    for manager in managers:
        manager.stop_all()
    deadline = time.monotonic() + EXIT_JOIN_S
    for manager in managers:
        manager.shutdown(timeout=max(0.0, deadline - time.monotonic()))


class RunManager:
    """Starts runs in background threads and stops them; safe to share between callers.

    >>> manager = RunManager(RunStore())
    >>> run_id = manager.start(TrainConfig(total_steps=20_000))
    >>> manager.stop(run_id)            # returns at once; the thread ends within a second
    >>> manager.shutdown()              # stop everything and join
    """

    def __init__(
        self,
        store: RunStore,
        *,
        flush_interval: float = 1.0,
        recover_every_s: float | None = 5.0,
        processes: bool = False,
        spare_delay_s: float = 3.0,
    ) -> None:
        self.store = store
        self.flush_interval = flush_interval
        self._processes = processes
        self._spare: RunProcess | None = None
        self._spare_timer: threading.Timer | None = None
        self.spare_delay_s = spare_delay_s
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._events: dict[str, threading.Event | RunProcess] = {}
        self._outcomes: dict[str, RunOutcome] = {}
        self._closed = False
        self._closing = threading.Event()
        self._recovery: threading.Thread | None = None
        if recover_every_s is not None and not store.read_only:
            self._recovery = threading.Thread(
                target=self._recover_periodically,
                args=(recover_every_s,),
                name="gae-store-recovery",
                daemon=True,
            )
            self._recovery.start()
        call_before_thread_shutdown(_shutdown_live_managers)
        _LIVE_MANAGERS.add(self)

    def _recover_periodically(self, every: float) -> None:
        while not self._closing.wait(every):
            try:
                self.store.recover()
            except StoreError:
                log.exception("periodic recovery of %s failed", self.store.path)

    def start(
        self,
        config: TrainConfig | dict[str, Any],
        name: str | None = None,
        sweep_id: str | None = None,
    ) -> str:
        """Queue a run in the store and start its thread; returns the run id at once.

        ``config`` is a ``TrainConfig`` or its dict (validated: ``ConfigError`` on bad values).
        """
        if isinstance(config, dict):
            config = TrainConfig.from_dict(config)
        with self._lock:
            if self._closed:
                raise RuntimeError("this RunManager has been shut down")
            run_id = self.store.create_run(
                config.to_dict(),
                name=name or default_run_name(config),
                sweep_id=sweep_id,
                reward_threshold=reward_threshold(config.env_id),
            )
            if self._processes:
                event: threading.Event | RunProcess = self._take_spare()
                target = self._supervise
            else:
                event, target = threading.Event(), self._run
            thread = threading.Thread(
                target=target,
                args=(run_id, config, event),
                name=f"gae-run-{run_id}",
                daemon=True,
            )
            self._threads[run_id] = thread
            self._events[run_id] = event
            thread.start()
        return run_id

    def _run(self, run_id: str, config: TrainConfig, event: threading.Event) -> None:
        try:
            (outcome,) = execute_run(
                [StoreSink(self.store, run_id)],
                [run_id],
                [config],
                [event],
                flush_interval=self.flush_interval,
            )
        except StoreError:  # the store itself failed (disk full, ...): nothing to record it in
            log.exception("run %s: the run store failed", run_id)
            outcome = RunOutcome(run_id, "failed", 0, 0.0, traceback.format_exc())
        with self._lock:
            self._outcomes[run_id] = outcome

    def _take_spare(self) -> RunProcess:
        """The warm spare process (a cold one if there is none, or it died), and a new spare
        behind it."""
        process = self._spare
        if process is None or not process.process.is_alive():
            if process is not None:
                process.close()
            process = RunProcess(self.store.data_dir, self.flush_interval)
        # The next spare starts a little later: importing torch takes a core for ~2 s, which
        # would compete with this run's first seconds (and the page drawing them) on 2 cores.
        self._spare = None
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        self._spare_timer = threading.Timer(self.spare_delay_s, self.warm_up)
        self._spare_timer.daemon = True
        self._spare_timer.start()
        return process

    def warm_up(self) -> None:
        """Start the spare process now (processes=True), so the first Start is warm too."""
        with self._lock:
            if self._processes and self._spare is None and not self._closed:
                self._spare = RunProcess(self.store.data_dir, self.flush_interval)

    def _supervise(self, run_id: str, config: TrainConfig, process: RunProcess) -> None:
        """A run in a child process: hand it over, wait for its end, make sure the run closed."""
        outcome = None
        try:
            process.train(run_id, config.to_dict())
            outcome = process.result(timeout=None)
        except OSError:  # the process died before the hand-off
            pass
        finally:
            process.close()
            if outcome is None:
                outcome = self._close_after_death(run_id, process)
            with self._lock:
                self._outcomes[run_id] = outcome
                self._events[run_id] = _ENDED  # the process's pipe and semaphores are released

    def _close_after_death(self, run_id: str, process: RunProcess) -> RunOutcome:
        """The run's process died (killed, out of memory) without closing the run: a claimed
        run becomes ``interrupted`` (its owner pid is gone); an unclaimed one ``failed``."""
        error = f"the run's process (pid {process.pid}) exited with code {process.exitcode}"
        try:
            self.store.recover()
            run = self.store.get_run(run_id) if self.store.run_exists(run_id) else None
            if run is not None and run.status in ("queued", "running"):  # died before its claim
                self.store.finish_run(run_id, "failed", error)
            run = self.store.get_run(run_id) if self.store.run_exists(run_id) else None
        except StoreError:
            log.exception("run %s: could not close the run after its process died", run_id)
            return RunOutcome(run_id, "failed", 0, 0.0, error)
        status = run.status if run is not None else "deleted"
        return RunOutcome(run_id, status, run.env_steps if run else 0, 0.0, error)

    def stop(self, run_id: str) -> None:
        """Ask a run to stop; returns at once. Runs of other processes are asked via the store."""
        with self._lock:
            event = self._events.get(run_id)
        if event is not None:
            event.set()
        else:
            self.store.request_stop(run_id)

    def stop_all(self) -> None:
        with self._lock:
            events = list(self._events.values())
        for event in events:
            event.set()

    def active(self) -> list[str]:
        """Ids of this manager's runs whose thread is still alive."""
        with self._lock:
            return [rid for rid, thread in self._threads.items() if thread.is_alive()]

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Join the run's thread; True when it has ended (False on timeout)."""
        with self._lock:
            thread = self._threads.get(run_id)
        if thread is None:
            raise StoreError(f"run {run_id} was not started by this manager")
        thread.join(timeout)
        return not thread.is_alive()

    def outcome(self, run_id: str) -> RunOutcome | None:
        """How the run ended, or None while it runs."""
        with self._lock:
            return self._outcomes.get(run_id)

    def shutdown(self, timeout: float | None = 10.0) -> bool:
        """Stop every run and join their threads; True when all have ended in time."""
        with self._lock:
            self._closed = True
            threads = list(self._threads.values())
            spare, self._spare = self._spare, None
            if self._spare_timer is not None:
                self._spare_timer.cancel()
        self._closing.set()
        self.stop_all()
        if spare is not None:
            spare.close(timeout=0.0)  # a spare holds no run: no need to wait for it
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        return not any(thread.is_alive() for thread in threads)

    def __enter__(self) -> RunManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
