"""The run loop of a population: :func:`execute_run`'s bookkeeping for each member of a
:class:`~gae_core.agent.population.PopulationTrainer`, each member still its own run.

Every member has its own sink, stop event, metric buffer, return tracker, evaluations and
checkpoints, exactly as :func:`~gae_core.runs.execute.execute_run` keeps them for one run; only
the stepping is shared, and so is the forward pass of the deterministic evaluations of the
members due at one update (each on envs of its own, seeded as its evaluation alone would be,
so its evaluation curve has the same start states at every point). A member that is
stopped, deleted or blows up ends on its own (the others go on); an exception in the population
itself (its env, its process) fails every member that had not ended.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Sequence

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.agent.population import Member, PopulationTrainer
from gae_core.agent.trainer import StepResult
from gae_core.outcome import ReturnTracker
from gae_core.runs.execute import (
    EVAL_SEED_OFFSET,
    RunDeleted,
    RunOutcome,
    RunSink,
    _Buffer,
    _flush_quietly,
    _save_checkpoint,
    record_seed,
)
from gae_core.trajectory import Trajectory

__all__ = ["execute_population"]

log = logging.getLogger(__name__)


class _Book:
    """One member's run: what :func:`~gae_core.runs.execute.execute_run` keeps for a run."""

    def __init__(self, sink: RunSink, run_id: str, config: TrainConfig, stop, flush_s: float):
        self.sink, self.run_id, self.config, self.stop = sink, run_id, config, stop
        self.tracker = ReturnTracker(reward_threshold(config.env_id))
        self.buffer = _Buffer(flush_s)
        self.env_steps = 0
        self.last_checkpoint = self.last_evaluation = -1
        self.episode_flushed = False
        self.status: str | None = None  # set once the run has ended
        self.error: str | None = None

    def flush(self) -> bool:
        return self.sink.flush(self.buffer.take(), self.env_steps, self.tracker.summary())

    def evaluated(self, returns: list[float], env_steps: int, wall: float) -> None:
        """One evaluation row: the mean of the deterministic episodes' returns."""
        mean = float(sum(returns) / len(returns))
        self.buffer.rows.append((M.EVAL_RETURN.key, env_steps, wall, mean))
        self.last_evaluation = env_steps

    def record(
        self,
        member: Member,
        result: StepResult,
        wall: float,
        evaluation: list[float] | None,
        recorded: list[Trajectory] | None = None,
    ) -> None:
        """The bookkeeping after one update (:func:`execute_run`'s loop body); ``evaluation``:
        the returns of the evaluation due at this update, if one was; ``recorded``: the
        episodes recorded for the checkpoint due at this update, if they were played already."""
        self.env_steps = env_steps = int(result.env_steps)
        rows = self.buffer.rows
        for key, value in result.metrics.items():
            rows.append((key, env_steps, wall, float(value)))
        for episode in result.episodes:
            step = int(episode.env_step)
            rows.append((M.EPISODIC_RETURN.key, step, wall, float(episode.return_)))
            rows.append((M.EPISODIC_LENGTH.key, step, wall, float(episode.length)))
            self.tracker.add(step, float(episode.return_))
        if evaluation is not None:
            self.evaluated(evaluation, env_steps, wall)
        if member.checkpoint_due():
            if self.flush():  # metrics first: a checkpoint is never ahead of the curve
                self.stop.set()
            _save_checkpoint(self.sink, member, self.config, recorded)
            self.last_checkpoint = env_steps
        first_episode = bool(result.episodes) and not self.episode_flushed
        if (self.buffer.due() or first_episode) and self.flush():
            self.stop.set()
        self.episode_flushed = self.episode_flushed or first_episode

    def needs_final_evaluation(self, member: Member) -> bool:
        """A finished run ends with an evaluation at its last step (unless it just had one)."""
        return self.config.eval_every > 0 and self.last_evaluation != member.env_steps

    def needs_final_checkpoint(self, member: Member) -> bool:
        """A run that ends (not failed) saves a checkpoint at its last step (unless it just
        did)."""
        return self.last_checkpoint != member.env_steps and member.env_steps > 0

    def close(
        self,
        member: Member,
        status: str,
        error: str | None,
        wall: float,
        evaluation: list[float] | None = None,
        recorded: list[Trajectory] | None = None,
    ) -> None:
        """End the run: the last evaluation (``evaluation``, for a finished run that needs
        one) and checkpoint (with ``recorded`` episodes, if played already), the last flush,
        then its status (``execute_run``'s ending)."""
        self.status, self.error = status, error
        try:
            self.env_steps = member.env_steps
            if status == "failed":
                _flush_quietly(self.flush, self.run_id)
            else:
                if evaluation is not None:
                    self.evaluated(evaluation, self.env_steps, wall)
                self.flush()
                if self.needs_final_checkpoint(member):
                    _save_checkpoint(self.sink, member, self.config, recorded)
        except RunDeleted:
            self.status = "deleted"
        except Exception:  # its last checkpoint or flush broke: it still ends, as failed
            self.status, self.error = "failed", traceback.format_exc()
            log.warning("run %s failed while ending: %s", self.run_id, self.error)
            try:
                self.flush()  # what it measured, if the sink takes it now
            except Exception:
                log.exception("run %s: could not flush metrics after the failure", self.run_id)
        if self.status != "deleted":
            self.sink.finish(self.status, self.error)


