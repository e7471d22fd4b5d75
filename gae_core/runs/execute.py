"""The one training loop every caller shares: a dashboard run thread, the CLI's foreground
``train`` and a sweep trial in a worker process.

:func:`execute_run` steps a trainer, buffers metric rows and hands them to a :class:`RunSink` at
least every ``flush_interval`` seconds, saves checkpoints (with recorded trajectories) when the
trainer says one is due and once more at the end, and closes the run as ``finished``,
``stopped``, ``failed`` or ``deleted``. It checks its stop event between updates — each update is
short, so a stop takes effect within a second — and the sink's stop flag on every flush, so a
run can be stopped from another process.

Where the data goes is the sink's business: :class:`StoreSink` writes to a
:class:`~gae_core.runs.store.RunStore` directly (dashboard threads, the CLI); a sweep worker's
sink streams to the sweep's coordinator, the store's single writer (:mod:`gae_core.runs.sweep`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.agent.trainer import StepResult, Trainer, TrainingDiverged
from gae_core.errors import StoreError
from gae_core.labels import assignment
from gae_core.outcome import ReturnTracker, RunSummary
from gae_core.runs.store import RunStore
from gae_core.trajectory import Trajectory

__all__ = [
    "RECORD_SEED_OFFSET",
    "RunOutcome",
    "RunSink",
    "StoreSink",
    "TrainerLike",
    "UpdateLog",
    "default_run_name",
    "execute_run",
]


_EXIT_CALLBACKS: list[Callable[[], None]] = []


def call_before_thread_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback`` once at interpreter exit, before threads are joined or killed.

    ``threading._register_atexit`` runs before the interpreter joins non-daemon threads, kills
    daemon ones and joins ``concurrent.futures`` pools; plain :mod:`atexit` would run too late
    for a run thread or a sweep coordinator to close its run cleanly. Registering the same
    callback twice is a no-op.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None or callback in _EXIT_CALLBACKS:
        return
    try:
        register(callback)
    except RuntimeError:  # already shutting down
        return
    _EXIT_CALLBACKS.append(callback)


log = logging.getLogger(__name__)

#: Evaluation episodes at every checkpoint use this seed offset, the same at each checkpoint so
#: recordings start from the same initial states and differ only by the policy.
RECORD_SEED_OFFSET = 10_000
#: Deterministic evaluations use their own fixed seeds, the same at every evaluation.
EVAL_SEED_OFFSET = 20_000

MetricRows = list[tuple[str, int, float, float]]


class TrainerLike(Protocol):
    """What :func:`execute_run` needs of a trainer (:class:`~gae_core.agent.trainer.Trainer`
    is the one the product uses; tests pass stand-ins that fail on purpose)."""

    env_steps: int

    @property
    def done(self) -> bool: ...

    def step(self) -> StepResult: ...

    def checkpoint_due(self) -> bool: ...

    def checkpoint_bytes(self) -> bytes: ...

    def evaluation_due(self) -> bool: ...

    def evaluate(self, episodes: int, seed: int) -> list[float]: ...

    def record(self, episodes: int, seed: int) -> list[Trajectory]: ...

    def close(self) -> None: ...


class RunSink(Protocol):
    """Where a run's data goes. ``flush`` returns whether a stop was requested; any method may
    raise ``RunDeleted`` when the run no longer exists."""

    def claim(self) -> bool: ...

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool: ...

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None: ...

    def finish(self, status: str, error: str | None) -> None: ...


class RunDeleted(Exception):
    """The run was deleted while it trained (``delete --force``): it ends as ``deleted``."""


class StoreSink:
    """A sink that writes straight into a run store."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def claim(self) -> bool:
        return self.store.claim_run(self.run_id)

    def flush(self, rows: MetricRows, env_steps: int, summary: RunSummary) -> bool:
        try:
            return self.store.flush(self.run_id, rows, env_steps=env_steps, summary=summary)
        except StoreError:
            if not self.store.run_exists(self.run_id):
                raise RunDeleted(self.run_id) from None
            raise

    def checkpoint(self, env_step: int, blob: bytes, trajectories: Sequence[bytes]) -> None:
        if not self.store.run_exists(self.run_id):
            raise RunDeleted(self.run_id)
        self.store.save_checkpoint(self.run_id, env_step, blob, trajectories)

    def finish(self, status: str, error: str | None) -> None:
        self.store.finish_run(self.run_id, status, error)


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


