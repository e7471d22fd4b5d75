"""The one run loop: M ≥ 1 queued runs trained by one :class:`~gae_core.agent.trainer.Trainer`,
each still its own run. Every caller uses it: the dashboard's runs, the CLI's ``train`` and
every sweep trial or population on either backend.

:func:`execute_run` steps the trainer, and for each member (:class:`~gae_core.runs.member_run.
MemberRun`) buffers metric rows and hands them to its :class:`~gae_core.runs.sinks.RunSink` at
least every ``flush_interval`` seconds, evaluates it and saves its checkpoints (with recorded
episodes) when due and at its end, and closes it (:func:`execute_run` says how). It checks the
stop events between updates (an update is short, so a stop takes effect within a second) and
each sink's stop flag on every flush, so a run can be stopped from another process. A member
that is stopped, deleted or blows up ends on its own and the others go on; an exception in the
trainer itself (its env, its process) fails every member that had not ended. Where the data
goes is the sink's business: a backend's :class:`~gae_core.runs.sinks.ProxySink` streams it
to the coordinator, the store's one writer.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gae_core.agent.config import TrainConfig
from gae_core.agent.played_together import evaluate_replays, record_replays_together
from gae_core.agent.rollout import TrainingDiverged
from gae_core.agent.trainer import Member, Trainer
from gae_core.labels import assignment
from gae_core.runs.member_run import MemberRun, Owed, eval_seed, flush_quietly, record_seed
from gae_core.runs.sinks import RunDeleted, RunSink

__all__ = [
    "RunDeleted",
    "RunOutcome",
    "call_before_thread_shutdown",
    "default_run_name",
    "execute_run",
    "execute_trials",
]

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class RunOutcome:
    """How one run of :func:`execute_run` ended."""

    run_id: str
    status: str
    env_steps: int
    wall_seconds: float
    error: str | None = None


def default_run_name(config: TrainConfig) -> str:
    """``A2C CartPole-v1 λ = 0.95 γ = 0.99 seed = 0``: the algorithm, the env, λ, γ, the seed."""
    fields = ("lambda_", "gamma", "seed")
    head = [config.algo.upper(), config.env_id]
    return " ".join([*head, *(assignment(f, getattr(config, f)) for f in fields)])


def execute_trials(
    sinks: Sequence[RunSink],
    trials: Sequence[tuple[int, str, dict]],
    stop_events: Sequence[threading.Event],
    *,
    flush_interval: float = 1.0,
) -> list[RunOutcome]:
    """:func:`execute_run` of what a sweep backend's slot is sent: ``trials`` ``[(index, run
    id, TrainConfig.to_dict())]``. Raises if a config cannot be built here (an env this host
    lacks); the backend then fails them."""
    configs = [TrainConfig.from_dict(config) for _, _, config in trials]
    run_ids = [run_id for _, run_id, _ in trials]
    return execute_run(sinks, run_ids, configs, stop_events, flush_interval=flush_interval)


def execute_run(
    sinks: Sequence[RunSink],
    run_ids: Sequence[str],
    configs: Sequence[TrainConfig],
    stop_events: Sequence[threading.Event],
    *,
    flush_interval: float = 1.0,
) -> list[RunOutcome]:
    """Train the queued runs ``run_ids`` (configs that can share a trainer:
    :func:`~gae_core.agent.trainer.population_key`) to their ends; never raises for a training
    failure.

    Each run is claimed first (``queued`` → ``running``); one whose claim fails ends
    ``skipped``. A run ends ``finished`` when its budget is spent, ``stopped`` when its
    stop event is set or a stop was requested through its sink, ``deleted`` when it vanished
    from the store, ``failed`` with the reason on any exception (a NaN/inf blow-up gives its
    message, anything else the traceback)."""
    started = time.monotonic()
    runs = [
        MemberRun(sink, run_id, config, stop, flush_interval)
        for sink, run_id, config, stop in zip(sinks, run_ids, configs, stop_events, strict=True)
    ]
    claimed = [run for run in runs if run.sink.claim()]
    for run in runs:
        if run not in claimed:
            run.status, run.error = "skipped", "the run was not queued any more"
    trainer: Trainer | None = None
    try:
        if claimed:
            trainer = Trainer([run.config for run in claimed])
            members = [trainer.member(i) for i in range(len(claimed))]
            _train(trainer, members, claimed, started)
    except Exception as exc:
        error = (
            f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TrainingDiverged | FloatingPointError)
            else traceback.format_exc()
        )
        # stored with each run, which its caller reports (the command's line, the page's
        # status); a log line at warning level would print it twice on a terminal
        log.info("run %s failed: %s", ", ".join(r.run_id for r in claimed), error)
        for run in claimed:
            if run.status is None:
                run.status, run.error = "failed", error
                flush_quietly(lambda r=run: r.flush(window=True), run.run_id)
                run.sink.finish("failed", error)
    finally:
        if trainer is not None:
            trainer.close()
    wall = time.monotonic() - started
    return [
        RunOutcome(run.run_id, run.status or "failed", run.env_steps, wall, run.error)
        for run in runs
    ]


def _train(trainer: Trainer, members: list[Member], runs: list[MemberRun], started: float):
    """The loop: step, book each member's update, take what each owes, play it once every
    member still training has passed its step (:class:`~gae_core.runs.member_run.Owed`)."""
    pending: list[Owed] = []
    shared = runs[0].config  # env, episodes: the same for every member (population_key)

    def play_owed(force: bool) -> None:
        nonlocal pending
        if not pending:
            return
        steps = [members[i].env_steps for i, run in enumerate(runs) if run.training]
        if not force and steps and min(steps) < max(o.horizon for o in pending):
            return  # a member still training has not reached the step yet
        owed, pending = pending, []
        try:
            evaluations = _evaluate(runs, [o for o in owed if o.evaluate])
        except Exception:  # each then plays alone, inside its own run's failure handling
            log.warning("evaluating members %s together failed", [o.index for o in owed],
                        exc_info=True)  # fmt: skip
            evaluations = {}
        recordings = _record(runs, [o for o in owed if o.blob is not None], shared)
        for o in owed:
            run = runs[o.index]
            if run.status is not None:  # it ended meanwhile (deleted, failed)
                continue
            try:
                returns = evaluations.get(o)
                if o.evaluate and returns is None:  # alone, inside its own try
                    returns = _evaluate(runs, [o])[o]
                recorded = recordings.get(o)
                if o.blob is not None and recorded is None and shared.record_episodes > 0:
                    recorded = _record(runs, [o], shared, alone=True)[o]
                if o.ends is not None:
                    run.close(o.ends, None, o.wall, returns, o.blob, recorded)
                    continue
                if returns is not None:
                    run.evaluated(returns, o.env_step, o.wall)
                if o.blob is not None:
                    run.checkpoint(o.blob, o.env_step, recorded)
            except RunDeleted:
                trainer.deactivate(o.index)
                run.status = "deleted"
            except Exception:  # its checkpoint or flush broke: it ends alone, the others go on
                trainer.deactivate(o.index)
                run.close("failed", traceback.format_exc(), o.wall)

    while True:
        wall = time.monotonic() - started
        stopping = [i for i, run in enumerate(runs) if run.training and run.stop.is_set()]
        for i in stopping:  # a stop on a budget's last update ends a finished run
            status = "finished" if members[i].done else "stopped"
            pending.append(runs[i].end(i, members[i], trainer, wall, status))
        play_owed(force=bool(stopping))
        if trainer.done:
            play_owed(force=True)
            break
        results = trainer.step()
        wall = time.monotonic() - started
        for i, run in enumerate(runs):
            member = members[i]
            if not run.training:
                continue
            error = member.error
            try:
                if error is None and i in results:
                    run.record(results[i], wall, started)
                    owed = run.due(i, member, trainer, wall)
                    if owed is not None:
                        pending.append(owed)
            except RunDeleted:
                trainer.deactivate(i)
                run.status = "deleted"
            except Exception:  # its flush broke: it ends alone, the others go on
                error = traceback.format_exc()
            if error is not None and run.status is None:
                trainer.deactivate(i)
                play_owed(force=any(o.index == i for o in pending))  # what it owes, first
                if run.status is None:  # (settling may have ended it already)
                    run.close("failed", error, wall)
        for i, run in enumerate(runs):
            if run.training and members[i].done and not run.stop.is_set():
                pending.append(run.end(i, members[i], trainer, wall, "finished"))
        play_owed(force=False)
    for i, run in enumerate(runs):
        if run.status is None:  # deactivated without an end (cannot happen; be safe)
            run.close("finished" if members[i].done else "stopped", None, wall)


def _evaluate(runs: list[MemberRun], evaluating: list[Owed]) -> dict:
    """The evaluations owed, played together (each as alone): ``{owed: its returns}``;
    raises if playing them breaks."""
    if not evaluating:
        return {}
    shared = runs[evaluating[0].index].config
    returns = evaluate_replays(
        [o.replay for o in evaluating], shared.env_id, shared.eval_episodes,
        [eval_seed(runs[o.index].config) for o in evaluating],
    )  # fmt: skip
    return dict(zip(evaluating, returns, strict=True))


def _record(runs: list[MemberRun], saving: list[Owed], shared: TrainConfig, alone=False) -> dict:
    """The episodes of the checkpoints owed, played together (each as alone): ``{owed: its
    episodes}``; empty if playing them together raised (each then records alone, inside its
    own run's failure handling, where ``alone`` lets the error through)."""
    if shared.record_episodes <= 0 or not saving:
        return {}
    seeds = [record_seed(runs[o.index].config) for o in saving]
    try:
        played = record_replays_together(
            [o.replay for o in saving], shared.env_id, shared.record_episodes, seeds
        )
    except Exception:
        if alone:
            raise
        log.warning("recording members %s together failed", [o.index for o in saving],
                    exc_info=True)  # fmt: skip
        return {}
    return dict(zip(saving, played, strict=True))
