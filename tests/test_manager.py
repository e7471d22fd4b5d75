"""Run manager with the real trainer: lifecycle, prompt stop, concurrency, failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import StoreSink, stored_and_stepped, stored_update_metric, wait_until

from gae_core import metrics as M
from gae_core.agent.config import ConfigError, TrainConfig
from gae_core.agent.trainer import Trainer, TrainingDiverged
from gae_core.runs.execute import execute_run
from gae_core.runs.manager import RunManager
from gae_core.storage.store import RunStore
from gae_core.trajectory import Trajectory

SMALL = {"num_envs": 4, "rollout_steps": 16, "total_steps": 2000, "hidden_sizes": (16,)}
LONG = {**SMALL, "total_steps": 10**8}


def _run_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gae-run-")]


@pytest.fixture
def manager(tmp_path):
    store = RunStore(tmp_path)
    manager = RunManager(store)
    yield manager
    assert manager.shutdown(timeout=10)
    store.close()


def test_run_to_finish_with_checkpoints(manager):
    config = TrainConfig(**SMALL, checkpoint_every=1000, record_episodes=2, seed=1)
    run_id = manager.start(config, name="tiny")
    assert manager.wait(run_id, timeout=60)
    run = manager.store.get_run(run_id)
    assert run.status == "finished", run.error
    assert run.name == "tiny" and run.config == config.to_dict()
    assert run.env_steps >= 2000 and run.started_at is not None and run.ended_at is not None
    keys = set(manager.store.metrics(run_id)["key"])
    assert {M.POLICY_LOSS.key, M.VALUE_LOSS.key, M.EPISODIC_RETURN.key} <= keys
    returns = manager.store.metrics(run_id, [M.EPISODIC_RETURN.key])
    assert run.summary.episodes == len(returns) > 0
    assert run.summary.final_return == pytest.approx(returns["value"].tail(100).mean())
    assert run.summary.reward_threshold == 475.0 and run.summary.solved is False
    steps = manager.store.checkpoint_steps(run_id)
    assert steps[-1] == run.env_steps  # the final checkpoint
    assert len(steps) >= 2 and steps[0] >= 1000
    blobs = manager.store.trajectory_blobs(run_id, steps[0])
    trajectories = [Trajectory.from_bytes(b) for b in blobs]
    assert len(trajectories) == 2 and all(isinstance(t, Trajectory) for t in trajectories)
    assert len(trajectories[0].rewards) > 0
    assert manager.outcome(run_id).status == "finished"
    assert manager.active() == []


def test_a_run_without_a_name_is_named_by_its_algorithm_env_lambda_gamma_and_seed(manager):
    for algo in ("a2c", "ppo"):
        config = TrainConfig(**{**SMALL, "total_steps": 64}, algo=algo, lambda_=0.9, seed=3)
        run_id = manager.start(config)
        assert manager.wait(run_id, timeout=60)
        name = manager.store.get_run(run_id).name
        assert name == f"{algo.upper()} {config.env_id} λ = 0.9 γ = {config.gamma} seed = 3"


def test_stop_within_one_second_and_no_thread_left(manager):
    run_id = manager.start(TrainConfig(**LONG))
    # Metrics reach the store while it runs: flushed at least every second.
    assert wait_until(lambda: manager.store.get_run(run_id).env_steps > 0, timeout=10)
    assert len(manager.store.metrics(run_id)) > 0
    assert manager.active() == [run_id] and _run_threads() == [f"gae-run-{run_id}"]
    started = time.monotonic()
    manager.stop(run_id)
    assert manager.wait(run_id, timeout=5)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"stop took {elapsed:.2f}s"
    assert _run_threads() == []
    run = manager.store.get_run(run_id)
    assert run.status == "stopped" and run.error is None
    assert manager.store.checkpoint_steps(run_id)[-1] == run.env_steps
    assert manager.store.metrics(run_id)["env_step"].max() <= run.env_steps


def test_flush_interval_bounds_data_loss(manager):
    run_id = manager.start(TrainConfig(**LONG))
    assert wait_until(lambda: manager.store.get_run(run_id).env_steps > 0, timeout=10)
    first = manager.store.get_run(run_id).env_steps
    time.sleep(1.3)
    assert manager.store.get_run(run_id).env_steps > first  # another flush within ~1 s
    manager.stop(run_id)
    assert manager.wait(run_id, timeout=5)


def test_stop_through_the_store(manager):
    # The dashboard stops runs that another process owns by setting a flag in the store.
    run_id = manager.start(TrainConfig(**LONG))
    assert wait_until(lambda: manager.store.get_run(run_id).status == "running")
    manager.store.request_stop(run_id)
    assert manager.wait(run_id, timeout=5)
    assert manager.store.get_run(run_id).status == "stopped"


def test_four_concurrent_runs_keep_their_data_apart(manager):
    configs = [
        TrainConfig(**SMALL, seed=seed, lambda_=lam)
        for seed, lam in [(0, 0.9), (1, 0.95), (2, 1.0), (3, 0.0)]
    ]
    run_ids = [manager.start(c) for c in configs]
    assert len(set(run_ids)) == 4
    assert len(_run_threads()) >= 1
    for run_id in run_ids:
        assert manager.wait(run_id, timeout=60)
    # Training is deterministic per seed: each run's stored losses must equal a fresh
    # sequential run of its own config, so no row landed in the wrong run.
    for run_id, config in zip(run_ids, configs, strict=True):
        run = manager.store.get_run(run_id)
        assert run.status == "finished", run.error
        assert run.config["seed"] == config.seed and run.config["lambda_"] == config.lambda_
        stored = manager.store.metrics(run_id, [M.VALUE_LOSS.key])
        trainer = Trainer(config)
        updates = []
        while not trainer.done:
            result = trainer.step()[0]
            updates.append((result.env_steps, result.metrics.get(M.VALUE_LOSS.key)))
        trainer.close()
        # a row per log_every (1,000) env steps: the mean of the updates since the last row
        expected = stored_update_metric(updates, config.log_every)
        assert len(expected) < len(updates)
        assert stored["env_step"].tolist() == [s for s, _ in expected]
        np.testing.assert_allclose(stored["value"].to_numpy(), [v for _, v in expected], rtol=1e-6)
        assert run.env_steps == trainer.member(0).env_steps


def test_update_metrics_are_stored_as_window_means_closed_at_checkpoints(tmp_path):
    """A row per metric each time the run crosses a multiple of log_every: the mean of the
    updates since the last row (the wall-time clock: its last value). A checkpoint closes the
    window too, so the stored curve reaches every checkpoint's step."""
    config = TrainConfig(**{**SMALL, "log_every": 300, "checkpoint_every": 700})
    store, run_id, updates = stored_and_stepped(tmp_path, config)
    steps = store.checkpoint_steps(run_id)
    for metric in (M.VALUE_LOSS, M.GRAD_NORM, M.WALL_TIME):
        stored = store.metrics(run_id, [metric.key])
        values = [(s, m.get(metric.key)) for s, m in updates]
        by_log_every_alone = {s for s, _ in stored_update_metric(values, config.log_every)}
        assert not set(steps) <= by_log_every_alone  # the checkpoints close windows of their own
        expected = stored_update_metric(values, config.log_every, also=config.checkpoint_every)
        assert stored["env_step"].tolist() == [s for s, _ in expected]
        assert set(steps) <= set(stored["env_step"])
        if metric is not M.WALL_TIME:  # a clock: its last value, which differs between runs
            np.testing.assert_allclose(stored["value"], [v for _, v in expected], rtol=1e-6)
    store.close()


