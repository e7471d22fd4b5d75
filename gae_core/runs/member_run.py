"""One member of a trainer as its own run: its sink, stop flag, metric buffer, return tracker,
evaluations and checkpoints (what :func:`~gae_core.runs.execute.execute_run` keeps for each).

Members reach an evaluation or checkpoint step at different updates (their reset rows, which
count no step, differ), so what a member owes is taken when it is due, as an :class:`Owed`
holding a frozen copy of the member then (weights and normalisation statistics), and played
once every member still training has passed the same step; the members owing at one point
play together (:mod:`gae_core.agent.played_together`), each exactly as alone.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.agent.recording import Replay
from gae_core.agent.rollout import StepResult
from gae_core.agent.trainer import Member, Trainer
from gae_core.outcome import ReturnTracker
from gae_core.runs.sinks import MetricRows, RunDeleted, RunSink
from gae_core.trajectory import Trajectory

__all__ = [
    "EVAL_SEED_OFFSET",
    "RECORD_SEED_OFFSET",
    "MemberRun",
    "Owed",
    "UpdateLog",
    "eval_seed",
    "flush_quietly",
    "record_seed",
]

log = logging.getLogger(__name__)

#: Offsets of the fixed seeds of the episodes recorded with a run's checkpoints and of its
#: evaluations: each starts from the same initial states every time, so they differ by the policy.
RECORD_SEED_OFFSET = 10_000
EVAL_SEED_OFFSET = 20_000


def eval_seed(config: TrainConfig) -> int:
    """The seed of a run's deterministic evaluations (the same at each)."""
    return (config.seed + EVAL_SEED_OFFSET) % (2**31)


def record_seed(config: TrainConfig) -> int:
    """The seed of the episodes recorded with each of a run's checkpoints (the same at each)."""
    return (config.seed + RECORD_SEED_OFFSET) % (2**31)


class UpdateLog:
    """An update's metrics as stored rows, one row per metric each time the run crosses a
    multiple of ``log_every`` env steps (every update for 0): the row summarises the updates
    since the last row that reported the metric (:attr:`~gae_core.metrics.Metric.window`: their
    mean, or the last value of a clock), at the step and wall time of the last update. An
    update that took no step (no valid row) reports its learning rate only, so its unmeasured
    losses are not zeros in a mean. Why not a row per update: docs/PERFORMANCE.md."""

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


def flush_quietly(flush: Callable[[], bool], run_id: str) -> None:
    """Flush what was measured after a failure; a flush that fails too is only logged."""
    try:
        flush()
    except Exception:
        log.exception("run %s: could not flush metrics after the failure", run_id)


@dataclass(eq=False)
class Owed:
    """What one member owes at the update where it became due: an evaluation and/or a
    checkpoint of ``replay`` (a frozen copy of the member then), or its run's end (``ends``:
    the status). Settled once every member still training has reached ``horizon``."""

    index: int
    env_step: int
    wall: float
    horizon: int
    replay: Replay | None = None
    evaluate: bool = False
    blob: bytes | None = None  # the checkpoint, when one is owed
    ends: str | None = None


