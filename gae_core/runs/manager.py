"""Background training runs, started and stopped by the dashboard: each one a sweep of one.

:meth:`RunManager.start` stores the run and hands it to a backend through the sweep coordinator
(:class:`~gae_core.runs.sweep.Sweep` without a stored sweep), the same path, the same
:class:`~gae_core.runs.sinks.Report` and the same single writer as a 1,000-trial sweep. With
``processes=True`` (the dashboard) the run trains in a local pool's worker process, niced below
the server, so training never holds the server's GIL or slows its pages. The manager keeps one
warm spare worker (torch imported), so a Start costs no import time; the next spare starts
``spare_delay_s`` after a Start, so its import does not take a core from the new run's first
seconds. Without ``processes`` runs train in threads of this process
(:class:`~gae_core.runs.backends.ThreadBackend`; tests inject fake trainers there).

Stop reaches the run within one update; a worker that dies leaves its run ``interrupted`` with
the worker's pid and exit code (a dashboard run is not retried); a server killed with -9 leaves
no orphan training (the worker exits when its pipe breaks, recovery marks the run
``interrupted``). The manager also owns the store's recovery schedule: every
``recover_every_s`` it marks runs whose owner process died as ``interrupted``, so reads of the
store never have side effects.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.errors import StoreError
from gae_core.runs.backends import ThreadBackend
from gae_core.runs.execute import default_run_name
from gae_core.runs.pool import LocalPool, WorkerHandle, spawn_worker
from gae_core.runs.sweep import Sweep
from gae_core.storage.records import RunRecord
from gae_core.storage.store import RunStore

__all__ = ["RunManager"]

log = logging.getLogger(__name__)


class RunManager:
    """Starts runs in the background and stops them; safe to share between callers.

    >>> manager = RunManager(RunStore())
    >>> run_id = manager.start(TrainConfig(total_steps=20_000))
    >>> manager.stop(run_id)            # returns at once; the run ends within one update
    >>> manager.shutdown()              # stop everything and wait
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
        self._spare: WorkerHandle | None = None
        self._spare_timer: threading.Timer | None = None
        self.spare_delay_s = spare_delay_s
        self._lock = threading.Lock()
        self._runs: dict[str, Sweep] = {}
        self._closed = False
        self._closing = threading.Event()
        if recover_every_s is not None and not store.read_only:
            threading.Thread(
                target=self._recover_periodically,
                args=(recover_every_s,),
                name="gae-store-recovery",
                daemon=True,
            ).start()

    def _recover_periodically(self, every: float) -> None:
        while not self._closing.wait(every):
            try:
                self.store.recover()
            except StoreError:
                log.exception("periodic recovery of %s failed", self.store.path)

    def start(self, config: TrainConfig | dict[str, Any], name: str | None = None) -> str:
        """Queue a run in the store and hand it to the backend; returns the run id at once.

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
                reward_threshold=reward_threshold(config.env_id),
            )
            backend = (
                functools.partial(LocalPool, spare=self._take_spare())
                if self._processes
                else ThreadBackend
            )
            run = Sweep(self.store, None, [(run_id, config)], 1, None, self.flush_interval,
                        retries=0, backend=backend)  # fmt: skip
            self._runs[run_id] = run.start()
        return run_id

    def _take_spare(self) -> WorkerHandle | None:
        """The warm spare worker (None: the pool starts a cold one), and a new spare behind it
        a little later."""
        spare, self._spare = self._spare, None
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        self._spare_timer = threading.Timer(self.spare_delay_s, self.warm_up)
        self._spare_timer.daemon = True
        self._spare_timer.start()
        return spare

    def warm_up(self) -> None:
        """Start the spare worker now (processes=True), so the first Start is warm too."""
        with self._lock:
            if self._processes and self._spare is None and not self._closed:
                self._spare = spawn_worker(1, self.flush_interval)

    def _run(self, run_id: str) -> Sweep | None:
        with self._lock:
            return self._runs.get(run_id)

    def stop(self, run_id: str) -> None:
        """Ask a run to stop; returns at once. Runs of other processes are asked via the store."""
        run = self._run(run_id)
        if run is not None:
            run.cancel()
        else:
            self.store.request_stop(run_id)

    def active(self) -> list[str]:
        """Ids of this manager's runs that have not ended."""
        with self._lock:
            return [run_id for run_id, run in self._runs.items() if not run.done]

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Wait for the run to end; True when it has (False on timeout)."""
        run = self._run(run_id)
        if run is None:
            raise StoreError(f"run {run_id} was not started by this manager")
        return run.wait(timeout)

    def outcome(self, run_id: str) -> RunRecord | None:
        """The run as it ended (status, error, env steps), or None while it runs or once it
        was deleted."""
        run = self._run(run_id)
        if run is None or not run.done or not self.store.run_exists(run_id):
            return None
        return self.store.get_run(run_id)

    def pid(self, run_id: str) -> int | None:
        """The process training the run now (None when it is not training)."""
        run = self._run(run_id)
        return None if run is None else run.trial_pids().get(run_id)

    def shutdown(self, timeout: float | None = 10.0) -> bool:
        """Stop every run and wait for them; True when all have ended in time."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
            spare, self._spare = self._spare, None
            if self._spare_timer is not None:
                self._spare_timer.cancel()
        self._closing.set()
        for run in runs:
            run.cancel()
        if spare is not None:
            spare.close(timeout=0.0)  # a spare holds no run: no need to wait for it
        deadline = None if timeout is None else time.monotonic() + timeout
        for run in runs:
            run.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return all(run.done for run in runs)

    def __enter__(self) -> RunManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
