"""The lab on a stored run: load the chosen checkpoints, measure, keep the result in the store;
and :class:`LabJob`, the same in a background thread with progress, ETA and cancel (the page
polls it like a training run)."""

from __future__ import annotations

import datetime as dt
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import env_id_problem
from gae_core.agent.recording import Replay, load_replay
from gae_core.env_modules import missing_modules_note
from gae_core.errors import UnsupportedEnvError
from gae_core.lab.gradient import GradientResult, batch_problem, measure_gradient
from gae_core.lab.measure import (
    LabCancelled,
    LabResult,
    LabSettings,
    check_memory,
    measure_critics,
)
from gae_core.lab.settings import GradientSettings, reference_problem
from gae_core.lab.states import state_access
from gae_core.labels import label
from gae_core.storage.lab_table import LabRecord
from gae_core.storage.records import RunRecord
from gae_core.storage.store import RunStore

__all__ = ["LabJob", "check_run_env", "critic_name", "gradient_label", "measure_gradient_run",
           "measure_run", "state_label"]  # fmt: skip


def critic_name(step: int) -> str:
    """A critic checkpoint as a measurement's table, sentences and labels name it."""
    return f"critic {step:,}"


def gradient_label(record: LabRecord) -> str:
    """A stored gradient measurement as its box lists it: policy, batches, each critic's λ*
    (a measurement stored before it kept them all: the first critic's), when."""
    summary, lam = record.summary, label("lambda_")
    steps, bests = summary.get("critic_steps") or [], summary.get("best_lambdas") or []
    best = (", ".join(f"{critic_name(s)}: {lam}* = {b:g}"
                      for s, b in zip(steps, bests, strict=True))
            if len(steps) == len(bests) > 1  # several critics: each one's
            else f"{lam}* = {summary.get('best_lambda'):g}")  # fmt: skip
    return (f"policy {record.policy_step:,} · {summary.get('batches')} × "
            f"{summary.get('batch_size'):,} · {best} · {_when(record)}")  # fmt: skip


def state_label(*batch: LabRecord) -> str:
    """One per-state Measure (a result per critic, in critic order) as its box lists it, with
    when (two Measures of the same checkpoints read alike otherwise)."""
    lam = label("lambda_")
    return (f"policy {batch[0].policy_step:,} · {batch[0].summary.get('states')} states · "
            + ", ".join(f"{critic_name(r.critic_step)}: {lam}* = "
                        f"{r.summary.get('best_lambda'):g}" for r in batch)
            + f" · {_when(batch[0])}")  # fmt: skip


def _when(record: LabRecord) -> str:
    """When a measurement was stored, as its box lists it (local time, to the second)."""
    return dt.datetime.fromtimestamp(record.created_at).strftime("%Y-%m-%d %H:%M:%S")


def _step(name: str, step: int | None, available: list[int], default: int) -> int:
    if step is None:
        return default
    if step not in available:
        shown = ", ".join(f"{s:,}" for s in available)
        raise ValueError(f"{name} must be one of the run's checkpoints ({shown}), got {step}")
    return int(step)


def check_run_env(run: RunRecord) -> None:
    """``UnsupportedEnvError`` where ``run``'s env cannot be built in this process, naming the
    env modules it was trained with that this process does not import (a run on an env of the
    user's own, measured by a command or a server not told of its module)."""
    env_id = run.config.get("env_id")
    problem = env_id_problem(env_id)
    if problem:
        note = missing_modules_note(run.code)
        raise UnsupportedEnvError(f"run {run.id}'s env {env_id} cannot be built here: {note}"
                                  if note else f"run {run.id}: {problem}")  # fmt: skip


def _checkpoints(store: RunStore, run_id: str) -> tuple[TrainConfig, list[int]]:
    """The run's config and checkpoint steps; ValueError when it has none, or when its env
    cannot be built here for want of the env module it was trained with."""
    run = store.get_run(run_id)
    check_run_env(run)
    config = TrainConfig.from_stored(run.config)
    available = store.checkpoint_steps(run_id)
    if not available:
        raise ValueError(f"run {run_id} has no checkpoint yet: the lab replays checkpoints")
    return config, available


