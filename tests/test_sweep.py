"""Sweeps: grid expansion, a 2-worker sweep in spawned processes, cancellation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_in_process, stored_update_metric, wait_until

from gae_core import metrics as M
from gae_core.agent.config import ConfigError, TrainConfig
from gae_core.agent.trainer import Trainer
from gae_core.inert import MAX_NAME_LENGTH
from gae_core.outcome import RunSummary
from gae_core.runs.sinks import Lost, Report
from gae_core.runs.sweep import check_sweep_name, expand_grid, grid_of, run_sweep, start_sweep
from gae_core.runs.trials import trial_name
from gae_core.storage.store import RunStore

BASE = TrainConfig(num_envs=4, rollout_steps=16, total_steps=2000, hidden_sizes=(16,))


def test_expand_grid_order_and_validation():
    configs = expand_grid(BASE, grid_of(lambdas=[0.9, 1.0], seeds=[0, 1, 2]))
    assert [(c.lambda_, c.seed) for c in configs] == [
        (0.9, 0),
        (0.9, 1),
        (0.9, 2),
        (1.0, 0),
        (1.0, 1),
        (1.0, 2),
    ]
    assert all(c.total_steps == 2000 for c in configs)
    extra = expand_grid(BASE, grid_of(lambdas=[0.5], gamma=[0.9, 0.99]))
    assert [(c.lambda_, c.gamma) for c in extra] == [(0.5, 0.9), (0.5, 0.99)]
    with pytest.raises(ConfigError, match=r"sweep grid lambda_: lambda_ must be in \[0.0, 1.0\]"):
        expand_grid(BASE, grid_of(lambdas=[0.9, 1.5]))
    with pytest.raises(ConfigError, match="sweep grid: unknown config field 'lamda'"):
        expand_grid(BASE, {"lamda": [0.9]})
    with pytest.raises(ConfigError, match="sweep grid seed: needs at least one value"):
        expand_grid(BASE, grid_of(seeds=[]))
    # the same λ twice (1 and 1.0 are one value) would run the same trials twice
    with pytest.raises(ConfigError, match=r"sweep grid lambda_: duplicate value 1\.0"):
        expand_grid(BASE, grid_of(lambdas=[1, 0.9, 1.0]))
    with pytest.raises(ConfigError, match="sweep grid hidden_sizes: duplicate value"):
        expand_grid(BASE, {"hidden_sizes": [(8,), [8]]})


def test_the_form_and_the_cli_expand_a_study_into_the_same_trials_in_the_same_order():
    """Trials batched into populations differ in their last bits from the same trial batched
    otherwise: the form (grid_of) and `sweep` must order one study alike (seed fastest)."""
    from gae_core.cli import build_parser
    from gae_core.cli.commands import _grid

    form_grid = grid_of(lambdas=[0.9, 1.0], seeds=[0, 1], gamma=[0.95, 0.99])
    order = [(c.lambda_, c.gamma, c.seed) for c in expand_grid(BASE, form_grid)]
    assert order[:3] == [(0.9, 0.95, 0), (0.9, 0.95, 1), (0.9, 0.99, 0)]
    names = [trial_name("s", c, form_grid) for c in expand_grid(BASE, form_grid)]
    assert names[0] == "s λ = 0.9 γ = 0.95 seed = 0"
    for flags in (["--gammas", "0.95", "0.99", "--seeds", "0", "1"],
                  ["--seeds", "0", "1", "--grid", "gamma=0.95,0.99"]):  # fmt: skip
        cli_grid = _grid(build_parser().parse_args(["sweep", "--lambdas", "0.9", "1", *flags]))
        configs = expand_grid(BASE, cli_grid)
        assert [(c.lambda_, c.gamma, c.seed) for c in configs] == order, flags
        assert [trial_name("s", c, cli_grid) for c in configs] == names, flags


def test_a_sweep_name_its_trials_cannot_carry_is_refused_before_anything_is_stored(tmp_path):
    """A trial's name is the sweep's plus its grid values; a sweep name that fits alone but
    not with them (or has nothing printable) is refused naming the field and the length
    allowed, and the store holds no sweep and no run after it."""
    store = RunStore(tmp_path)
    grid = grid_of(lambdas=[0.95, 1.0], seeds=[10, 11])
    added = len(" λ = 0.95 seed = 10")
    fits = "x" * (MAX_NAME_LENGTH - added)
    assert check_sweep_name(f"  {fits} ", BASE, grid) == fits
    with pytest.raises(
        ValueError,
        match=rf"at most {MAX_NAME_LENGTH - added} characters for "
        rf"this grid \(its trials' names add up to {added} .*got {len(fits) + 1}",
    ):
        start_sweep(store, BASE, grid, workers=1, name=fits + "x")
    with pytest.raises(ValueError, match="sweep name cannot be empty"):
        start_sweep(store, BASE, grid, workers=1, name="\x07\x08")
    assert store.list_sweeps() == [] and store.list_runs() == []


@pytest.mark.slow
def test_sweep_with_two_workers(tmp_path):
    store = RunStore(tmp_path)
    seen = []
    grid = grid_of(lambdas=[0.9, 1.0], seeds=[0, 1])
    progress = run_sweep(store, BASE, grid, workers=2, name="tiny", on_progress=seen.append)
    assert progress.status == "finished"
    assert progress.total == 4 and progress.done == 4 and progress.counts["finished"] == 4
    assert progress.fraction == 1.0
    assert seen and seen[-1].done == 4  # the callback saw the end
    sweep = store.get_sweep(progress.sweep_id)
    assert sweep.grid == {"lambda_": [0.9, 1.0], "seed": [0, 1]} and sweep.ended_at is not None
    runs = store.list_runs(sweep_id=sweep.id)
    assert sorted((r.config["lambda_"], r.config["seed"]) for r in runs) == [
        (0.9, 0),
        (0.9, 1),
        (1.0, 0),
        (1.0, 1),
    ]
    for run in runs:
        assert run.status == "finished", run.error
        assert run.name.startswith("tiny λ = ") and run.env_steps >= 2000
        assert len(store.metrics(run.id, [M.VALUE_LOSS.key])) > 0
    # A trial trained in a worker process equals the same config trained here.
    run = next(r for r in runs if r.config["lambda_"] == 1.0 and r.config["seed"] == 1)
    trainer = Trainer(TrainConfig.from_dict(run.config))
    updates = []
    while not trainer.done:
        result = trainer.step()[0]
        updates.append((result.env_steps, result.metrics.get(M.VALUE_LOSS.key)))
    trainer.close()
    expected = stored_update_metric(updates, BASE.log_every)
    stored = store.metrics(run.id, [M.VALUE_LOSS.key])
    assert stored["env_step"].tolist() == [s for s, _ in expected]
    np.testing.assert_allclose(stored["value"].to_numpy(), [v for _, v in expected], rtol=1e-6)
    assert store.integrity_check() == "ok"
    store.close()


@pytest.mark.slow
def test_cancel_stops_running_and_pending_trials(tmp_path):
    store = RunStore(tmp_path)
    long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
    sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2, 3]), workers=2)
    # Both workers train at once: two trials running together.
    assert wait_until(lambda: sweep.progress().counts["running"] == 2, timeout=60)
    assert wait_until(
        lambda: all(
            store.get_run(r).env_steps > 0
            for r in sweep.run_ids
            if store.get_run(r).status == "running"
        ),
        timeout=30,
    )
    sweep.cancel()
    assert sweep.wait(timeout=20)
    progress = sweep.progress()
    assert progress.status == "cancelled"
    assert progress.counts["stopped"] == 4 and progress.done == 4
    runs = store.list_runs(sweep_id=sweep.sweep_id)
    started = [r for r in runs if r.started_at is not None]
    assert len(started) == 2 and all(r.env_steps > 0 for r in started)
    assert all(r.env_steps == 0 for r in runs if r.started_at is None)  # never started
    store.close()


@pytest.mark.slow
def test_a_dead_worker_costs_only_its_own_trial(tmp_path):
    """kill -9 of the worker training one trial: the trial starts again from scratch (one retry
    by default); killed again, it ends interrupted naming the worker; the others finish."""
    store = RunStore(tmp_path)
    config = TrainConfig(num_envs=4, rollout_steps=16, total_steps=120_000, hidden_sizes=(16,))
    sweep = start_sweep(store, config, grid_of(seeds=[0, 1, 2]), workers=2)
    victim = sweep.run_ids[0]
    for attempt in (1, 2):
        assert wait_until(
            lambda: victim in sweep.trial_pids() and store.get_run(victim).env_steps > 0, 60
        ), f"attempt {attempt} never started"
        pid = sweep.trial_pids()[victim]
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        if attempt == 1:  # reset and queued again, its data from the dead attempt dropped
            assert wait_until(
                lambda: "attempt 2: the previous worker pid" in (store.get_run(victim).error or ""),
                30,
            )
    assert sweep.wait(timeout=120)
    run = store.get_run(victim)
    assert run.status == "interrupted"
    assert f"worker pid {pid} died (exit code -9)" in run.error and "retries used up" in run.error
    others = [store.get_run(r) for r in sweep.run_ids[1:]]
    assert [r.status for r in others] == ["finished", "finished"]
    assert all(r.env_steps >= 120_000 for r in others)
    record = store.get_sweep(sweep.sweep_id)
    assert record.status == "finished"  # two of three trials ran to the end
    assert record.error.startswith(f"1 of 3 trials did not finish: {victim} (λ = 0.95 seed = 0)")
    counts = store.sweep_status_counts(sweep.sweep_id)
    assert counts["queued"] == counts["running"] == 0
    assert store.integrity_check() == "ok"
    store.close()


@pytest.mark.slow
def test_a_dead_population_worker_costs_its_members_one_retry(tmp_path):
    """With populations a worker holds several trials: kill -9 of it re-queues every member it
    held (their data from the dead attempt dropped) and they finish, as do the others."""
    import functools

    from gae_core.runs.pool import LocalPool

    store = RunStore(tmp_path)
    config = TrainConfig(num_envs=4, rollout_steps=16, total_steps=60_000, hidden_sizes=(16,))
    backend = functools.partial(LocalPool, members=2)
    sweep = start_sweep(store, config, grid_of(seeds=[0, 1, 2, 3]), workers=2, backend=backend)
    victim = sweep.run_ids[0]
    assert wait_until(
        lambda: victim in sweep.trial_pids() and store.get_run(victim).env_steps > 0, 60
    )
    pids = sweep.trial_pids()
    members = [run_id for run_id, pid in pids.items() if pid == pids[victim]]
    assert len(members) == 2  # the victim and its population's other member
    os.kill(pids[victim], signal.SIGKILL)
    assert sweep.wait(timeout=120)
    attempts = {t.run_id: t.attempts for t in sweep._trials}
    assert attempts == {r: int(r in members) for r in sweep.run_ids}  # both members, once
    runs = {r: store.get_run(r) for r in sweep.run_ids}
    assert [run.status for run in runs.values()] == ["finished"] * 4
    assert all(run.env_steps >= 60_000 for run in runs.values())
    for run_id in members:  # retried from scratch: one curve, not the dead attempt's as well
        steps = store.metrics(run_id, [M.EPISODIC_RETURN.key])["env_step"]
        assert steps.is_monotonic_increasing and len(steps) == runs[run_id].summary.episodes
    assert store.get_sweep(sweep.sweep_id).status == "finished"
    store.close()


@pytest.mark.slow
def test_a_sweep_whose_every_trial_failed_is_failed(tmp_path):
    """Trials that fail inside their worker (here: an env registered only in this process,
    which the spawned workers do not know) end failed with the reason; all failed → the sweep
    is failed, naming them."""
    import gymnasium as gym

    env_id = "GAETest/CartPoleHereOnly-v0"
    if env_id not in gym.envs.registry:
        gym.register(
            env_id,
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=200,
        )
    store = RunStore(tmp_path)
    base = TrainConfig(env_id=env_id, num_envs=2, rollout_steps=8, total_steps=400)
    progress = run_sweep(store, base, grid_of(seeds=[0, 1]), workers=2)
    assert progress.status == "failed" and progress.counts["failed"] == 2
    record = store.get_sweep(progress.sweep_id)
    assert record.error.startswith("2 of 2 trials did not finish")
    for run in store.list_runs(sweep_id=progress.sweep_id):
        assert run.status == "failed" and "is not a registered environment" in run.error
    store.close()


_WAIT = """
import time
def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
"""

_EXIT_SCRIPT = (
    _WAIT
    + """
