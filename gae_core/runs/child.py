"""A dashboard run in a child process of its own, so training never holds the server's GIL.

Training is CPU-bound Python between small torch calls; in a thread of the Streamlit server it
competes for the interpreter lock with every page script, so the pages answer slowly while runs
train (``tests/test_browser.py`` measures click → redraw with two runs training; figures in
docs/PERFORMANCE.md, section "Hand-written forms and the measurements behind them"). A
:class:`RunProcess` trains the run in a spawned process instead, which writes the run store
itself (the store takes writers from several processes, as the CLI's ``train`` does) and claims
the run under its own pid, so the store's recovery marks the run ``interrupted`` if the process
is killed.

The process is started *before* it has a run: it imports torch and the trainer and waits, so
the :class:`~gae_core.runs.manager.RunManager` keeps one such warm spare and a Start costs no
import time. A stop request is a ``multiprocessing`` event the trainer reads between updates;
the process also stops when its parent disappears (a server killed with -9 leaves no orphan
training on; it watches the parent's sentinel, which works on every platform), ignores SIGINT
(the server turns Ctrl-C into stops) and runs niced, below the server's priority.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from typing import Any

from gae_core.runs.execute import RunOutcome
from gae_core.runs.pool import main_module_hidden

__all__ = ["RunProcess"]

#: How much lower than the server a run process is scheduled. On a machine with as many busy
#: runs as cores the server (and a browser on the same machine) would otherwise wait for CPU
#: behind them; niced runs lose only the time the pages actually use.
NICENESS = 10
#: A spare that gets no run in this long exits (a manager dropped by Streamlit's cache, say).
#: The manager replaces a dead spare at the next Start, which is then a cold start.
SPARE_IDLE_S = 600.0


class _StopOrOrphaned:
    """The stop event execute_run reads: set by the parent, or implied once the parent died."""

    def __init__(self, event: Any) -> None:
        self.event = event
        self.parent = multiprocessing.parent_process()  # its sentinel works on every platform

    def is_set(self) -> bool:
        return self.event.is_set() or (self.parent is not None and not self.parent.is_alive())

    def set(self) -> None:
        self.event.set()


def _child_main(
    conn: multiprocessing.connection.Connection,
    stop: Any,
    data_dir: str,
    flush_interval: float,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "nice"):  # POSIX; training is background work, the pages come first
        with contextlib.suppress(OSError):
            os.nice(NICENESS)
    from gae_core.agent.config import TrainConfig  # imports torch and gymnasium: the warm-up
    from gae_core.errors import StoreError
    from gae_core.runs.execute import StoreSink, execute_run
    from gae_core.storage.store import RunStore

    try:
        if not conn.poll(SPARE_IDLE_S):
            return  # nobody came for this spare (its manager was dropped): give the memory back
        message = conn.recv()
    except (EOFError, OSError):
        return  # the parent closed an unused spare
    if message[0] != "run":
        return
    _, run_id, config = message
    try:
        store = RunStore(data_dir, recover=False)
        (outcome,) = execute_run(
            [StoreSink(store, run_id)],
            [run_id],
            [TrainConfig.from_dict(config)],
            [_StopOrOrphaned(stop)],
            flush_interval=flush_interval,
        )
    except StoreError:  # the store itself failed (disk full, ...): nothing to record it in
        outcome = RunOutcome(run_id, "failed", 0, 0.0, traceback.format_exc())
    try:
        conn.send(("outcome", outcome))
    except (BrokenPipeError, OSError):
        pass


class RunProcess:
    """One spawned process that warms up at once and then trains the one run it is given."""

    def __init__(self, data_dir: str | os.PathLike[str], flush_interval: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(
            target=_child_main,
            args=(child, self._stop, os.fspath(data_dir), flush_interval),
            name="gae-run",
            daemon=True,
        )
        with main_module_hidden():
            self.process.start()
        child.close()
        self.pid: int | None = self.process.pid
        self.exitcode: int | None = None  # known once :meth:`close` has joined the process

    def train(self, run_id: str, config: dict[str, Any]) -> None:
        """Hand the process its run (it claims the run in the store when it begins)."""
        self.conn.send(("run", run_id, config))

    def set(self) -> None:
        """Ask the run to stop (the manager holds the process as the run's stop event); it ends
        within one update, as ``stopped``, with its data."""
        self._stop.set()

    def result(self, timeout: float | None = None) -> RunOutcome | None:
        """Wait for the run's outcome; None if the process died without one (or on timeout)."""
        try:
            if self.conn.poll(timeout):
                message = self.conn.recv()
                if message[0] == "outcome":
                    return message[1]
        except (EOFError, OSError):
            pass
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Let the process go and release its pipe and handles (a spare that never trained
        exits when its pipe closes; one that does not within ``timeout`` is killed)."""
        self.conn.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)
        self.exitcode = self.process.exitcode
        with contextlib.suppress(ValueError):  # still running after a kill: leave it be
            self.process.close()
