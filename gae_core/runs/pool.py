"""The local sweep backend: warm worker processes that train trials and stream their data back.

Each worker is a spawned process with one duplex pipe to the coordinator. The coordinator sends
it one trial at a time, or with ``members > 1`` a population of up to that many trials whose
configs can share one trainer (:func:`~gae_core.agent.trainer.population_key`); the worker
runs :func:`~gae_core.runs.execute.execute_run` with a :func:`pipe_sink` per trial,
which sends every flush, checkpoint and the end of the trial back through the pipe, and never
touches the store: the coordinator is the store's single writer.

Why pipes, one per worker, and not a shared ``multiprocessing.Queue``: a queue's writers share
a lock, and a worker killed with -9 while holding it would block every other worker; a broken
pipe only ever affects its own worker. Stop requests travel through a shared byte array (no
lock either), read by the worker between updates, so a stop reaches a trial within one update.

Workers ignore SIGINT (the coordinator turns Ctrl-C into a cancel), run niced below the process
that coordinates them (the dashboard's server, whose pages come first), and exit when the
coordinator's end of the pipe goes away, so a coordinator killed with -9 leaves no orphan
training on. A worker imports torch before it is given anything, so a pool can adopt a *spare*
started earlier (:func:`spawn_worker`; the run manager keeps one) and its first trial starts
without that import.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gae_core.runs.gather import Gathered, Gathering, population_capacity
from gae_core.runs.sinks import Lost, ProxySink, Report

__all__ = ["LocalPool", "WorkerHandle", "main_module_hidden", "pipe_sink", "spawn_worker"]

#: Workers that die before they are ready this many times in a row fail the sweep.
MAX_START_FAILURES = 3
#: How much lower than their coordinator workers are scheduled: they lose only the time it uses.
NICENESS = 10


class _FlagEvent:
    """``threading.Event``'s ``is_set``/``set`` over one byte of a shared array."""

    def __init__(self, flags: Any, index: int) -> None:
        self.flags, self.index = flags, index

    def is_set(self) -> bool:
        return bool(self.flags[self.index])

    def set(self) -> None:
        self.flags[self.index] = 1


def pipe_sink(conn: multiprocessing.connection.Connection, index: int, flags: Any) -> ProxySink:
    """Trial ``index``'s sink in a worker: its reports go down the worker's pipe to the
    coordinator; a stop (cancel, ``stop`` from the UI or CLI, a deleted run) arrives as the
    trial's byte in the shared ``flags``."""
    return ProxySink(index, lambda report, _: conn.send(report), lambda: flags[index])


def _worker_main(conn: multiprocessing.connection.Connection, flags: Any, flush: float) -> None:
    """A worker process: import the trainer once (warm), then train the trials it is sent: one
    (``("trial", [(index, run_id, config)])``) or a population (several in that list)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "nice"):  # POSIX
        with contextlib.suppress(OSError):
            os.nice(NICENESS)
    try:
        import torch

        from gae_core.runs.execute import execute_trials

        torch.set_num_threads(1)  # the workers are the parallelism
        conn.send(("ready", os.getpid()))
        while True:
            message = conn.recv()
            if message[0] == "exit":
                return
            trials = message[1]
            indices = [index for index, _, _ in trials]
            try:
                sinks = [pipe_sink(conn, index, flags) for index in indices]
                stops = [_FlagEvent(flags, index) for index in indices]
                execute_trials(sinks, trials, stops, flush_interval=flush)
            except (EOFError, BrokenPipeError, ConnectionResetError):
                raise
            except Exception:  # the config cannot be built here (an env this host lacks)
                for index in indices:
                    conn.send(Report.finish(index, "failed", traceback.format_exc()))
            conn.send(("idle", indices))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        os._exit(0)  # the coordinator is gone: nothing to report to


@dataclass
class WorkerHandle:
    """The pool's view of one worker: its process, its pipe, and its trials' stop bytes (one
    per trial index of the pool it serves, shared with the process)."""

    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    flags: Any
    # the trials it is training (trial index → env steps at its last flush)
    trials: dict[int, int] = field(default_factory=dict)
    ready: bool = False
    pid: int | None = None

    @property
    def free(self) -> bool:
        return self.ready and not self.trials

    def close(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit (it is killed if it has not within ``timeout``)."""
        with contextlib.suppress(OSError):  # a worker already gone
            self.conn.send(("exit",))
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        self.conn.close()
        with contextlib.suppress(ValueError):  # still running after a kill: leave it be
            self.process.close()  # its sentinel pipe: a server runs thousands of these


