"""Sweeps: grid expansion, a 2-worker sweep in spawned processes, cancellation."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gae_core.config import ConfigError, TrainConfig
from gae_core.store import RunStore
from gae_core.sweep import expand_grid, grid_of, run_sweep, start_sweep, wait_until
from gae_core.trainer import Trainer

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
    with pytest.raises(ConfigError, match="lambda_"):
        expand_grid(BASE, grid_of(lambdas=[0.9, 1.5]))
    with pytest.raises(ConfigError, match="unknown config field 'lamda'"):
        expand_grid(BASE, {"lamda": [0.9]})
    with pytest.raises(ConfigError, match="seed needs at least one value"):
        expand_grid(BASE, grid_of(seeds=[]))


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
        assert run.name.startswith("tiny λ=") and run.env_steps >= 2000
        assert len(store.metrics(run.id, ["losses/value_loss"])) > 0
    # A trial trained in a worker process equals the same config trained here.
    run = next(r for r in runs if r.config["lambda_"] == 1.0 and r.config["seed"] == 1)
    trainer = Trainer(TrainConfig.from_dict(run.config))
    expected = []
    while not trainer.done:
        expected.append(trainer.step().metrics["losses/value_loss"])
    trainer.close()
    stored = store.metrics(run.id, ["losses/value_loss"])["value"].to_numpy()
    np.testing.assert_allclose(stored, expected, rtol=1e-6)
    assert store.integrity_check() == "ok"
    store.close()


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


def test_killed_worker_fails_the_sweep_and_leaves_nothing_active(tmp_path):
    store = RunStore(tmp_path)
    long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
    sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2)
    assert wait_until(lambda: sweep.progress().counts["running"] >= 1, timeout=60)
    raw = sqlite3.connect(store.path)
    (victim_run, pid), *_ = raw.execute(
        "SELECT id, owner_pid FROM runs WHERE status = 'running' AND sweep_id = ?",
        (sweep.sweep_id,),
    ).fetchall()
    raw.close()
    assert pid != os.getpid()  # claimed by a worker process
    os.kill(pid, signal.SIGKILL)
    assert sweep.wait(timeout=60)
    progress = sweep.progress()
    assert progress.status == "failed"
    assert progress.counts["queued"] == progress.counts["running"] == 0
    assert store.get_run(victim_run).status == "interrupted"
    assert "BrokenProcessPool" in store.get_sweep(sweep.sweep_id).error
    assert store.integrity_check() == "ok"
    store.close()


_EXIT_SCRIPT = """
import sys
from gae_core.config import TrainConfig
from gae_core.store import RunStore
from gae_core.sweep import grid_of, start_sweep, wait_until
store = RunStore(sys.argv[1])
long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2)
assert wait_until(lambda: sweep.progress().counts["running"] == 2, timeout=60)
print(sweep.sweep_id, flush=True)
# The script ends mid-sweep: the exit hook cancels it instead of waiting for 10**8 steps.
"""


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


_ORPHAN_SCRIPT = """
import os, signal, sys
from gae_core.config import TrainConfig
from gae_core.store import RunStore
from gae_core.sweep import grid_of, start_sweep, wait_until
store = RunStore(sys.argv[1])
long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2)
assert wait_until(lambda: sweep.progress().counts["running"] == 2, timeout=60)
print(sweep.sweep_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_coordinator_leaves_no_orphan_training(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    sweep_id = done.stdout.strip()
    raw = sqlite3.connect(tmp_path / "runs.sqlite3")
    workers = [
        pid
        for (pid,) in raw.execute(
            "SELECT owner_pid FROM runs WHERE sweep_id = ? AND started_at IS NOT NULL",
            (sweep_id,),
        )
    ]
    raw.close()
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
        assert all("coordinating process died" in r.error for r in started)
        assert store.get_sweep(sweep_id).status == "interrupted"
        assert store.integrity_check() == "ok"
