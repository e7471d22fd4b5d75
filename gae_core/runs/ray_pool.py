"""The Ray sweep backend: each trial, or each population of trials (``members > 1``), is a Ray
task on any node of a cluster, streaming its data back to the coordinator, which stays the
store's single writer.

Messages travel through one small actor, the *inbox*: a task's trials post every flush,
checkpoint and end to the task's :class:`_Outbox`, which delivers them in batches at most every
``flush_interval / 2``; the reply says which trials were asked to stop (cancel, ``stop`` from
the UI or CLI, a deleted run), so a stop reaches a trial on any node within about
``flush_interval`` plus one update. The coordinator drains the inbox and watches the tasks'
object refs: when a task fails (its worker or its node died), each of its trials that had not
sent its end is reported ``lost``, and the coordinator re-queues it (once by default) like the
local pool's dead worker; a task that returns without one of its trials' ends (a bug) fails that
trial rather than leaving the sweep waiting. Tasks run with ``max_retries=0`` so Ray does not
retry behind the coordinator's back.

When this backend starts or joins Ray itself, the package travels with the job
(``runtime_env=RUNTIME_ENV``, ``py_modules``: this ``gae_core`` folder), so a node needs only the
requirements installed, not this checkout. Code that calls ``ray.init`` itself passes
``runtime_env=RUNTIME_ENV`` too (Ray takes local folders at the job level only), or runs from the
checkout on one machine, where Ray's workers start in the driver's folder. ``ray`` is an
optional dependency (``requirements-ray.txt``); importing this module without it raises a clear
``ImportError``.

An address is checked before a sweep exists (:func:`check_address`), and a sweep that starts Ray
keeps SIGTERM for Python's clean stop (:func:`_python_keeps_sigterm`).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gae_core.env_modules import named_modules
from gae_core.runs.gather import Gathered, Gathering, population_capacity
from gae_core.runs.ray_address import _JOINED, check_address
from gae_core.runs.sinks import Lost, ProxySink, Report

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only where ray is missing
    raise ImportError("the Ray backend needs ray: pip install -r requirements-ray.txt") from exc

__all__ = ["RUNTIME_ENV", "RayPool", "check_address", "connect"]

_PACKAGE = str(Path(__file__).resolve().parents[1])
RUNTIME_ENV = {"py_modules": [_PACKAGE], "excludes": ["__pycache__", "*.pyc"]}
#: The error of a trial whose task returned without reporting how the trial ended.
_NO_END = "its Ray task returned without reporting how this trial ended (see the task's log)"
#: How often an idle coordinator asks the inbox for news.
_POLL_S = 0.05


@ray.remote(num_cpus=0)
class _Inbox:
    """Messages from the trials to the coordinator, and the trials' stop flags."""

    def __init__(self) -> None:
        self.messages: list = []
        self.stopped: set[int] = set()

    def send_many(self, messages: list, indices: list[int]) -> list[int]:
        """Keep ``messages`` (in order); which of the trials ``indices`` were asked to stop."""
        self.messages.extend(messages)
        return [index for index in indices if index in self.stopped]

    def drain(self) -> list:
        messages, self.messages = self.messages, []
        return messages

    def stop(self, index: int) -> None:
        self.stopped.add(index)

    def clear(self, index: int) -> None:
        self.stopped.discard(index)


