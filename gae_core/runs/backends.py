"""Sweep backends: where a sweep's trials train, behind one interface.

``local`` is :class:`~gae_core.runs.pool.LocalPool` (worker processes on this machine, no extra
service); ``ray`` is :class:`~gae_core.runs.ray_pool.RayPool` (Ray tasks on any node of a
cluster; ``pip install -r requirements-ray.txt``). Both train a sweep's trials in the same
populations (:mod:`gae_core.runs.gather`). The sweep's coordinator
(:mod:`gae_core.runs.sweep`) drives either one the same way and stays the store's single writer.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Protocol

from gae_core.errors import ConfigError
from gae_core.runs.pool import LocalPool
from gae_core.runs.sinks import Lost, ProxySink, Report

__all__ = [
    "BACKENDS",
    "DEFAULT_MEMBERS",
    "MAX_MEMBERS",
    "Backend",
    "BackendFactory",
    "ThreadBackend",
    "backend_factory",
    "ray_installed",
]


class Backend(Protocol):
    r"""Where trials train: :class:`~gae_core.runs.pool.LocalPool` (worker processes on this
    machine) or the Ray backend. Events are the trials' :class:`~gae_core.runs.sinks.Report`\ s
    and a :class:`~gae_core.runs.sinks.Lost` when the worker of a trial died."""

    name: str

    def can_take(self, config: dict, index: int | None = None) -> bool:
        """Whether trial ``index`` with ``config`` (``TrainConfig.to_dict()``) would start
        training at once if submitted now (the coordinator claims a trial only then)."""
        ...

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        """The order to submit a sweep's trials in (``configs`` by index): the populations the
        backend will form, each as a run of consecutive trials
        (:meth:`~gae_core.runs.gather.Gathering.dispatch_order`)."""
        ...

    def submit(self, index: int, run_id: str, config: dict) -> None: ...

    def stop(self, index: int) -> None: ...

    def events(self, timeout: float) -> list[Report | Lost]: ...

    def trial_pids(self) -> dict[int, int]: ...

    def close(self) -> None: ...


BackendFactory = Callable[[int, int, float], Backend]


class ThreadBackend:
    """Each trial trains in a thread of this process, the moment it is submitted: the run
    manager's default without ``processes`` (tests inject fake trainers here). Reports reach
    the coordinator through a queue, as they would through a pipe."""

    name = "threads"

    def __init__(self, workers: int, trials: int, flush_interval: float) -> None:
        self.flush_interval = flush_interval
        self._inbox: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._stops: dict[int, threading.Event] = {}
        self._threads: dict[int, threading.Thread] = {}

    def can_take(self, config: dict, index: int | None = None) -> bool:
        return True

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        return list(range(len(configs)))

    def submit(self, index: int, run_id: str, config: dict) -> None:
        stop = self._stops[index] = threading.Event()
        sink = ProxySink(index, lambda report, _: self._inbox.put(report), stop.is_set)
        thread = threading.Thread(
            target=self._train, args=(sink, (index, run_id, config), stop),
            name=f"gae-run-{run_id}", daemon=True,
        )  # fmt: skip
        self._threads[index] = thread
        thread.start()

    def _train(self, sink: ProxySink, trial: tuple, stop: threading.Event) -> None:
        from gae_core.runs.execute import execute_trials  # the trainer, once a run needs it

        try:
            execute_trials([sink], [trial], [stop], flush_interval=self.flush_interval)
        except Exception:  # the config cannot be built here
            self._inbox.put(Report.finish(trial[0], "failed", traceback.format_exc()))

    def stop(self, index: int) -> None:
        stop = self._stops.get(index)  # None before submit: the coordinator asks again
        if stop is not None:
            stop.set()

    def events(self, timeout: float) -> list[Report | Lost]:
        try:
            out: list[Report | Lost] = [self._inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not self._inbox.empty():
            out.append(self._inbox.get())
        return out

    def trial_pids(self) -> dict[int, int]:
        return {i: os.getpid() for i, t in list(self._threads.items()) if t.is_alive()}

    def close(self) -> None:
        for index, thread in list(self._threads.items()):
            self._stops[index].set()
            thread.join(5.0)


#: The sweep backends by name: ``local`` (worker processes here) and ``ray`` (optional extra).
BACKENDS = ("local", "ray")


def ray_installed() -> bool:
    """Whether the optional Ray backend can be used (``pip install -r requirements-ray.txt``)."""
    return importlib.util.find_spec("ray") is not None


#: The most trials one local worker or Ray task trains as a population (``members``).
MAX_MEMBERS = 256
#: What the CLI and the compare page ask for unless told otherwise: populations as large as an
#: even spread over the workers gives, up to this.
DEFAULT_MEMBERS = 64


def backend_factory(
    name: str = "local", address: str | None = None, *, members: int = 1
) -> BackendFactory:
    """The backend called ``name`` (:data:`BACKENDS`); ``address`` is a Ray cluster's (None:
    the Ray already running in this process, or a new local one); ``members``: how many trials
    a local worker or a Ray task may train at once as one batched population
    (one :class:`~gae_core.agent.trainer.Trainer`). ``ConfigError`` names the field for an unknown
    backend, Ray missing, members out of range, or an address the backend cannot take or join
    (:func:`~gae_core.runs.ray_address.check_address`: a few seconds, before anything is stored)."""
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if (
        isinstance(members, bool)
        or not isinstance(members, int)
        or not (1 <= members <= MAX_MEMBERS)
    ):
        raise ConfigError(f"members must be an integer in [1, {MAX_MEMBERS}], got {members!r}")
    if name == "local":
        if address is not None:
            raise ConfigError("address: only the ray backend takes a cluster address")
        return functools.partial(LocalPool, members=members) if members > 1 else LocalPool
    if not ray_installed():
        raise ConfigError("backend ray: ray is not installed (pip install -r requirements-ray.txt)")
    from gae_core.runs.ray_address import check_address
    from gae_core.runs.ray_pool import RayPool

    check_address(address)
    return functools.partial(RayPool, address=address, members=members)
