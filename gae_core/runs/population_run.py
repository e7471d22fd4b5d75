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
from dataclasses import dataclass

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.agent.policy import ActorCritic
from gae_core.agent.population import Member, PopulationTrainer
from gae_core.agent.recording import checkpoint_bytes
from gae_core.agent.stacked import StackedMLP
from gae_core.agent.together import evaluate_stacked, record_stacked
from gae_core.agent.trainer import StepResult
from gae_core.outcome import ReturnTracker
from gae_core.runs.execute import (
    RunDeleted,
    RunOutcome,
    RunSink,
    UpdateLog,
    _Buffer,
    _flush_quietly,
    eval_seed,
    execute_run,
    record_seed,
)
from gae_core.trajectory import Trajectory

__all__ = ["execute_batch", "execute_population"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Due:
    """What one member owes at the update where it became due: an evaluation (``actor``, its
    actor at that update) and/or a checkpoint (``model``, its networks at that update), or its
    run's end (``ends``: the status, with the final evaluation and checkpoint it needs).
    Settled once every member still training has reached ``horizon`` (:func:`_train`)."""

    index: int
    env_step: int
    wall: float
    horizon: int
    actor: StackedMLP | None = None
    model: ActorCritic | None = None
    ends: str | None = None


class _Book:
    """One member's run: what :func:`~gae_core.runs.execute.execute_run` keeps for a run."""

    def __init__(self, sink: RunSink, run_id: str, config: TrainConfig, stop, flush_s: float):
        self.sink, self.run_id, self.config, self.stop = sink, run_id, config, stop
        self.tracker = ReturnTracker(reward_threshold(config.env_id))
        self.buffer = _Buffer(flush_s)
        self.updates = UpdateLog(config.log_every)
        self.env_steps = 0
        self.last_checkpoint = self.last_evaluation = -1
        self.episode_flushed = False
        self.closing = False  # its end is due (settled with the others', see _Due)
        self.status: str | None = None  # set once the run has ended
        self.error: str | None = None

    @property
    def training(self) -> bool:
        return self.status is None and not self.closing

    def flush(self, *, window: bool = False) -> bool:
        """Store the rows so far (``window``: the update metrics' open window too)."""
        if window:
            self.buffer.rows.extend(self.updates.close())
        return self.sink.flush(self.buffer.take(), self.env_steps, self.tracker.summary())

    def evaluated(self, returns: list[float], env_steps: int, wall: float) -> None:
        """One evaluation row: the mean of the deterministic episodes' returns."""
        mean = float(sum(returns) / len(returns))
        self.buffer.rows.append((M.EVAL_RETURN.key, env_steps, wall, mean))

    def record(self, result: StepResult, wall: float) -> None:
        """The bookkeeping after one update (:func:`execute_run`'s loop body, less the
        evaluations and checkpoints, which :func:`_train` settles)."""
        steps_before, self.env_steps = self.env_steps, int(result.env_steps)
        rows = self.buffer.rows
        rows.extend(self.updates.add(steps_before, self.env_steps, wall, result.metrics))
        for episode in result.episodes:
            step = int(episode.env_step)
            rows.append((M.EPISODIC_RETURN.key, step, wall, float(episode.return_)))
            rows.append((M.EPISODIC_LENGTH.key, step, wall, float(episode.length)))
            self.tracker.add(step, float(episode.return_))
        first_episode = bool(result.episodes) and not self.episode_flushed
        if (self.buffer.due() or first_episode) and self.flush():
            self.stop.set()
        self.episode_flushed = self.episode_flushed or first_episode

    def checkpoint(self, model: ActorCritic, env_step: int, recorded: list | None) -> None:
        """Save ``model`` (the member's networks at ``env_step``) after flushing every metric
        so far (a checkpoint is never ahead of the curve: the update metrics' window was
        closed at ``env_step``, as a single run closes it), with the episodes ``recorded`` for
        it, or, where they were not played together, recorded alone now."""
        if self.flush():
            self.stop.set()
        config = self.config
        if recorded is None and config.record_episodes > 0:
            seeds = [record_seed(config)]
            recorded = record_stacked([model], config.env_id, config.record_episodes, seeds)[0]
        blob = checkpoint_bytes(model, {})
        self.sink.checkpoint(env_step, blob, [t.to_bytes() for t in recorded or ()])

    def due(
        self, i: int, member: Member, population: PopulationTrainer, wall: float
    ) -> _Due | None:
        """What member ``i`` owes after this update, if anything (its evaluation and
        checkpoint, with its networks now)."""
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
            self.buffer.rows.extend(self.updates.close())  # the curve reaches the checkpoint
        return _Due(
            i, step, wall, horizon,
            actor=population.actor.select([i]) if evaluate else None,
            model=population.model_of(i) if save else None,
        )  # fmt: skip

    def end(
        self, i: int, member: Member, population: PopulationTrainer, wall: float, status: str
    ) -> _Due:
        """The run's end (``finished`` or ``stopped``) with what it still needs: a finished
        run's evaluation at its last step, and a checkpoint there (unless it just had them)."""
        population.deactivate(i)
        self.closing = True
        self.buffer.rows.extend(self.updates.close())
        step = self.env_steps = member.env_steps
        evaluate = status == "finished" and self.config.eval_every > 0
        evaluate = evaluate and self.last_evaluation != step
        save = self.last_checkpoint != step and step > 0
        return _Due(
            i, step, wall, self.config.total_steps,
            actor=population.actor.select([i]) if evaluate else None,
            model=population.model_of(i) if save else None,
            ends=status,
        )  # fmt: skip

    def close(
        self,
        status: str,
        error: str | None,
        wall: float,
        evaluation: list[float] | None = None,
        model: ActorCritic | None = None,
        recorded: list[Trajectory] | None = None,
    ) -> None:
        """End the run: the last evaluation (``evaluation``, for a finished run that needs
        one) and checkpoint (of ``model``, with ``recorded`` episodes if played already), the
        last flush, then its status (``execute_run``'s ending)."""
        self.status, self.error = status, error
        try:
            if status == "failed":
                _flush_quietly(lambda: self.flush(window=True), self.run_id)
            else:
                if evaluation is not None:
                    self.evaluated(evaluation, self.env_steps, wall)
                if model is not None:
                    self.checkpoint(model, self.env_steps, recorded)
                else:
                    self.flush(window=True)
        except RunDeleted:
            self.status = "deleted"
        except Exception:  # its last checkpoint or flush broke: it still ends, as failed
            self.status, self.error = "failed", traceback.format_exc()
            log.warning("run %s failed while ending: %s", self.run_id, self.error)
            try:
                self.flush(window=True)  # what it measured, if the sink takes it now
            except Exception:
                log.exception("run %s: could not flush metrics after the failure", self.run_id)
        if self.status != "deleted":
            self.sink.finish(self.status, self.error)


def execute_batch(
    sinks: Sequence[RunSink],
    trials: Sequence[tuple[int, str, dict]],
    stop_events: Sequence[threading.Event],
    *,
    flush_interval: float = 1.0,
) -> None:
    """Train what a sweep backend's slot is sent (a worker process, a Ray task): ``trials``
    ``[(index, run id, TrainConfig.to_dict())]``, one sink and stop event each; one trial
    alone (:func:`~gae_core.runs.execute.execute_run`), several as one population. Raises if
    a config cannot be built here (an env this host lacks); the backend then fails them."""
    configs = [TrainConfig.from_dict(config) for _, _, config in trials]
    run_ids = [run_id for _, run_id, _ in trials]
    if len(trials) == 1:
        execute_run(sinks[0], run_ids[0], configs[0], stop_events[0], flush_interval=flush_interval)
    else:
        execute_population(sinks, run_ids, configs, stop_events, flush_interval=flush_interval)


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
                _flush_quietly(lambda b=book: b.flush(window=True), book.run_id)
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
    """The population's loop. Members reach an evaluation or checkpoint step at different
    updates (their reset rows, which count no step, differ), so what each owes is taken when
    it is due (its networks then, :class:`_Due`) and played once every member still training
    has passed the same step: the members due at one point play together, one stacked
    forward pass per env step (measured on the CartPole preset study: 280 evaluations in one
    worker ran as 147 calls of 1-8 members, 15 s of its 94)."""
    pending: list[_Due] = []
    shared = books[0].config  # env, episodes: the same for every member (population_key)

    def settle(force: bool) -> None:
        nonlocal pending
        if not pending:
            return
        steps = [members[i].env_steps for i, book in enumerate(books) if book.training]
        if not force and steps and min(steps) < max(d.horizon for d in pending):
            return  # a member still training has not reached the step yet
        due, pending = pending, []
        try:
            evaluations = _evaluate(population, books, [d for d in due if d.actor is not None])
        except Exception:  # each then plays alone, inside its own run's failure handling
            log.warning("evaluating members %s together failed", [d.index for d in due],
                        exc_info=True)  # fmt: skip
            evaluations = {}
        recordings = _record(books, [d for d in due if d.model is not None], shared)
        for d in due:
            book = books[d.index]
            if book.status is not None:  # it ended meanwhile (deleted, failed)
                continue
            try:
                if d.ends is not None:
                    returns = evaluations.get(d)
                    if d.actor is not None and returns is None:  # alone, inside its own try
                        returns = _evaluate(population, books, [d])[d]
                    book.close(d.ends, None, d.wall, returns, d.model, recordings.get(d))
                    continue
                if d.actor is not None:
                    returns = evaluations.get(d)
                    if returns is None:  # alone, inside its own try
                        returns = _evaluate(population, books, [d])[d]
                    book.evaluated(returns, d.env_step, d.wall)
                if d.model is not None:
                    book.checkpoint(d.model, d.env_step, recordings.get(d))
            except RunDeleted:
                population.deactivate(d.index)
                book.status = "deleted"
            except Exception:  # its checkpoint or flush broke: it ends alone, the others go on
                population.deactivate(d.index)
                book.close("failed", traceback.format_exc(), d.wall)

    while True:
        wall = time.monotonic() - started
        stopping = [i for i, book in enumerate(books) if book.training and book.stop.is_set()]
        for i in stopping:  # a stop on a budget's last update ends a finished run
            status = "finished" if members[i].done else "stopped"
            pending.append(books[i].end(i, members[i], population, wall, status))
        settle(force=bool(stopping))
        if population.done:
            settle(force=True)
            break
        results = population.step()
        wall = time.monotonic() - started
        for i, book in enumerate(books):
            member = members[i]
            if not book.training:
                continue
            error = member.error
            try:
                if error is None and i in results:
                    book.record(results[i], wall)
                    due = book.due(i, member, population, wall)
                    if due is not None:
                        pending.append(due)
            except RunDeleted:
                population.deactivate(i)
                book.status = "deleted"
            except Exception:  # its flush broke: it ends alone, the others go on
                error = traceback.format_exc()
            if error is not None and book.status is None:
                population.deactivate(i)
                settle(force=any(d.index == i for d in pending))  # what it owes, first
                if book.status is None:  # (settling may have ended it already)
                    book.close("failed", error, wall)
        for i, book in enumerate(books):
            if book.training and members[i].done and not book.stop.is_set():
                pending.append(book.end(i, members[i], population, wall, "finished"))
        settle(force=False)
    for i, book in enumerate(books):
        if book.status is None:  # deactivated without an end (cannot happen; be safe)
            book.close("finished" if members[i].done else "stopped", None, wall)


def _evaluate(population: PopulationTrainer, books: list[_Book], evaluating: list[_Due]) -> dict:
    """The evaluations due, played together (each as alone): ``{due: its returns}``; raises
    if playing them breaks."""
    if not evaluating:
        return {}
    shared = books[evaluating[0].index].config
    returns = evaluate_stacked(
        StackedMLP.concat([d.actor for d in evaluating]), population.discrete, shared.env_id,
        shared.eval_episodes, [eval_seed(books[d.index].config) for d in evaluating],
    )  # fmt: skip
    return dict(zip(evaluating, returns, strict=True))


def _record(books: list[_Book], saving: list[_Due], shared: TrainConfig) -> dict:
    """The episodes of the checkpoints due, played together (each as alone): ``{due: its
    episodes}``; empty if playing them together raised (each then records alone, inside its
    own run's failure handling)."""
    if shared.record_episodes <= 0 or not saving:
        return {}
    seeds = [record_seed(books[d.index].config) for d in saving]
    try:
        played = record_stacked([d.model for d in saving], shared.env_id,
                                shared.record_episodes, seeds)  # fmt: skip
    except Exception:
        log.warning("recording members %s together failed", [d.index for d in saving],
                    exc_info=True)  # fmt: skip
        return {}
    return dict(zip(saving, played, strict=True))