def test_diverged_loss_marks_failed_with_reason(manager, monkeypatch):
    real_update = Trainer.update

    def update(self, active):
        if self.updates >= 2:
            raise TrainingDiverged(f"loss became nan at update {self.updates}")
        return real_update(self, active)

    monkeypatch.setattr(Trainer, "update", update)
    run_id = manager.start(TrainConfig(**LONG))
    assert manager.wait(run_id, timeout=30)
    run = manager.store.get_run(run_id)
    assert run.status == "failed"
    assert run.error == "TrainingDiverged: loss became nan at update 2"
    # kept: the updates before the failure (in one row: under log_every's 1,000 env steps)
    assert len(manager.store.metrics(run_id, [M.VALUE_LOSS.key])) == 1


def test_any_other_exception_fails_with_traceback(manager, monkeypatch):
    def collect(self, active):
        raise KeyError("boom in collect")

    monkeypatch.setattr(Trainer, "collect", collect)
    run_id = manager.start(TrainConfig(**LONG))
    assert manager.wait(run_id, timeout=30)
    run = manager.store.get_run(run_id)
    assert run.status == "failed"
    assert run.error.startswith("Traceback") and "boom in collect" in run.error


def test_bad_config_and_shutdown(tmp_path):
    store = RunStore(tmp_path)
    manager = RunManager(store)
    with pytest.raises(ConfigError, match="lambda_"):
        manager.start({**SMALL, "lambda_": 1.5})
    assert store.list_runs() == []  # nothing half-created
    run_ids = [manager.start(TrainConfig(**LONG, seed=s)) for s in range(2)]
    assert wait_until(lambda: all(store.get_run(r).status == "running" for r in run_ids))
    assert manager.shutdown(timeout=5)
    assert _run_threads() == []
    assert {store.get_run(r).status for r in run_ids} == {"stopped"}
    with pytest.raises(RuntimeError, match="shut down"):
        manager.start(TrainConfig(**SMALL))
    store.close()


