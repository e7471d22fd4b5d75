"""Background training runs: one daemon thread per run, a stop event each, all data in the store.

:func:`execute_run` is the one training loop every caller shares — a :class:`RunManager` thread,
the CLI's foreground ``train`` and a sweep worker process. It steps the trainer, buffers metric
rows and writes them to the :class:`~gae_core.store.RunStore` in one transaction at least every
``flush_interval`` seconds, saves checkpoints (with recorded trajectories) when the trainer says
one is due and once more at the end, and closes the run as ``finished``, ``stopped`` or
``failed``. It checks its stop event between updates — each update is short, so a stop takes
effect within a second — and the store's ``stop_requested`` flag on every flush, so a run
started by another process (a sweep worker, the CLI) can be stopped from the dashboard.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gae_core.store import ReturnTracker, RunStore, StoreError

__all__ = ["RunDiverged", "RunManager", "RunOutcome", "default_run_name", "execute_run"]

log = logging.getLogger(__name__)

#: Evaluation episodes at every checkpoint use this seed offset, the same at each checkpoint so
#: recordings start from the same initial states and differ only by the policy.
RECORD_SEED_OFFSET = 10_000


class RunDiverged(RuntimeError):
    """A loss or gradient norm came out NaN or infinite; raised when the trainer did not."""


@dataclass(frozen=True)
class RunOutcome:
    """How :func:`execute_run` ended."""

    run_id: str
    status: str
    env_steps: int
    wall_seconds: float
    error: str | None = None

    @property
    def steps_per_second(self) -> float:
        return self.env_steps / self.wall_seconds if self.wall_seconds > 0 else 0.0


def reward_threshold(env_id: str) -> float | None:
    """The env's "solved" level from its gymnasium spec, or None where it has none."""
    try:
        import gymnasium as gym

        threshold = gym.spec(env_id).reward_threshold
    except Exception:  # unknown or custom id: no threshold rather than no run
        return None
    return None if threshold is None else float(threshold)


def default_run_name(config: Any) -> str:
    """``CartPole-v1 λ=0.95 γ=0.99 seed=0``."""
    return f"{config.env_id} λ={config.lambda_:g} γ={config.gamma:g} seed={config.seed}"


def _as_config(config: Any) -> Any:
    from gae_core.config import TrainConfig

    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, dict):
        return TrainConfig.from_dict(config)
    raise TypeError(f"config must be a TrainConfig or a dict, got {type(config).__name__}")


def _default_trainer_factory(config: Any) -> Any:
    from gae_core.trainer import Trainer

    return Trainer(config)