class MemberRun:
    """One member's run: what :func:`~gae_core.runs.execute.execute_run` keeps for it."""

    def __init__(self, sink: RunSink, run_id: str, config: TrainConfig, stop, flush_s: float):
        self.sink, self.run_id, self.config, self.stop = sink, run_id, config, stop
        self.tracker = ReturnTracker(reward_threshold(config.env_id))
        self.rows: MetricRows = []  # waiting for the next flush, due every flush_s seconds
        self.flush_s, self.flushed_at = flush_s, time.monotonic()
        self.updates = UpdateLog(config.log_every)
        self.env_steps = 0
        self.last_checkpoint = self.last_evaluation = -1
        self.episode_flushed = False
        self.closing = False  # its end is owed (played with the others', see Owed)
        self.status: str | None = None  # set once the run has ended
        self.error: str | None = None

    @property
    def training(self) -> bool:
        return self.status is None and not self.closing

    def flush(self, *, window: bool = False) -> bool:
        """Store the rows so far (``window``: the update metrics' open window too); whether a
        stop was requested."""
        if window:
            self.rows.extend(self.updates.close())
        rows, self.rows, self.flushed_at = self.rows, [], time.monotonic()
        return self.sink.flush(rows, self.env_steps, self.tracker.summary())

    def evaluated(self, returns: list[float], env_steps: int, wall: float) -> None:
        """One evaluation row: the mean of the deterministic episodes' returns."""
        mean = float(sum(returns) / len(returns))
        self.rows.append((M.EVAL_RETURN.key, env_steps, wall, mean))

    def record(self, result: StepResult, wall: float, started: float) -> None:
        """The bookkeeping after one update (``wall`` seconds after ``started``, a
        ``time.monotonic()``): its metric rows, its episodes at the time each ended, a flush
        when one is due (the first episode's return goes out at once, so a live chart is not
        blank for a whole flush interval)."""
        steps_before, self.env_steps = self.env_steps, int(result.env_steps)
        rows = self.rows
        rows.extend(self.updates.add(steps_before, self.env_steps, wall, result.metrics))
        for episode in result.episodes:
            step, ended = int(episode.env_step), min(wall, episode.ended_at - started)
            rows.append((M.EPISODIC_RETURN.key, step, ended, float(episode.return_)))
            rows.append((M.EPISODIC_LENGTH.key, step, ended, float(episode.length)))
            self.tracker.add(step, float(episode.return_))
        first_episode = bool(result.episodes) and not self.episode_flushed
        due = time.monotonic() - self.flushed_at >= self.flush_s
        if (due or first_episode) and self.flush():
            self.stop.set()
        self.episode_flushed = self.episode_flushed or first_episode

    def checkpoint(self, blob: bytes, env_step: int, recorded: list[Trajectory] | None) -> None:
        """Save ``blob`` (the member at ``env_step``) after flushing every metric so far (a
        checkpoint is never ahead of the curve), with its recorded episodes."""
        if self.flush():
            self.stop.set()
        self.sink.checkpoint(env_step, blob, [t.to_bytes() for t in recorded or ()])

    def due(self, i: int, member: Member, trainer: Trainer, wall: float) -> Owed | None:
        """What member ``i`` owes after this update, if anything."""
        config, step = self.config, member.env_steps
        evaluate, save = member.evaluation_due(), member.checkpoint_due()
        if not (evaluate or save):
            return None
        horizon = max(
            step - step % config.eval_every if evaluate else 0,
            step - step % config.checkpoint_every if save else 0,
        )
        if evaluate:
            self.last_evaluation = step
        if save:
            self.last_checkpoint = step
            self.rows.extend(self.updates.close())  # the curve reaches the checkpoint
        return Owed(
            i, step, wall, horizon, trainer.replay(i), evaluate,
            trainer.checkpoint_bytes(i) if save else None,
        )  # fmt: skip

    def end(self, i: int, member: Member, trainer: Trainer, wall: float, status: str) -> Owed:
        """The run's end (``finished`` or ``stopped``) with what it still needs: a finished
        run's evaluation at its last step, and a checkpoint there (unless it just had them)."""
        trainer.deactivate(i)
        self.closing = True
        self.rows.extend(self.updates.close())
        step = self.env_steps = member.env_steps
        evaluate = status == "finished" and self.config.eval_every > 0
        evaluate = evaluate and self.last_evaluation != step
        save = self.last_checkpoint != step and step > 0
        return Owed(
            i, step, wall, self.config.total_steps, trainer.replay(i), evaluate,
            trainer.checkpoint_bytes(i) if save else None, ends=status,
        )  # fmt: skip

    def close(
        self,
        status: str,
        error: str | None,
        wall: float,
        evaluation: list[float] | None = None,
        blob: bytes | None = None,
        recorded: list[Trajectory] | None = None,
    ) -> None:
        """End the run: the last evaluation (for a finished run that needs one) and
        checkpoint (``blob``, with its ``recorded`` episodes), the last flush, then its
        status."""
        self.status, self.error = status, error
        try:
            if status == "failed":
                flush_quietly(lambda: self.flush(window=True), self.run_id)
            else:
                if evaluation is not None:
                    self.evaluated(evaluation, self.env_steps, wall)
                if blob is not None:
                    self.checkpoint(blob, self.env_steps, recorded)
                else:
                    self.flush(window=True)
        except RunDeleted:
            self.status = "deleted"
        except Exception:  # its last checkpoint or flush broke: it still ends, as failed
            self.status, self.error = "failed", traceback.format_exc()
            log.warning("run %s failed while ending: %s", self.run_id, self.error)
            flush_quietly(lambda: self.flush(window=True), self.run_id)
        if self.status != "deleted":
            self.sink.finish(self.status, self.error)