class _Outbox:
    """One task's messages on their way to the inbox, sent together: a population's members
    flush in the same update, and one blocking actor call each would cost the task real time.

    A message waits until ``every`` seconds have passed since the last delivery, then goes with
    every message waiting, in order, in one call, whose reply says which of the task's trials
    were asked to stop. A trial's end (``finish``) is delivered at once, so everything a task
    sent is in the inbox before its task returns.
    """

    def __init__(self, inbox: Any, indices: list[int], every: float) -> None:
        self.inbox, self.indices, self.every = inbox, list(indices), every
        self.pending: list = []
        self.stopped: set[int] = set()
        self._sent_at = -math.inf

    def post(self, message: Report | tuple, *, now: bool = False) -> None:
        self.pending.append(message)
        if now or time.monotonic() - self._sent_at >= self.every:
            self.deliver()

    def deliver(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        self.stopped = set(ray.get(self.inbox.send_many.remote(batch, self.indices)))
        self._sent_at = time.monotonic()


def _inbox_sink(outbox: _Outbox, index: int) -> ProxySink:
    """Trial ``index``'s sink in a task: its reports go through the task's :class:`_Outbox`
    (a run's end at once); its stop is what the inbox's last reply said."""
    return ProxySink(
        index,
        lambda report, urgent: outbox.post(report, now=urgent),
        lambda: index in outbox.stopped,
    )


@ray.remote(num_cpus=1, max_retries=0)
def _train(inbox: Any, trials: list, flush: float, env_modules: tuple[str, ...] = ()) -> None:
    """One task: a trial alone, or several as one population (``trials``: ``[(index, run id,
    config dict)]``, a :class:`~gae_core.runs.gather.Gathering` batch), as a local worker
    trains what it is sent, after importing the coordinator's ``env_modules``
    (:mod:`gae_core.env_modules`: the node needs them installed)."""

    import torch

    from gae_core.env_modules import use_env_modules
    from gae_core.runs.execute import execute_trials

    torch.set_num_threads(1)  # one CPU per task: the tasks are the parallelism
    indices = [index for index, _, _ in trials]
    outbox = _Outbox(inbox, indices, every=flush / 2)
    sinks = [_inbox_sink(outbox, index) for index in indices]
    started = ("started", indices, os.getpid(), ray.util.get_node_ip_address())
    outbox.post(started, now=True)
    try:
        use_env_modules(env_modules)
        stops = [threading.Event() for _ in trials]  # set by a flush's reply (_inbox_sink)
        execute_trials(sinks, trials, stops, flush_interval=flush)
    except Exception:  # the config cannot be built on this node (an env it lacks)
        for sink in sinks:
            sink.finish("failed", traceback.format_exc())


class RayPool(Gathered):
    """``workers`` Ray tasks at a time: a sweep backend (see the module docstring).

    ``address`` is a running cluster's (``ray://host:10001`` or ``host:6379``); None joins the
    Ray already initialised in this process, or starts a local one. ``members``: the most
    trials one task trains at once as a population (:mod:`gae_core.runs.gather`).
    """

    name = "ray"

    def __init__(
        self,
        workers: int,
        trials: int,
        flush_interval: float,
        address: str | None = None,
        *,
        members: int = 1,
    ) -> None:
        connect(address)
        self.workers = workers
        self.flush_interval = flush_interval
        self.gathering = Gathering(population_capacity(members, trials, workers))
        self.inbox = _Inbox.remote()
        self._refs: dict[Any, list[int]] = {}  # task ref → its trials' indices
        self._ended: set[int] = set()  # trials whose end arrived (a later failure costs nothing)
        self._pids: dict[int, int] = {}

    def _free(self) -> int:
        return max(0, self.workers - len(self._refs))

    def submit(self, index: int, run_id: str, config: dict) -> None:
        ray.get(self.inbox.clear.remote(index))
        self._ended.discard(index)
        self._pids.pop(index, None)
        self.gathering.add(index, run_id, config)

    def _send_gathered(self) -> None:
        for batch in self.gathering.take(self._free()):
            ref = _train.remote(self.inbox, batch, self.flush_interval, named_modules())
            self._refs[ref] = [index for index, _, _ in batch]

    def stop(self, index: int) -> None:
        self.inbox.stop.remote(index)

    def trial_pids(self) -> dict[int, int]:
        """``{trial index: pid}`` of the trials training now (a pid on the node that runs it)."""
        running = {index for indices in list(self._refs.values()) for index in indices}
        running -= self._ended  # (a population's member that ended while the others train)
        return {i: pid for i, pid in list(self._pids.items()) if i in running}

    def events(self, timeout: float) -> list[Report | Lost]:
        self._send_gathered()
        deadline = time.monotonic() + timeout
        while True:
            # Tasks first, then the inbox: a task sends everything before it returns, so the
            # messages of every task seen done here are in this drain.
            refs = list(self._refs)
            done = ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []
            out = []
            for message in ray.get(self.inbox.drain.remote()):
                if not isinstance(message, Report):  # ("started", indices, pid, node)
                    self._pids.update(dict.fromkeys(message[1], message[2]))
                    continue
                if message.kind == "finish":
                    self._ended.add(message.index)
                out.append(message)
            for ref in done:
                indices = self._refs.pop(ref)
                try:
                    ray.get(ref)
                except Exception as exc:  # its worker or node died, or the task was cancelled
                    for index in indices:
                        if index not in self._ended:
                            pid = self._pids.get(index)
                            out.append(Lost(index, f"Ray task (pid {pid}) failed: "
                                            f"{type(exc).__name__}"))  # fmt: skip
                else:  # it returned: every trial of it sent its end, or never will
                    for index in indices:
                        if index not in self._ended:
                            self._ended.add(index)
                            out.append(Report.finish(index, "failed", _NO_END))
            if out or done or time.monotonic() >= deadline:
                return out
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        for ref, indices in list(self._refs.items()):
            for index in indices:
                self.inbox.stop.remote(index)
            ray.cancel(ref, force=True)
        self._refs.clear()
        ray.kill(self.inbox)


def connect(address: str | None) -> None:
    """Join the cluster at ``address`` (None: start a local one, or join the one that
    ``RAY_ADDRESS`` names) where Ray is not initialised in this process, else check that it
    is the one ``address`` names (:func:`check_address`).

    A process that will end with Ray calls it from its main thread before the sweep starts
    (the CLI's ``sweep``): Ray's exit hook shuts down sooner from the thread that started
    Ray than from another (the sweep's coordinator, where :class:`RayPool` calls it
    otherwise; docs/PERFORMANCE.md). Python's SIGTERM handler stays the one the process had,
    whether ``ray.init`` succeeds or raises; where it raises, what it started is shut down."""
    if ray.is_initialized():
        check_address(address)
        return
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with _python_keeps_sigterm():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     runtime_env=RUNTIME_ENV)  # fmt: skip
    except BaseException:
        with contextlib.suppress(Exception):  # ray.init's error is the one to tell
            ray.shutdown()  # what a failed start began (a local head's processes) ends with it
        raise
    finally:  # ray.init in the main thread sets its own (sys.exit) first, even if it fails
        if sigterm is not None:  # (None: a handler not set from Python, left as it is)
            signal.signal(signal.SIGTERM, sigterm)
    if address is not None:
        _JOINED[address] = ray.get_runtime_context().gcs_address


@contextlib.contextmanager
def _python_keeps_sigterm() -> Iterator[None]:
    """``ray.init`` in here gives the driver no C++ failure-signal handler.

    Ray's handler (Abseil's) counts SIGTERM as a crash: it prints a stack dump and aborts the
    process 3 s later (exit 134), wherever the sweep's clean stop through Python's handler got
    to. Ray decides when it creates the driver's core worker, from
    ``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` (the documented environment variable's
    value at import), changed here for this one ``ray.init``: the Ray processes it starts keep
    theirs, and a native crash here still prints a Python traceback (``ray.init`` turns
    faulthandler on). Without the flag (another Ray), nothing changes."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    name = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
    if constants is None or not hasattr(constants, name):
        yield
        return
    before = getattr(constants, name)
    setattr(constants, name, True)
    try:
        yield
    finally:
        setattr(constants, name, before)