class _RecordingSink:
    """A sink that keeps every flush (env steps, metric keys) and every checkpoint step."""

    def __init__(self) -> None:
        self.flushes: list[tuple[int, set[str]]] = []

    def claim(self) -> bool:
        return True

    def flush(self, rows, env_steps, summary) -> bool:
        self.flushes.append((env_steps, {row[0] for row in rows}))
        return False

    def checkpoint(self, env_step, blob, trajectories) -> None:
        pass

    def finish(self, status, error) -> None:
        self.status = status


def test_the_first_episode_is_flushed_at_once_then_every_interval():
    """A live chart gets its first point right away: the update that ends the first episode
    flushes, even though the flush interval (an hour here) is far from due."""
    sink = _RecordingSink()
    config = TrainConfig(**{**SMALL, "checkpoint_every": 0, "eval_every": 0})
    (outcome,) = execute_run([sink], ["r"], [config], [threading.Event()], flush_interval=3600.0)
    assert outcome.status == "finished" == sink.status
    with_returns = [steps for steps, keys in sink.flushes if M.EPISODIC_RETURN.key in keys]
    # the first flush carries the first returns, long before the end; then only the final flush
    assert len(sink.flushes) == 2 and with_returns[0] < outcome.env_steps // 2
    assert sink.flushes[-1][0] == outcome.env_steps


def test_execute_run_skips_cancelled_trial(tmp_path):
    store = RunStore(tmp_path)
    config = TrainConfig(**SMALL)
    run_id = store.create_run(config.to_dict())
    store.request_stop(run_id)
    (outcome,) = execute_run([StoreSink(store, run_id)], [run_id], [config], [threading.Event()])
    assert outcome.status == "skipped" and store.metrics(run_id).empty
    assert store.get_run(run_id).status == "stopped"
    store.close()


_EXIT_SCRIPT = """
import sys, time
from gae_core.agent.config import TrainConfig
from gae_core.runs.manager import RunManager
from gae_core.storage.store import RunStore
store = RunStore(sys.argv[1])
manager = RunManager(store)
run_id = manager.start(TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8))
while store.get_run(run_id).env_steps == 0:
    time.sleep(0.05)
print(run_id, flush=True)
# The script ends with the run still going: the exit hook must stop it cleanly.
"""


@pytest.mark.slow
def test_interpreter_exit_stops_runs_cleanly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    with RunStore(tmp_path) as store:
        run = store.get_run(run_id)
        assert run.status == "stopped" and run.env_steps > 0
        assert store.checkpoint_steps(run_id)[-1] == run.env_steps


# ----------------------------------------------------------------------- runs in worker processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has exited