def spawn_worker(trials: int, flush_interval: float) -> WorkerHandle:
    """Start one worker for a pool of up to ``trials`` trial indices; it warms up (imports
    torch) at once and then waits for its first trial."""
    context = multiprocessing.get_context("spawn")
    flags = context.Array("b", max(trials, 1), lock=False)
    parent, child = context.Pipe(duplex=True)
    process = context.Process(
        target=_worker_main, args=(child, flags, flush_interval), name="gae-worker", daemon=True
    )
    with main_module_hidden():
        process.start()
    child.close()
    return WorkerHandle(process, parent, flags)


class LocalPool(Gathered):
    r"""``workers`` spawned processes on this machine: a sweep backend (see the module docstring).

    The coordinator submits trials (:meth:`submit`) while :meth:`can_take` says the next one
    would start, and reads :meth:`events`: the trials' :class:`~gae_core.runs.sinks.Report`\ s,
    and a :class:`~gae_core.runs.sinks.Lost` for each trial of a worker that died in the middle
    of it. A dead worker is replaced at once; workers that die before they are ready
    :data:`MAX_START_FAILURES` times in a row raise ``RuntimeError`` (they cannot start at
    all: a broken install).

    ``members``: the most trials one worker trains at once, as a population. Submitted trials
    are sent to the free workers on the next :meth:`events`, in the batches of the rule both
    backends share (:mod:`gae_core.runs.gather`).
    """

    name = "local"

    def __init__(
        self,
        workers: int,
        trials: int,
        flush_interval: float,
        *,
        members: int = 1,
        spare: WorkerHandle | None = None,
    ) -> None:
        self.trials, self.flush_interval = max(trials, 1), flush_interval
        self.gathering = Gathering(population_capacity(members, trials, workers))
        self._start_failures = 0
        self._stopped: set[int] = set()  # trial indices asked to stop
        adopted = [spare] if spare is not None and self._fits(spare) else []
        if spare is not None and not adopted:
            spare.close(timeout=0.0)
        self.workers: list[WorkerHandle] = adopted + [
            self._spawn() for _ in range(workers - len(adopted))
        ]

    def _fits(self, worker: WorkerHandle) -> bool:
        return worker.process.is_alive() and len(worker.flags) >= self.trials

    def _spawn(self) -> WorkerHandle:
        return spawn_worker(self.trials, self.flush_interval)

    def _free(self) -> int:
        return sum(1 for w in self.workers if w.free)

    def submit(self, index: int, run_id: str, config: dict) -> None:
        """Take the trial; it goes to a worker, alone or in a population, on the next
        :meth:`events`."""
        self._stopped.discard(index)
        self.gathering.add(index, run_id, config)

    def _send_gathered(self) -> None:
        """Hand the gathered trials to the free workers, a batch each
        (:meth:`~gae_core.runs.gather.Gathering.take`); what finds no free worker waits."""
        free = [w for w in self.workers if w.free]
        for worker, batch in zip(free, self.gathering.take(len(free)), strict=False):
            worker.trials = {index: 0 for index, _, _ in batch}
            for index in worker.trials:
                worker.flags[index] = int(index in self._stopped)
            worker.conn.send(("trial", batch))

    def stop(self, index: int) -> None:
        self._stopped.add(index)
        for worker in self.workers:
            if index in worker.trials:
                worker.flags[index] = 1

    def trial_pids(self) -> dict[int, int]:
        """``{trial index: worker pid}`` of the trials being trained now."""
        # list(): the UI thread asks while the coordinator's thread changes these dicts;
        # copying one in C holds the GIL, iterating it in Python would not
        return {t: w.pid for w in list(self.workers) if w.pid for t in list(w.trials)}

    def events(self, timeout: float) -> list[Report | Lost]:
        """Messages from the workers (waiting up to ``timeout`` for the first), and a ``lost``
        event for each trial whose worker died."""
        self._send_gathered()
        keys = [key for w in self.workers for key in (w.conn, w.process.sentinel)]
        ready = set(multiprocessing.connection.wait(keys, timeout))
        out: list[Report | Lost] = []
        for worker in [w for w in self.workers if {w.conn, w.process.sentinel} & ready]:
            if not self._drain(worker, out):
                self._bury(worker, out)
        return out

    def _drain(self, worker: WorkerHandle, out: list) -> bool:
        """Every message the worker has sent; False once it is dead."""
        while True:
            try:
                if not worker.conn.poll():
                    break
                message = worker.conn.recv()
            except (EOFError, OSError):
                return False
            kind = message.kind if isinstance(message, Report) else message[0]
            if kind == "ready":
                worker.ready, worker.pid = True, message[1]
                self._start_failures = 0
            elif kind == "idle":
                # only the trials it names are over: "finish" may have freed the worker and the
                # coordinator sent it the next trials since, which a late "idle" must not free.
                # A named trial still held had no "finish" (a bug in the worker): it ends failed
                # rather than leaving the sweep waiting
                for index in message[1]:
                    if worker.trials.pop(index, None) is not None:
                        out.append(Report.finish(index, "failed", _NO_END))
            else:
                if kind == "flush" and message.index in worker.trials:
                    worker.trials[message.index] = message.env_steps
                elif kind == "finish":
                    # it ended: a death from here on costs it nothing
                    worker.trials.pop(message.index, None)
                out.append(message)
        return worker.process.is_alive()

    def _bury(self, worker: WorkerHandle, out: list) -> None:
        worker.process.join(1.0)
        died = f"worker pid {worker.pid} died (exit code {worker.process.exitcode})"
        for index, steps in worker.trials.items():
            out.append(Lost(index, f"{died} at env step {steps:,}"))
        if not worker.ready:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                raise RuntimeError(
                    f"sweep workers die before they start (exit code "
                    f"{worker.process.exitcode}); see the log for the worker's error"
                )
        worker.conn.close()
        self.workers[self.workers.index(worker)] = self._spawn()

    def close(self) -> None:
        for worker in self.workers:  # all asked first: they exit together
            with contextlib.suppress(OSError):  # a worker already gone
                worker.conn.send(("exit",))
        for worker in self.workers:
            worker.close()


#: The error of a trial whose worker went idle without reporting how the trial ended.
_NO_END = "the worker finished this trial without reporting how it ended (see the worker's log)"


#: The run manager and sweep coordinators may spawn at once.
_MAIN_MODULE_LOCK = threading.Lock()


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start a spawned worker without re-importing the parent's ``__main__``.

    ``spawn`` re-runs the parent's main module in the child unless it has no file. The worker's
    code lives in this package and needs nothing from ``__main__``; under Streamlit the main
    module is Streamlit's own launcher, whose import in a bare child logs "missing
    ScriptRunContext" warnings, so hide it for the moment of the start.
    """
    main = sys.modules.get("__main__")
    with _MAIN_MODULE_LOCK:
        saved = {n: getattr(main, n) for n in ("__file__", "__spec__") if hasattr(main, n)}
        for name in saved:
            setattr(main, name, None) if name == "__spec__" else delattr(main, name)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(main, name, value)