def measure_gradient_run(
    store: RunStore,
    run_id: str,
    *,
    policy_step: int | None = None,
    critic_steps: Sequence[int | None] = (None,),
    settings: GradientSettings | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> tuple[str, GradientResult]:
    """The gradient lens (:mod:`gae_core.lab.gradient`) on ``run_id``'s policy at
    ``policy_step`` (default: its latest checkpoint) with each critic of ``critic_steps``
    (None: the policy's own), on batches of the run's ``num_envs × rollout_steps`` unless
    ``settings.batch_size`` says otherwise (a multiple of its env count); stored with the run
    (``summary["kind"] == "gradient"``). ``ValueError`` names a bad step or size."""
    config, available = _checkpoints(store, run_id)
    state_access(config.env_id)  # the reference restarts episodes in simulator copies
    policy_step = _step("policy_step", policy_step, available, available[-1])
    steps = [_step("critic_step", s, available, policy_step) for s in critic_steps]
    settings = settings or GradientSettings(gamma=config.gamma)
    envs = config.num_envs
    size = settings.batch_size or envs * config.rollout_steps
    problems = [batch_problem(size, envs), reference_problem(settings.reference, size)]
    if any(problems):
        raise ValueError("\n".join(p for p in problems if p))

    def replay(step: int) -> Replay:
        return load_replay(config, store.load_checkpoint(run_id, step), run_id=run_id, step=step)

    result = measure_gradient(
        config.env_id, replay(policy_step), [replay(s) for s in steps], settings,
        envs=envs, steps=size // envs, critic_names=[critic_name(s) for s in steps],
        progress=progress, cancel=cancel,
    )  # fmt: skip
    meta = {"run_id": run_id, "run_name": store.get_run(run_id).name,
            "policy_step": policy_step, "critic_steps": steps}  # fmt: skip
    result = replace(result, meta=meta)
    # λ* of every critic, in the order of ``steps`` ("best_lambda": the first's, as stored
    # before measurements held several)
    bests = [result.best_lambda(critic_name(s)) for s in steps]
    summary = {"kind": "gradient", "best_lambda": bests[0], "best_lambdas": bests,
               "critic_steps": steps, "gamma": settings.gamma, "batches": settings.batches,
               "batch_size": size, "seconds": result.seconds}  # fmt: skip
    return store.save_lab_result(run_id, policy_step, steps[0], summary, result.to_json()), result


def measure_run(
    store: RunStore,
    run_id: str,
    *,
    policy_step: int | None = None,
    critic_steps: Sequence[int | None] = (None,),
    settings: LabSettings | None = None,
    progress: Callable[[float], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[tuple[str, LabResult]]:
    """Measure ``run_id``'s policy at ``policy_step`` (default: its latest checkpoint) with the
    critic of each of ``critic_steps`` (None: the policy's own) on shared rollouts; store every
    result and return ``(result id, result)`` pairs. ``ValueError`` names a bad step, an env the
    lab cannot restore gets ``UnsupportedEnvError`` and settings past the memory limit
    ``LabTooLarge`` before any work; a checkpoint that cannot be read is a ``StoreError`` naming
    the run and step."""
    run = store.get_run(run_id)
    config, available = _checkpoints(store, run_id)
    state_access(config.env_id)
    policy_step = _step("policy_step", policy_step, available, available[-1])
    steps = [_step("critic_step", s, available, policy_step) for s in critic_steps]
    settings = settings or LabSettings(gamma=config.gamma)
    check_memory(config.env_id, settings, critics=len(steps))  # LabTooLarge before any work

    def replay(step: int) -> Replay:  # a blob that cannot be read: StoreError naming it
        return load_replay(config, store.load_checkpoint(run_id, step), run_id=run_id, step=step)

    policy = replay(policy_step)
    critics = [replay(s) for s in steps]
    # the policy's critic ends a truth rollout still running at H where it learned values at
    # the lab's γ; at another γ its values are another sum, and the truth stops at H
    tail = policy if settings.gamma == config.gamma else None
    results = measure_critics(config.env_id, policy, critics, settings, progress=progress,
                              cancel=cancel, tail=tail)  # fmt: skip
    saved, batch = [], uuid.uuid4().hex[:12]  # one Measure: results shown together
    for step, result in zip(steps, results, strict=True):
        result = replace(
            result,
            meta={
                "run_id": run_id,
                "run_name": run.name,
                "policy_step": policy_step,
                "critic_step": step,
            },
        )
        summary = {
            "batch": batch,
            "best_lambda": result.best_lambda(),
            "gamma": settings.gamma,
            "states": len(result.states),
            "continuations": settings.continuations,
            "segment": settings.segment,
            "seconds": result.seconds,
        }
        saved.append(
            (store.save_lab_result(run_id, policy_step, step, summary, result.to_json()), result)
        )
    return saved


class LabJob:
    """:func:`measure_run` (or ``measure``, e.g. :func:`measure_gradient_run`) in a daemon
    thread; read ``fraction``, ``eta``, ``error`` and ``results`` from any thread;
    :meth:`cancel` stops it within one rollout step."""

    def __init__(
        self, store: RunStore, run_id: str, measure: Callable | None = None, **options: object
    ) -> None:
        self.run_id = run_id
        self.measure = measure or measure_run
        self.fraction = 0.0
        self.error: str | None = None
        self.cancelled = False
        self.results: list[tuple[str, LabResult | GradientResult]] = []
        self.started = time.monotonic()
        self.seen = False  # set by whoever has shown how it ended (the lab page)
        self._cancel = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(store, options), name=f"gae-lab-{run_id}", daemon=True
        )
        self._thread.start()

    def _progress(self, fraction: float) -> None:
        self.fraction = fraction

    def _work(self, store: RunStore, options: dict) -> None:
        try:
            results = self.measure(
                store, self.run_id, progress=self._progress, cancel=self._cancel, **options
            )
            self.results = results if isinstance(results, list) else [results]
            self.fraction = 1.0
        except LabCancelled:
            self.cancelled = True
        except Exception as exc:  # shown on the page; the traceback goes to the details
            self.error = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far, None before any progress."""
        if self.fraction <= 0.0 or self.done:
            return None
        elapsed = time.monotonic() - self.started
        return elapsed * (1.0 - self.fraction) / self.fraction

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.done