@pytest.mark.slow
def test_process_runs_finish_stop_and_survive_a_kill(tmp_path):
    """processes=True: each run is a sweep of one on the local pool: it trains in a worker
    process (the warm spare first), this process applies its reports to the store, a stop
    ends it ``stopped`` with its data, and a -9 leaves the run ``interrupted`` with the
    worker's exit code while the other run trains on."""
    store = RunStore(tmp_path)
    manager = RunManager(store, processes=True)
    manager.warm_up()
    spare = manager._spare.process.pid
    finished = manager.start(TrainConfig(**SMALL, checkpoint_every=1000, seed=1))
    assert wait_until(lambda: manager.pid(finished) is not None, timeout=30)
    assert manager.pid(finished) == spare  # the warm spare took the run
    assert manager.wait(finished, timeout=60)
    run = store.get_run(finished)
    assert run.status == "finished" and run.env_steps >= SMALL["total_steps"]
    assert manager.outcome(finished).status == "finished"
    assert store.checkpoint_steps(finished)[-1] == run.env_steps
    assert wait_until(lambda: not _alive(spare), timeout=10)  # its worker exits with the run
    assert _run_threads() == []  # no training thread in this process

    stopped = manager.start(TrainConfig(**LONG, seed=2))
    killed = manager.start(TrainConfig(**LONG, seed=3))
    assert wait_until(
        lambda: store.get_run(stopped).env_steps > 0 < store.get_run(killed).env_steps
    )
    child = manager.pid(killed)
    assert child != os.getpid() and _alive(child)
    os.kill(child, signal.SIGKILL)
    assert manager.wait(killed, timeout=30)
    assert store.get_run(killed).status == "interrupted"
    assert "exit code -9" in manager.outcome(killed).error
    steps = store.get_run(stopped).env_steps
    assert wait_until(lambda: store.get_run(stopped).env_steps > steps)  # the other run goes on
    start = time.monotonic()
    manager.stop(stopped)
    assert manager.wait(stopped, timeout=30)
    print(f"process run: stop → ended in {time.monotonic() - start:.2f} s")
    assert store.get_run(stopped).status == "stopped"
    assert wait_until(lambda: manager._spare is not None)  # the next spare, a little after a Start
    spare = manager._spare.process.pid
    assert manager.shutdown(timeout=10)
    assert wait_until(lambda: not _alive(spare), timeout=10)  # the unused spare goes too
    store.close()


@pytest.mark.slow
def test_a_dead_spare_is_replaced_and_the_next_spare_waits_for_the_run_to_begin(tmp_path):
    store = RunStore(tmp_path)
    manager = RunManager(store, processes=True, spare_delay_s=1.0)
    manager.warm_up()
    dead = manager._spare.process.pid
    os.kill(dead, signal.SIGKILL)
    assert wait_until(lambda: not _alive(dead), timeout=10)
    run_id = manager.start(TrainConfig(**SMALL, seed=4))
    assert manager._spare is None  # no torch import competing with the run's first second
    assert wait_until(lambda: manager.pid(run_id) is not None, timeout=30)
    assert manager.pid(run_id) != dead  # a cold process took the run
    assert manager.wait(run_id, timeout=60) and store.get_run(run_id).status == "finished"
    assert wait_until(lambda: manager._spare is not None, timeout=10)
    spare = manager._spare.process.pid
    assert manager.shutdown(timeout=10)
    assert wait_until(lambda: not _alive(spare), timeout=10)
    store.close()


_ORPHAN_SCRIPT = """
import sys, time
from gae_core.runs.manager import RunManager
from gae_core.storage.store import RunStore
manager = RunManager(RunStore(sys.argv[1]), processes=True)
run_id = manager.start({"num_envs": 4, "rollout_steps": 16, "total_steps": 10**8})
while manager.store.get_run(run_id).env_steps == 0:
    time.sleep(0.05)
print(run_id, manager.pid(run_id), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_server_killed_with_9_leaves_no_orphan_training(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        run_id, child = server.stdout.readline().split()
        server.kill()
        server.wait(10)
        assert wait_until(lambda: not _alive(int(child)), timeout=15)
    finally:
        server.kill()
    with RunStore(tmp_path) as store:  # opening recovers: the server's claim died with it
        run = store.get_run(run_id)
        assert run.status == "interrupted" and run.env_steps > 0
        assert len(store.metrics(run_id)) > 0  # what was flushed before the kill is kept