def _is_divergence(exc: BaseException) -> bool:
    """A NaN/inf blow-up, as opposed to a bug: reported with its message, not a traceback."""
    if isinstance(exc, RunDiverged | FloatingPointError):
        return True
    try:
        from gae_core import trainer as trainer_mod
    except Exception:
        return False
    for name in ("DivergenceError", "TrainingDiverged", "NonFiniteLossError", "Diverged"):
        cls = getattr(trainer_mod, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def _check_finite(metrics: dict[str, float], env_steps: int) -> None:
    # The trainer is meant to raise on a NaN loss itself; this guard keeps a run from carrying
    # on silently with NaN weights if it ever does not.
    for key, value in metrics.items():
        if key.startswith("losses/") and not math.isfinite(value):
            raise RunDiverged(
                f"{key} is {value} at env step {env_steps}: training diverged "
                "(try a lower learning_rate or max_grad_norm > 0)"
            )


class _Flusher:
    """Buffers metric rows and writes them with the run's progress in one transaction."""

    def __init__(
        self, store: RunStore, run_id: str, tracker: ReturnTracker, interval: float
    ) -> None:
        self.store, self.run_id, self.tracker, self.interval = store, run_id, tracker, interval
        self.rows: list[tuple[str, int, float, float]] = []
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.interval

    def flush(self, env_steps: int) -> bool:
        """Write everything buffered; returns whether a stop was requested through the store."""
        rows, self.rows = self.rows, []
        stop = self.store.flush(
            self.run_id, rows, env_steps=env_steps, summary=self.tracker.summary()
        )
        self.last = time.monotonic()
        return stop


def execute_run(
    store: RunStore,
    run_id: str,
    config: Any,
    stop_event: threading.Event | None = None,
    *,
    flush_interval: float = 1.0,
    trainer_factory: Callable[[Any], Any] | None = None,
    on_step: Callable[[Any], None] | None = None,
) -> RunOutcome:
    """Train the queued run ``run_id`` to its end; never raises for a training failure.

    Claims the run (``queued`` → ``running``); returns at once with its current status if it is
    no longer queued (a cancelled sweep trial). ``on_step(result)`` is called after every update
    (the CLI's progress bar). Ends as ``finished`` when the budget is spent, ``stopped`` when
    ``stop_event`` is set or a stop was requested through the store, ``failed`` with the reason on
    any exception (a NaN/inf loss gives its message, anything else the traceback).
    """
    stop_event = stop_event or threading.Event()
    factory = trainer_factory or _default_trainer_factory
    started = time.monotonic()
    if not store.claim_run(run_id):
        run = store.get_run(run_id)
        return RunOutcome(run_id, run.status, run.env_steps, 0.0, run.error)

    tracker = ReturnTracker(reward_threshold(config.env_id))
    flusher = _Flusher(store, run_id, tracker, flush_interval)
    trainer = None
    env_steps = 0
    last_checkpoint = -1
    status, error = "failed", None
    try:
        trainer = factory(config)
        while not trainer.done:
            if stop_event.is_set():
                break
            result = trainer.step()
            env_steps = int(result.env_steps)
            wall = time.monotonic() - started
            for key, value in result.metrics.items():
                flusher.rows.append((key, env_steps, wall, float(value)))
            for episode in result.episodes:
                step = int(episode.env_step)
                flusher.rows.append(("charts/episodic_return", step, wall, float(episode.return_)))
                flusher.rows.append(("charts/episodic_length", step, wall, float(episode.length)))
                tracker.add(step, float(episode.return_))
            _check_finite(result.metrics, env_steps)
            if on_step is not None:
                on_step(result)
            if trainer.checkpoint_due():
                _save_checkpoint(store, run_id, trainer, config)
                last_checkpoint = env_steps
            if flusher.due() and flusher.flush(env_steps):
                stop_event.set()
        env_steps = int(trainer.env_steps)
        status = "finished" if trainer.done else "stopped"
        flusher.flush(env_steps)
        if last_checkpoint != env_steps and env_steps > 0:
            _save_checkpoint(store, run_id, trainer, config)
    except KeyboardInterrupt:
        # No handler turned Ctrl-C into a stop event: still close the run as stopped.
        status = "stopped"
        flusher.flush(env_steps)
        raise
    except Exception as exc:
        if _is_divergence(exc):
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = traceback.format_exc()
        log.warning("run %s failed: %s", run_id, error)
        status = "failed"
        try:
            flusher.flush(env_steps)  # keep what was measured up to the failure
        except Exception:
            log.exception("run %s: could not flush metrics after the failure", run_id)
    finally:
        if trainer is not None:
            try:
                trainer.close()
            except Exception:
                log.exception("run %s: trainer.close() failed", run_id)
        store.finish_run(run_id, status, error)
    return RunOutcome(run_id, status, env_steps, time.monotonic() - started, error)


def _save_checkpoint(store: RunStore, run_id: str, trainer: Any, config: Any) -> None:
    blob = trainer.checkpoint_bytes()
    episodes = int(getattr(config, "record_episodes", 0) or 0)
    recorded = []
    if episodes > 0:
        seed = (config.seed + RECORD_SEED_OFFSET) % (2**31)
        recorded = [t.to_bytes() for t in trainer.record(episodes, seed)]
    store.save_checkpoint(run_id, int(trainer.env_steps), blob, recorded)


_LIVE_MANAGERS: weakref.WeakSet[RunManager] = weakref.WeakSet()
_EXIT_HOOK_INSTALLED = False
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


def _install_exit_hook() -> None:
    # threading._register_atexit runs before the interpreter kills daemon threads (and before
    # concurrent.futures joins its pools); plain atexit would run too late for daemon threads.
    global _EXIT_HOOK_INSTALLED
    register = getattr(threading, "_register_atexit", None)
    if _EXIT_HOOK_INSTALLED or register is None:
        return
    try:
        register(_shutdown_live_managers)
    except RuntimeError:  # already shutting down
        return
    _EXIT_HOOK_INSTALLED = True


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
        trainer_factory: Callable[[Any], Any] | None = None,
    ) -> None:
        self.store = store
        self.flush_interval = flush_interval
        self._trainer_factory = trainer_factory
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._events: dict[str, threading.Event] = {}
        self._outcomes: dict[str, RunOutcome] = {}
        self._closed = False
        _install_exit_hook()
        _LIVE_MANAGERS.add(self)

    def start(
        self,
        config: Any,
        name: str | None = None,
        sweep_id: str | None = None,
    ) -> str:
        """Queue a run in the store and start its thread; returns the run id at once.

        ``config`` is a ``TrainConfig`` or its dict (validated: ``ConfigError`` on bad values).
        """
        config = _as_config(config)
        with self._lock:
            if self._closed:
                raise RuntimeError("this RunManager has been shut down")
            run_id = self.store.create_run(
                config.to_dict(),
                name=name or default_run_name(config),
                sweep_id=sweep_id,
                reward_threshold=reward_threshold(config.env_id),
            )
            event = threading.Event()
            thread = threading.Thread(
                target=self._run,
                args=(run_id, config, event),
                name=f"gae-run-{run_id}",
                daemon=True,
            )
            self._threads[run_id] = thread
            self._events[run_id] = event
            thread.start()
        return run_id

    def _run(self, run_id: str, config: Any, event: threading.Event) -> None:
        try:
            outcome = execute_run(
                self.store,
                run_id,
                config,
                event,
                flush_interval=self.flush_interval,
                trainer_factory=self._trainer_factory,
            )
        except Exception:  # the store itself failed: nothing left to record it in
            log.exception("run %s: the run store failed", run_id)
            outcome = RunOutcome(run_id, "failed", 0, 0.0, traceback.format_exc())
        with self._lock:
            self._outcomes[run_id] = outcome

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

    def is_active(self, run_id: str) -> bool:
        with self._lock:
            thread = self._threads.get(run_id)
        return thread is not None and thread.is_alive()

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
        self.stop_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        return not any(thread.is_alive() for thread in threads)

    def __enter__(self) -> RunManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