def default_run_name(config: TrainConfig) -> str:
    """``CartPole-v1 λ = 0.95 γ = 0.99 seed = 0``."""
    fields = ("lambda_", "gamma", "seed")
    return " ".join([config.env_id, *(assignment(f, getattr(config, f)) for f in fields)])


class _Buffer:
    """Metric rows waiting for the next flush, and when that flush is due."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.rows: MetricRows = []
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.interval

    def take(self) -> MetricRows:
        rows, self.rows = self.rows, []
        self.last = time.monotonic()
        return rows


class UpdateLog:
    """An update's metrics as stored rows, one row per metric each time the run crosses a
    multiple of ``log_every`` env steps (every update for 0): the row summarises the updates
    since the last row that reported the metric (:attr:`~gae_core.metrics.Metric.window`: their
    mean, or the last value of a clock), at the step and wall time of the last update. An
    update that took no step (no valid row) reports its learning rate only, so its unmeasured
    losses are not zeros in a mean.

    Why not one row per update: the CartPole preset updates every 40 env steps, so a 7 λ ×
    10 seed study of 200k steps stored 3.5 M update rows (~114 bytes each in SQLite, about
    400 MB) and its single writer took a core's share from the trainers (measured: the study
    ran 9 % faster with a row per 1,000 steps). SB3's A2C, for the same reason, logs every
    100 updates."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lasts: dict[str, float] = {}
        self._at: tuple[int, float] = (0, 0.0)

    def add(self, steps_before: int, env_steps: int, wall: float, metrics: dict) -> MetricRows:
        """Take one update's ``metrics`` (it moved the run from ``steps_before`` to
        ``env_steps``); returns the rows due now (none until the window closes)."""
        for key, value in metrics.items():
            value = float(value)
            self._sums[key] = self._sums.get(key, 0.0) + value
            self._counts[key] = self._counts.get(key, 0) + 1
            self._lasts[key] = value
        self._at = (env_steps, wall)
        every = self.every
        if every <= 0 or env_steps // every > steps_before // every:
            return self.close()
        return []

    def close(self) -> MetricRows:
        """The rows of the updates since the last row, if any (a run's end, a checkpoint: what
        was measured is stored)."""
        env_steps, wall = self._at
        rows = [
            (key, env_steps, wall,
             self._lasts[key] if M.get(key).window == "last" else total / self._counts[key])
            for key, total in self._sums.items()
        ]  # fmt: skip
        self._sums, self._counts, self._lasts = {}, {}, {}
        return rows