def execute_population(
    sinks: Sequence[RunSink],
    run_ids: Sequence[str],
    configs: Sequence[TrainConfig],
    stop_events: Sequence[threading.Event],
    *,
    flush_interval: float = 1.0,
) -> list[RunOutcome]:
    """Train the queued runs ``run_ids`` as one population (their configs must be able to share
    one: :func:`~gae_core.agent.population.population_key`); never raises for a training
    failure. Each run ends as :func:`~gae_core.runs.execute.execute_run` would end it alone."""
    started = time.monotonic()
    books = [
        _Book(sink, run_id, config, stop, flush_interval)
        for sink, run_id, config, stop in zip(sinks, run_ids, configs, stop_events, strict=True)
    ]
    claimed = [book for book in books if book.sink.claim()]
    for book in books:
        if book not in claimed:
            book.status = "skipped"
    population: PopulationTrainer | None = None
    try:
        if claimed:
            population = PopulationTrainer([book.config for book in claimed])
            members = [population.member(i) for i in range(len(claimed))]
            _train(population, members, claimed, started)
    except Exception:
        error = traceback.format_exc()
        log.warning("population of %s failed: %s", [b.run_id for b in claimed], error)
        for book in claimed:
            if book.status is None:
                book.status, book.error = "failed", error
                _flush_quietly(book.flush, book.run_id)
                book.sink.finish("failed", error)
    finally:
        if population is not None:
            population.close()
    wall = time.monotonic() - started
    return [
        RunOutcome(book.run_id, book.status or "failed", book.env_steps, wall, book.error)
        for book in books
    ]


def _train(population: PopulationTrainer, members: list[Member], books: list[_Book], started):
    def evaluations(due: list[int]) -> dict[int, list[float]]:
        if not due:
            return {}
        seeds = [(books[i].config.seed + EVAL_SEED_OFFSET) % 2**31 for i in due]  # as alone
        return population.evaluate_members(due, books[due[0]].config.eval_episodes, seeds)

    def recordings(due: list[int]) -> dict[int, list[Trajectory]]:
        """The episodes of the checkpoints due, played together (each as alone)."""
        due = [i for i in due if books[i].config.record_episodes > 0]
        if not due:
            return {}
        seeds = [record_seed(books[i].config) for i in due]
        try:
            return population.record_members(due, books[due[0]].config.record_episodes, seeds)
        except Exception:  # each then records alone, inside its own run's failure handling
            log.warning("recording members %s together failed", due, exc_info=True)
            return {}

    while True:
        wall = time.monotonic() - started
        stopping = [i for i, book in enumerate(books) if book.status is None and book.stop.is_set()]
        # a stop that lands on a budget's last update ends a finished run: with its evaluation
        final = evaluations(
            [i for i in stopping if members[i].done and books[i].needs_final_evaluation(members[i])]
        )
        for i in stopping:
            population.deactivate(i)
            status = "finished" if members[i].done else "stopped"
            books[i].close(members[i], status, None, wall, final.get(i))
        if population.done:
            break
        results = population.step()
        wall = time.monotonic() - started
        open_books = [i for i, book in enumerate(books) if book.status is None]
        due = evaluations([i for i in open_books if i in results and members[i].evaluation_due()])
        played = recordings([i for i in open_books if i in results and members[i].checkpoint_due()])
        for i in open_books:
            member, book = members[i], books[i]
            try:
                if member.error is not None:
                    book.close(member, "failed", member.error, wall)
                    continue
                if i in results:
                    book.record(member, results[i], wall, due.get(i), played.get(i))
            except RunDeleted:
                population.deactivate(i)
                book.status = "deleted"
            except Exception:  # its checkpoint or flush broke: it ends alone, the others go on
                population.deactivate(i)
                book.close(member, "failed", traceback.format_exc(), wall)
        ending = [
            i for i in open_books
            if books[i].status is None and members[i].done and not books[i].stop.is_set()
        ]  # fmt: skip
        final = evaluations([i for i in ending if books[i].needs_final_evaluation(members[i])])
        played = recordings([i for i in ending if books[i].needs_final_checkpoint(members[i])])
        for i in ending:
            population.deactivate(i)
            books[i].close(members[i], "finished", None, wall, final.get(i), played.get(i))
    for member, book in zip(members, books, strict=True):
        if book.status is None:  # deactivated without an end (cannot happen; be safe)
            book.close(member, "finished" if member.done else "stopped", None, wall)