import sys
import time
from gae_core.agent.config import TrainConfig
from gae_core.storage.store import RunStore
from gae_core.runs.sweep import grid_of, start_sweep
store = RunStore(sys.argv[1])
long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2)
assert wait_until(lambda: sweep.progress().counts["running"] == 2, timeout=60)
print(sweep.sweep_id, flush=True)
# The script ends mid-sweep: the exit hook cancels it instead of waiting for 10**8 steps.
"""
)


@pytest.mark.slow
def test_interpreter_exit_cancels_a_running_sweep(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    sweep_id = done.stdout.strip()
    with RunStore(tmp_path) as store:
        counts = store.sweep_status_counts(sweep_id)
        assert counts["stopped"] == 3 and counts["running"] == counts["queued"] == 0
        assert store.get_sweep(sweep_id).status == "cancelled"


_ORPHAN_SCRIPT = (
    _WAIT
    + """
import os, signal, sys
from gae_core.agent.config import TrainConfig
from gae_core.storage.store import RunStore
from gae_core.runs.sweep import grid_of, start_sweep
store = RunStore(sys.argv[1])
long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2)
assert wait_until(lambda: len(sweep.trial_pids()) == 2, timeout=60)
print(sweep.sweep_id, *sweep.trial_pids().values(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
)


@pytest.mark.slow
def test_killed_coordinator_leaves_no_orphan_training(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    sweep_id, *pids = done.stdout.split()
    workers = [int(pid) for pid in pids]
    assert len(workers) == 2

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")

    try:
        assert wait_until(lambda: all(gone(pid) for pid in workers), timeout=20)
    finally:
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    with RunStore(tmp_path) as store:
        runs = store.list_runs(sweep_id=sweep_id)
        assert {r.status for r in runs} == {"interrupted"}
        started = [r for r in runs if r.started_at is not None]
        assert len(started) == 2
        assert all("stopped without closing the run" in r.error for r in started)
        assert store.get_sweep(sweep_id).status == "interrupted"
        assert store.integrity_check() == "ok"


def _fake_pool(capacity: int, workers: int):
    """A LocalPool over real pipes whose workers are the test (no processes)."""
    import multiprocessing

    from gae_core.runs.gather import Gathering
    from gae_core.runs.pool import LocalPool, WorkerHandle

    class Alive:
        def is_alive(self) -> bool:
            return True

    pool = object.__new__(LocalPool)
    pool.gathering, pool._start_failures, pool._stopped = Gathering(capacity), 0, set()
    ends = [multiprocessing.Pipe(duplex=True) for _ in range(workers)]
    pool.workers = [
        WorkerHandle(Alive(), mine, bytearray(64), ready=True, pid=i)
        for i, (mine, _) in enumerate(ends)
    ]
    return pool, [theirs for _, theirs in ends]


def test_a_worker_holds_one_trial_at_a_time_whatever_order_its_messages_arrive_in():
    """A worker sends "finish" then "idle" for each trial. When the coordinator read "finish",
    submitted the next trial and only then read the old "idle", the pool freed the worker again:
    trials piled up in its pipe and showed as running at step 0. Replayed here message by
    message, through a real pipe."""
    pool, (worker_end,) = _fake_pool(capacity=1, workers=1)
    worker = pool.workers[0]
    try:
        pool.submit(0, "run-0", {})
        pool._send_gathered()
        assert worker_end.recv() == ("trial", [(0, "run-0", {})])
        worker_end.send(Report.finish(0, "finished", None))
        out: list[tuple] = []
        assert pool._drain(worker, out) and out == [Report.finish(0, "finished", None)]
        assert pool.idle_slots() == 1
        pool.submit(1, "run-1", {})  # the next trial goes out before the old "idle" is read
        pool._send_gathered()
        worker_end.send(("idle", [0]))
        assert pool._drain(worker, [])
        assert list(worker.trials) == [1] and pool.idle_slots() == 0  # still busy with trial 1
        worker_end.send(Report.finish(1, "finished", None))
        worker_end.send(("idle", [1]))
        assert pool._drain(worker, []) and pool.idle_slots() == 1
    finally:
        worker.conn.close()
        worker_end.close()


def test_the_pool_takes_a_trial_only_when_it_would_start_at_once():
    """A trial is claimed ("running") only if it starts at the next send: one of a new kind
    takes a whole worker, one of a kind already gathered joins the room of that population
    (normalisation is per member, so a normalised config shares with a plain one), and one of a
    third kind waits in the queue (not in the pool) while both workers are spoken for."""
    pool, ends = _fake_pool(capacity=4, workers=2)
    first, shared, other = TrainConfig(num_envs=8), TrainConfig(), TrainConfig(hidden_sizes=(8,))
    normalised = TrainConfig(normalize_rewards=True, normalize_observations=True)
    try:
        assert pool.idle_slots() == 8 and pool.can_take(first.to_dict())
        pool.submit(0, "run-0", first.to_dict())
        assert pool.can_take(shared.to_dict())  # the other worker, as a population
        pool.submit(1, "run-1", shared.to_dict())
        assert pool.can_take(normalised.to_dict())  # the room left in that population
        pool.submit(2, "run-2", normalised.to_dict())
        for kind in (other, TrainConfig(num_envs=4)):  # a worker of its own: none is left
            assert not pool.can_take(kind.to_dict())
        pool._send_gathered()
        sent = sorted([index for index, _, _ in end.recv()[1]] for end in ends)
        assert sent == [[0], [1, 2]] and not pool.gathering.trials  # everything taken started
        assert not pool.can_take(shared.to_dict())  # both workers busy now
    finally:
        for worker, end in zip(pool.workers, ends, strict=True):
            worker.conn.close()
            end.close()


def test_a_trial_its_worker_left_without_an_end_fails_instead_of_hanging():
    """A worker that goes idle naming a trial it never sent "finish" for (a bug in the worker):
    the trial ends failed with a reason, so the sweep does not wait for it forever."""
    pool, (worker_end,) = _fake_pool(capacity=2, workers=1)
    worker = pool.workers[0]
    try:
        pool.submit(0, "run-0", {})
        pool.submit(1, "run-1", {})
        pool._send_gathered()
        worker_end.recv()
        worker_end.send(Report.finish(0, "finished", None))
        worker_end.send(("idle", [0, 1]))
        out: list[tuple] = []
        assert pool._drain(worker, out) and worker.free
        assert out[0] == Report.finish(0, "finished", None)
        assert (out[1].kind, out[1].index, out[1].status) == ("finish", 1, "failed")
        assert "without reporting" in out[1].error
    finally:
        worker.conn.close()
        worker_end.close()


def _split(configs, capacity, workers, one_at_a_time, skip=()):
    """The populations a fake pool sends, submitting as the coordinator does (in the pool's
    dispatch order, while it can take the next trial; a trial in ``skip`` is claimed by
    nobody: stopped before it started). Workers free up all at once every round, or one at a
    time (one more ready each round, then the busy ones in turn)."""
    pool, ends = _fake_pool(capacity=capacity, workers=workers)
    for worker in pool.workers:
        worker.flags = bytearray(len(configs))
    got = []
    try:
        pending = pool.dispatch_order(configs)
        for worker in pool.workers:
            worker.ready = not one_at_a_time
        rounds = 0
        while pending or pool.gathering.trials:
            freed = [pool.workers[rounds % workers]] if one_at_a_time else pool.workers
            for worker in freed:
                worker.ready, worker.trials = True, {}  # (its population ended)
            while pending and pool.can_take(configs[pending[0]], pending[0]):
                index = pending.pop(0)
                if index not in skip:
                    pool.submit(index, f"run-{index}", configs[index])
            pool._send_gathered()
            for end in ends:
                while end.poll():
                    got.append([index for index, _, _ in end.recv()[1]])
            rounds += 1
            assert rounds < 1000
    finally:
        for worker, end in zip(pool.workers, ends, strict=True):
            worker.conn.close()
            end.close()
    return sorted(got)


@pytest.mark.parametrize("skip", [(), (0,)])
@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize(("trials", "workers", "capacity"), [(70, 2, 35), (10, 4, 3), (9, 2, 5),
                                                            (12, 2, 2)])  # fmt: skip
def test_who_shares_a_population_does_not_depend_on_when_workers_are_free(
    trials, workers, capacity, kinds, skip
):
    """Workers ready all at once, or one at a time (a worker spawned a little later,
    populations ending in different polls): the populations hold the same trials in the same
    order, the ones planned from the whole sweep, so a study's numbers do not depend on its
    workers' timing. Also with two kinds interleaved (hidden sizes × seeds: in index order a
    population went out half gathered whenever the next trial was of the other kind and no
    second worker was free yet), and with a trial stopped before it started (it only leaves
    its planned population smaller)."""
    configs = [
        TrainConfig(seed=i, hidden_sizes=(16,) if kinds == 1 or i % 2 == 0 else (32,)).to_dict()
        for i in range(trials)
    ]
    by_kind: dict = {}
    for i, config in enumerate(configs):
        by_kind.setdefault(tuple(config["hidden_sizes"]), []).append(i)
    planned = [
        ids[i : i + capacity] for ids in by_kind.values() for i in range(0, len(ids), capacity)
    ]
    expected = sorted([i for i in batch if i not in skip] for batch in planned)
    expected = [batch for batch in expected if batch]
    assert _split(configs, capacity, workers, False, skip) == expected
    assert _split(configs, capacity, workers, True, skip) == expected


def test_a_population_lost_in_part_trains_again_without_joining_another():
    """Two members of a planned population of three are lost (the third had ended) while the
    next population of the same kind is gathered: the two go out on their own, not merged."""
    from gae_core.runs.gather import Gathering

    configs = [TrainConfig(seed=i).to_dict() for i in range(6)]
    gathering = Gathering(3)
    assert gathering.dispatch_order(configs) == list(range(6))
    for index in (0, 1, 2):
        gathering.add(index, f"run-{index}", configs[index])
    assert [[i for i, _, _ in batch] for batch in gathering.take(1)] == [[0, 1, 2]]
    for index in (1, 2, 3, 4, 5):  # 1 and 2 queued again ahead of the next population
        assert gathering.can_take(configs[index], 2, index)
        gathering.add(index, f"run-{index}", configs[index])
    assert sorted([i for i, _, _ in batch] for batch in gathering.take(2)) == [[1, 2], [3, 4, 5]]


def test_the_dispatch_order_runs_each_planned_population_consecutively():
    """Each kind's trials in consecutive batches of the capacity, the batches ordered by their
    first trial (a kind with one trial is a batch of one); no reordering at capacity 1."""
    from gae_core.runs.gather import Gathering

    small, big, alone = (
        TrainConfig(num_envs=2), TrainConfig(num_envs=4), TrainConfig(algo="ppo")
    )  # fmt: skip
    kinds = [small, big, small, alone, big, small, small, big]
    configs = [dict(c.to_dict(), seed=i) for i, c in enumerate(kinds)]
    # small: 0 2 5 6 -> [0, 2] [5, 6]; big: 1 4 7 -> [1, 4] [7]; alone: [3]
    assert Gathering(2).dispatch_order(configs) == [0, 2, 1, 4, 3, 5, 6, 7]
    assert Gathering(1).dispatch_order(configs) == list(range(8))


def test_trials_of_different_budgets_train_in_different_populations():
    """A budget is part of a trial's kind: a member whose budget ends before another's would
    end on a shorter last rollout than its lone run (``Gathering.kind``), so a sweep over
    budgets puts each budget's trials in populations of their own, in index order."""
    from gae_core.runs.gather import Gathering

    budgets = [20_000, 40_000, 20_000, 40_000, 20_000, 40_000]
    configs = [TrainConfig(seed=i, total_steps=b).to_dict() for i, b in enumerate(budgets)]
    gathering = Gathering(3)
    assert gathering.dispatch_order(configs) == [0, 2, 4, 1, 3, 5]
    assert len({gathering.kind(c) for c in configs}) == 2


def test_trials_that_can_share_a_population_go_together_in_order():
    """7 trials of one kind and 2 of another (more envs), 2 free workers, at most 5 members
    each: the 7 go out as populations of trials 0–4 and 5–6 (consecutive, never over 5), the
    other kind waits for a free worker, and each worker holds only one kind."""
    pool, ends = _fake_pool(capacity=5, workers=2)
    small, big = TrainConfig(num_envs=2), TrainConfig(num_envs=4)
    try:
        assert pool.idle_slots() == 10
        for i in range(7):
            pool.submit(i, f"run-{i}", dict(small.to_dict(), seed=i))
        pool.submit(7, "run-7", big.to_dict())
        pool.submit(8, "run-8", big.to_dict())
        pool._send_gathered()
        batches = [[index for index, _, _ in end.recv()[1]] for end in ends]
        assert sorted(batches) == [[0, 1, 2, 3, 4], [5, 6]]
        assert pool.idle_slots() == 0 and [t[0] for _, t in pool.gathering.trials] == [7, 8]
        for index in batches[0]:
            ends[0].send(Report.finish(index, "finished", None))
        assert pool._drain(pool.workers[0], []) and pool.workers[0].free
        pool._send_gathered()
        assert [index for index, _, _ in ends[0].recv()[1]] == [7, 8]
    finally:
        for worker, end in zip(pool.workers, ends, strict=True):
            worker.conn.close()
            end.close()


class _ScriptedBackend:
    """A backend with one slot for two trials that records what the coordinator submits, in
    which order; the first two trials it is given are lost together (their worker "died"),
    the rest finish at once."""

    name = "scripted"

    def __init__(self, workers: int, trials: int, flush_interval: float) -> None:
        self.order = list(range(trials))[::-1]  # any order other than the index order
        self.submitted: list[int] = []
        self.running: list[int] = []
        self.lost = False

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        return list(self.order)

    def can_take(self, config: dict, index: int | None = None) -> bool:
        return len(self.running) < 2

    def submit(self, index: int, run_id: str, config: dict) -> None:
        self.submitted.append(index)
        self.running.append(index)

    def stop(self, index: int) -> None:
        pass

    def events(self, timeout: float) -> list:
        if not self.lost:
            self.lost = True
            out = [Lost(index, "scripted worker died") for index in self.running]
        else:
            out = [Report.finish(index, "finished", None) for index in self.running]
        self.running = []
        return out

    def trial_pids(self) -> dict[int, int]:
        return {}

    def close(self) -> None:
        pass


def test_the_coordinator_submits_in_the_backends_dispatch_order(tmp_path):
    """The sweep submits its trials in the order the backend plans its populations in, and
    lost trials go back to their places in that order (ahead of the trials never started)."""
    backends: list[_ScriptedBackend] = []

    def factory(workers: int, trials: int, flush: float) -> _ScriptedBackend:
        backends.append(_ScriptedBackend(workers, trials, flush))
        return backends[-1]

    with RunStore(tmp_path) as store:
        progress = run_sweep(
            store, TrainConfig(total_steps=100), grid_of(seeds=[0, 1, 2, 3]), backend=factory
        )
        assert progress.status == "finished" and progress.counts["finished"] == 4
    (backend,) = backends
    # 3 and 2 lost together, queued again in their order, ahead of 1 and 0
    assert backend.submitted == [3, 2, 3, 2, 1, 0]


class _StopOneBackend:
    """A backend whose trials each flush once and then finish, as fast as the coordinator
    asks; on trial 0's submit a user stops its run through the store (the Runs page's Stop,
    ``stop RUN_ID``), so its flush is answered "stop" and it ends ``stopped``."""

    name = "scripted"

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.running: dict[int, str] = {}  # index → what it sends next: flush, finish
        self.stopped: set[int] = set()

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        return list(range(len(configs)))

    def can_take(self, config: dict, index: int | None = None) -> bool:
        return True

    def submit(self, index: int, run_id: str, config: dict) -> None:
        if index == 0:
            with RunStore(self.store_dir) as other:
                assert other.request_stop(run_id) == "running"
        self.running[index] = "flush"

    def stop(self, index: int) -> None:
        self.stopped.add(index)

    def events(self, timeout: float) -> list:
        out = []
        for index, next_kind in list(self.running.items()):
            if next_kind == "flush":
                out.append(Report.flush(index, [("x", 8, 0.1, 1.0)], 8, RunSummary()))
                self.running[index] = "finish"
            else:
                status = "stopped" if index in self.stopped else "finished"
                out.append(Report.finish(index, status, None))
                del self.running[index]
        return out

    def trial_pids(self) -> dict[int, int]:
        return {}

    def close(self) -> None:
        pass


def test_stopping_one_trial_ends_it_stopped_and_the_sweep_finished(tmp_path):
    """A user stopping one trial of a sweep stops that trial alone: the others finish, and the
    sweep ends ``finished`` (not ``cancelled``, which is for a cancel of the whole sweep) with
    the stopped trial counted in its error."""
    with RunStore(tmp_path) as store:
        progress = run_sweep(
            store,
            TrainConfig(total_steps=100),
            grid_of(seeds=[0, 1, 2]),
            backend=lambda workers, trials, flush: _StopOneBackend(tmp_path),
        )
        assert progress.counts["stopped"] == 1 and progress.counts["finished"] == 2
        assert progress.status == "finished"
        error = store.get_sweep(progress.sweep_id).error
        assert error == "1 of 3 trials stopped by request"


def test_a_retried_trial_keeps_the_record_of_its_lost_attempt_when_it_finishes(tmp_path):
    """A trial whose worker died is run again; when the retry finishes, its ``error`` still
    says that the first attempt was lost (and ``runs --json`` shows it); a trial that was
    never lost finishes with no error."""
    with RunStore(tmp_path) as store:
        progress = run_sweep(
            store, TrainConfig(total_steps=100), grid_of(seeds=[0, 1, 2, 3]),
            backend=_ScriptedBackend,
        )  # fmt: skip
        assert progress.status == "finished" and progress.counts["finished"] == 4
        runs = {r.config["seed"]: r for r in store.list_runs(sweep_id=progress.sweep_id)}
    note = "attempt 2: the previous scripted worker died"
    assert runs[3].error == runs[2].error == note  # lost together, then finished
    assert runs[1].error is None and runs[0].error is None
    listed = cli_in_process(tmp_path, "runs", "--sweep", progress.sweep_id, "--json")
    rows = {row["seed"]: row for row in json.loads(listed.stdout)}
    assert rows[3]["status"] == "finished" and rows[3]["error"] == note


class _CheckpointBackend(_StopOneBackend):
    """Each trial sends one 256 KiB checkpoint, then finishes (nobody stops one)."""

    def submit(self, index: int, run_id: str, config: dict) -> None:
        self.running[index] = "flush"

    def events(self, timeout: float) -> list:
        out = []
        for index, next_kind in list(self.running.items()):
            if next_kind == "flush":
                out.append(Report.checkpoint(index, 8, os.urandom(256 * 1024), ()))
                self.running[index] = "finish"
            else:
                out.append(Report.finish(index, "finished", None))
                del self.running[index]
        return out


def fill_the_disk_on_first_report(monkeypatch) -> None:
    """From the coordinator's first report on, its store's file cannot grow: SQLite answers
    "database or disk is full", as on a full disk."""
    from gae_core.runs import sweep as sweep_module

    real = sweep_module.apply

    def apply(store: RunStore, run_id: str, report: Report) -> bool:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        return real(store, run_id, report)

    monkeypatch.setattr(sweep_module, "apply", apply)


def test_a_full_disk_ends_the_sweep_failed_with_one_line(tmp_path, monkeypatch):
    """The store refusing a sweep's writes for a full disk (StoreFull) ends the sweep: its
    coordinator does not die leaving it ``running``; it ends ``failed`` with one line naming
    the full disk, its trials are no longer active, and the store stays readable."""
    fill_the_disk_on_first_report(monkeypatch)
    with RunStore(tmp_path) as store:
        sweep = start_sweep(
            store, TrainConfig(total_steps=100), grid_of(seeds=[0, 1]),
            backend=lambda workers, trials, flush: _CheckpointBackend(tmp_path),
        )  # fmt: skip
        assert sweep.wait(timeout=30)
        assert sweep.status == "failed"
        assert sweep.error is not None and "\n" not in sweep.error and "is full" in sweep.error
        assert store.get_sweep(sweep.sweep_id).status == "failed"  # this update still fit
        runs = store.list_runs(sweep_id=sweep.sweep_id)
        assert [r.status for r in runs] == ["failed", "failed"]
        assert all("is full" in r.error and "\n" not in r.error for r in runs)


class _UntilStoppedBackend(_StopOneBackend):
    """Trials that flush until asked to stop, then end ``stopped`` 0.3 s later (an update
    finishing)."""

    def __init__(self) -> None:
        self.running, self.stopped = {}, {}

    def submit(self, index: int, run_id: str, config: dict) -> None:
        self.running[index] = "flush"

    def stop(self, index: int) -> None:
        self.stopped.setdefault(index, time.monotonic() + 0.3)

    def events(self, timeout: float) -> list:
        time.sleep(min(timeout, 0.05))
        out = []
        for index in list(self.running):
            if time.monotonic() >= self.stopped.get(index, float("inf")):
                out.append(Report.finish(index, "stopped", None))
                del self.running[index]
            else:
                out.append(Report.flush(index, [("x", 8, 0.1, 1.0)], 8, RunSummary()))
        return out


def test_ctrl_c_while_waiting_for_a_sweep_waits_for_its_trials_to_stop(tmp_path):
    """Ctrl-C in :func:`run_sweep` cancels the sweep and returns once every trial has ended
    ``stopped``. (On Python 3.11 a ``Thread.join`` interrupted by Ctrl-C leaves the thread
    looking dead: a sweep waited on by joining its thread returned while still running.)"""
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with RunStore(tmp_path) as store:
            progress = run_sweep(
                store, TrainConfig(total_steps=100), grid_of(seeds=[0, 1]),
                backend=lambda workers, trials, flush: _UntilStoppedBackend(),
            )  # fmt: skip
            assert progress.status == "cancelled", progress
            assert progress.counts["stopped"] == sum(progress.counts.values()) == 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