def execute_run(
    sink: RunSink,
    run_id: str,
    config: TrainConfig,
    stop_event: threading.Event | None = None,
    *,
    flush_interval: float = 1.0,
    trainer_factory: Callable[[TrainConfig], TrainerLike] = Trainer,
    on_step: Callable[[StepResult], None] | None = None,
) -> RunOutcome:
    """Train the queued run ``run_id`` to its end; never raises for a training failure.

    Claims the run (``queued`` → ``running``); returns at once with status ``skipped`` if the
    claim fails (the run was cancelled or taken). ``on_step(result)`` is called after every
    update (the CLI's progress bar). Ends as ``finished`` when the budget is spent, ``stopped``
    when ``stop_event`` is set or a stop was requested through the sink, ``deleted`` when the run
    vanished from the store, ``failed`` with the reason on any exception (a NaN/inf blow-up gives
    its message, anything else the traceback).
    """
    stop_event = stop_event or threading.Event()
    started = time.monotonic()
    if not sink.claim():
        return RunOutcome(run_id, "skipped", 0, 0.0, "the run was not queued any more")
    tracker = ReturnTracker(reward_threshold(config.env_id))
    buffer = _Buffer(flush_interval)
    updates = UpdateLog(config.log_every)
    trainer: TrainerLike | None = None
    env_steps, last_checkpoint, last_evaluation = 0, -1, -1
    episode_flushed = False
    status, error = "failed", None

    def flush(*, window: bool = False) -> bool:
        """Store the rows so far (``window``: the update metrics' open window too)."""
        if window:
            buffer.rows.extend(updates.close())
        return sink.flush(buffer.take(), env_steps, tracker.summary())

    try:
        trainer = trainer_factory(config)
        while not trainer.done and not stop_event.is_set():
            steps_before = env_steps
            result = trainer.step()
            env_steps = int(result.env_steps)
            wall = time.monotonic() - started
            buffer.rows.extend(updates.add(steps_before, env_steps, wall, result.metrics))
            for episode in result.episodes:
                step = int(episode.env_step)
                buffer.rows.append((M.EPISODIC_RETURN.key, step, wall, float(episode.return_)))
                buffer.rows.append((M.EPISODIC_LENGTH.key, step, wall, float(episode.length)))
                tracker.add(step, float(episode.return_))
            if on_step is not None:
                on_step(result)
            if trainer.evaluation_due():
                _evaluate(buffer, trainer, config, env_steps, wall)
                last_evaluation = env_steps
            if trainer.checkpoint_due():
                # metrics first, so a checkpoint is never ahead of the stored curve
                if flush(window=True):
                    stop_event.set()
                _save_checkpoint(sink, trainer, config)
                last_checkpoint = env_steps
            # the first episode's return goes out at once: a live chart is not blank for a
            # whole flush interval after Start
            first_episode = bool(result.episodes) and not episode_flushed
            if (buffer.due() or first_episode) and flush():
                stop_event.set()
            episode_flushed = episode_flushed or first_episode
        env_steps = int(trainer.env_steps)
        status = "finished" if trainer.done else "stopped"
        if status == "finished" and config.eval_every > 0 and last_evaluation != env_steps:
            _evaluate(buffer, trainer, config, env_steps, time.monotonic() - started)
        flush(window=True)
        if last_checkpoint != env_steps and env_steps > 0:
            _save_checkpoint(sink, trainer, config)
    except RunDeleted:
        status = "deleted"
    except KeyboardInterrupt:
        # No handler turned Ctrl-C into a stop event: still close the run as stopped.
        status = "stopped"
        _flush_quietly(lambda: flush(window=True), run_id)
        raise
    except Exception as exc:
        if isinstance(exc, TrainingDiverged | FloatingPointError):
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = traceback.format_exc()
        log.warning("run %s failed: %s", run_id, error)
        status = "failed"
        _flush_quietly(lambda: flush(window=True), run_id)  # what was measured until the failure
    finally:
        if trainer is not None:
            trainer.close()
        if status != "deleted":
            sink.finish(status, error)
    return RunOutcome(run_id, status, env_steps, time.monotonic() - started, error)


def _flush_quietly(flush: Callable[[], bool], run_id: str) -> None:
    try:
        flush()
    except (StoreError, RunDeleted):
        log.exception("run %s: could not flush metrics after the failure", run_id)


def _evaluate(
    buffer: _Buffer, trainer: TrainerLike, config: TrainConfig, env_steps: int, wall: float
) -> None:
    """Deterministic evaluation: the mean return of ``eval_episodes`` episodes, one row."""
    returns = trainer.evaluate(config.eval_episodes, eval_seed(config))
    buffer.rows.append((M.EVAL_RETURN.key, env_steps, wall, float(sum(returns) / len(returns))))


def eval_seed(config: TrainConfig) -> int:
    """The seed of a run's deterministic evaluations (the same at each: the same start
    states at every point of its evaluation curve)."""
    return (config.seed + EVAL_SEED_OFFSET) % (2**31)


def record_seed(config: TrainConfig) -> int:
    """The seed of the episodes recorded with each of a run's checkpoints (the same at each)."""
    return (config.seed + RECORD_SEED_OFFSET) % (2**31)


def _save_checkpoint(
    sink: RunSink,
    trainer: TrainerLike,
    config: TrainConfig,
    recorded: Sequence[Trajectory] | None = None,
) -> None:
    """Save a checkpoint with its recorded episodes: ``recorded`` where the caller already
    played them (a population records its members together), else the trainer records them."""
    blob = trainer.checkpoint_bytes()
    if recorded is None and config.record_episodes > 0:
        recorded = trainer.record(config.record_episodes, record_seed(config))
    sink.checkpoint(int(trainer.env_steps), blob, [t.to_bytes() for t in recorded or ()])
