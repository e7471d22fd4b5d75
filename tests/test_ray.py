"""The Ray sweep backend on a local Ray (2 CPUs): the same per-trial metrics as the local pool,
stop and cancel, a killed Ray worker re-queued, a killed coordinator leaving nothing running.

Ray is an optional extra for users but part of the test requirements: without it these tests
skip, except under ``CI=true`` where they fail (CI must exercise the Ray backend)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_FLAGS, app, cli_env, wait_until

from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.errors import ConfigError
from gae_core.runs.backends import backend_factory
from gae_core.runs.sweep import grid_of, run_sweep, start_sweep
from gae_core.storage.store import DB_FILENAME, RunStore

if os.environ.get("CI", "").strip().lower() == "true":
    import ray  # a missing ray is a failure in CI, not a skip
else:
    ray = pytest.importorskip("ray", reason="pip install -r requirements-ray.txt")

pytestmark = pytest.mark.slow

SMALL = {"num_envs": 4, "rollout_steps": 16, "hidden_sizes": (16,)}
LONG = TrainConfig(**SMALL, total_steps=10**8)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    from gae_core.runs.ray_pool import RUNTIME_ENV

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=RUNTIME_ENV)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _curves(store: RunStore) -> dict:
    """Per trial (λ, seed): every metric's (key, env step, value); wall times and speed (the
    ``perf/`` metrics) left out."""
    out = {}
    for run in store.list_runs():
        frame = store.metrics(run.id)
        frame = frame[frame["key"].map(lambda k: M.get(k).namespace) != "perf"]
        key = (run.config["lambda_"], run.config["seed"])
        values = ["nan" if v != v else v for v in frame["value"]]  # NaN == NaN for this check
        out[key] = sorted(zip(frame["key"], frame["env_step"], values, strict=True), key=str)
    return out


@pytest.mark.parametrize(
    "env",
    [
        {},  # CartPole: its native vector env
        # a MuJoCo task with per-member observation and reward normalisation (its presets')
        dict(env_id="InvertedPendulum-v5", normalize_observations=True, normalize_rewards=True),
    ],
    ids=["CartPole", "MuJoCo-normalised"],
)
def test_the_same_sweep_gives_the_same_trials_on_both_backends(tmp_path, local_ray, env):
    """Alone (one trial per worker or task) and as populations (two trials per worker or task,
    gathered by the one rule both backends share): each trial's curve is the same on both
    backends, and populations really formed (their curves are not the lone trials')."""
    base = TrainConfig(**SMALL, **env, total_steps=3000, checkpoint_every=1000)
    grid = grid_of(lambdas=[0.9, 1.0], seeds=[0, 1])
    curves, checkpoints = {}, {}
    for members in (1, 2):
        for name in ("local", "ray"):
            with RunStore(tmp_path / f"{name}-{members}") as store:
                backend = backend_factory(name, members=members)
                progress = run_sweep(store, base, grid, workers=2, backend=backend)
                assert progress.status == "finished" and progress.counts["finished"] == 4
                curves[name, members] = _curves(store)
                checkpoints[name, members] = sorted(
                    len(store.checkpoint_steps(r.id)) for r in store.list_runs()
                )
                assert store.integrity_check() == "ok"
        assert curves["ray", members] == curves["local", members]  # deterministic per seed
        assert checkpoints["ray", members] == checkpoints["local", members] == [3, 3, 3, 3]
    for trial in curves["ray", 1]:
        assert curves["ray", 2][trial] != curves["ray", 1][trial]


def test_cancel_reaches_ray_trials_and_keeps_their_data(tmp_path, local_ray):
    store = RunStore(tmp_path)
    sweep = start_sweep(store, LONG, grid_of(seeds=[0, 1, 2]), workers=2,
                        backend=backend_factory("ray"))  # fmt: skip
    assert wait_until(
        lambda: sum(store.get_run(r).env_steps > 0 for r in sweep.run_ids) == 2, timeout=90
    )
    start = time.monotonic()
    sweep.cancel()
    assert sweep.wait(timeout=30)
    print(f"\nRay: cancel → every trial closed in {time.monotonic() - start:.2f} s (target ~2 s)")
    runs = store.list_runs(sweep_id=sweep.sweep_id)
    assert [r.status for r in runs] == ["stopped"] * 3
    assert sorted(r.env_steps > 0 for r in runs) == [False, True, True]  # data kept
    assert store.get_sweep(sweep.sweep_id).status == "cancelled"
    store.close()


@pytest.mark.parametrize("members", [1, 2])
def test_a_killed_ray_worker_requeues_its_trial_once(tmp_path, local_ray, members):
    """One trial per task, or two (``members=2``): every trial of the killed task is re-queued,
    once, and trains again to the end; the other task's trials go on."""
    store = RunStore(tmp_path)
    config = TrainConfig(**SMALL, total_steps=60_000)
    seeds = list(range(2 * members))
    sweep = start_sweep(store, config, grid_of(seeds=seeds), workers=2,
                        backend=backend_factory("ray", members=members))  # fmt: skip
    victim = sweep.run_ids[0]
    assert wait_until(
        lambda: victim in sweep.trial_pids() and store.get_run(victim).env_steps > 0, 90
    )
    pid = sweep.trial_pids()[victim]
    assert pid != os.getpid()
    together = sorted(r for r, p in sweep.trial_pids().items() if p == pid)
    assert len(together) == members  # the trials of the victim's task
    os.kill(pid, signal.SIGKILL)
    for run_id in together:
        assert wait_until(lambda r=run_id: "attempt 2: the previous Ray task" in (
            store.get_run(r).error or ""), 60)  # fmt: skip
    assert sweep.wait(timeout=180)
    runs = [store.get_run(r) for r in sweep.run_ids]
    assert [r.status for r in runs] == ["finished"] * len(seeds)  # the retries ran to the end
    assert all(r.env_steps >= 60_000 for r in runs)
    others = [r for r in runs if r.id not in together]
    assert all("attempt 2" not in (r.error or "") for r in others)
    assert store.get_sweep(sweep.sweep_id).status == "finished"
    store.close()


_ORPHAN_SCRIPT = """
import os, signal, sys, time
import ray
from gae_core.runs.ray_pool import RUNTIME_ENV
from gae_core.agent.config import TrainConfig
from gae_core.storage.store import RunStore
from gae_core.runs.backends import backend_factory
from gae_core.runs.sweep import grid_of, start_sweep
store = RunStore(sys.argv[1])
ray.init(address=sys.argv[2], log_to_driver=False, runtime_env=RUNTIME_ENV)
long = TrainConfig(num_envs=4, rollout_steps=16, total_steps=10**8, hidden_sizes=(16,))
sweep = start_sweep(store, long, grid_of(seeds=[0, 1, 2]), workers=2,
                    backend=backend_factory("ray"))
deadline = time.monotonic() + 90
while len(sweep.trial_pids()) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print(sweep.sweep_id, *sweep.trial_pids().values(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_coordinator_leaves_every_trial_interrupted(tmp_path, local_ray):
    """The coordinator (a driver joined to a running Ray) dies with -9: Ray ends its job's
    tasks, and the store's recovery marks every trial interrupted, nothing running."""
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path), local_ray],
        capture_output=True, text=True, timeout=150, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    sweep_id, *pids = done.stdout.split()
    assert len(pids) == 2

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (ProcessLookupError, FileNotFoundError):  # it exited (between the two, too)
            return True
        return stat.split(") ")[1].startswith("Z")

    assert wait_until(lambda: all(gone(int(p)) for p in pids), timeout=60)  # no orphan training
    with RunStore(tmp_path) as store:
        runs = store.list_runs(sweep_id=sweep_id)
        assert {r.status for r in runs} == {"interrupted"}
        assert store.get_sweep(sweep_id).status == "interrupted"
        assert store.integrity_check() == "ok"


def test_the_compare_page_launches_a_sweep_on_ray(data_dir, local_ray):
    at = app("pages/compare.py")
    at.segmented_control(key="cmp.view").set_value("Launch a sweep").run()
    at.segmented_control(key="cmp.backend").set_value("ray").run()
    assert at.text_input(key="cmp.ray_address").value == ""  # empty: the running (local) Ray
    at.text_input(key="cmp.lambdas").set_value("0.9, 1").run()
    at.text_input(key="cmp.seeds").set_value("1").run()
    at.text_input(key="cmp.workers").set_value("4").run()  # more than this machine's cores
    at.text_input(key="cmp.total_steps").set_value("1500").run()
    at.button(key="cmp.launch").click().run()
    assert not at.exception
    store = RunStore(data_dir)
    (sweep,) = store.list_sweeps()
    assert wait_until(lambda: store.get_sweep(sweep.id).status == "finished", 120)
    assert [r.status for r in store.list_runs(sweep_id=sweep.id)] == ["finished"] * 2
    at.segmented_control(key="cmp.backend").set_value("local").run()
    assert not at.exception and at.text_input(key="cmp.workers").value == str(os.cpu_count())


def test_backend_names_and_addresses_are_checked():
    with pytest.raises(ConfigError, match="backend must be one of local, ray, got 'spark'"):
        backend_factory("spark")
    with pytest.raises(ConfigError, match="address: only the ray backend"):
        backend_factory("local", "10.0.0.1:6379")
    with pytest.raises(ConfigError, match=r"members must be an integer in \[1, 256\], got 0"):
        backend_factory("local", members=0)
    with pytest.raises(ConfigError, match=r"members must be an integer in \[1, 256\], got 0"):
        backend_factory("ray", members=0)
    assert backend_factory("ray", members=4).keywords["members"] == 4  # reaches RayPool


def test_the_address_joined_with_counts_only_for_the_connection_it_made(local_ray):
    """An address this process passed to ray.init is accepted while that connection lasts; a
    later connection to another Ray (after a shutdown) does not inherit it."""
    from gae_core.runs import ray_pool

    ray_pool._JOINED["head.example:6379"] = local_ray  # as if ray.init had joined it
    try:
        assert backend_factory("ray", "head.example:6379")
        ray_pool._JOINED["head.example:6379"] = "10.9.9.9:6379"  # a connection since gone
        with pytest.raises(ConfigError, match=r"a sweep on head\.example:6379 needs"):
            backend_factory("ray", "head.example:6379")
    finally:
        ray_pool._JOINED.pop("head.example:6379", None)


def test_another_clusters_address_is_refused_once_connected(local_ray):
    """One Ray per process: asked for another cluster while connected to the local one, the
    factory says so instead of running the sweep on the local Ray."""
    assert backend_factory("ray", local_ray)  # the Ray it is connected to: fine
    port = local_ray.rsplit(":", 1)[1]
    for same in (f"localhost:{port}", f"127.0.0.1:{port}"):  # Ray reports the node's IP
        assert backend_factory("ray", same)
    with pytest.raises(ConfigError, match=f"a sweep on localhost:{int(port) + 1} needs"):
        backend_factory("ray", f"localhost:{int(port) + 1}")
    with pytest.raises(ConfigError, match="already connected to the Ray at"):
        backend_factory("ray", "10.0.0.1:6379")


@pytest.mark.parametrize(("members", "workers"), [(1, 2), (2, 1)])
def test_a_stop_asked_through_the_store_reaches_a_ray_trial(tmp_path, local_ray, members, workers):
    """What the Runs page's Stop and `python -m gae_core stop RUN_ID` do: set the run's stop
    flag in the store. The coordinator relays it at the trial's next flush; that trial ends
    stopped with its data, the other goes on (in a task of its own, or in the same task as
    the other member of one population)."""
    store = RunStore(tmp_path)
    sweep = start_sweep(store, LONG, grid_of(seeds=[0, 1]), workers=workers,
                        backend=backend_factory("ray", members=members))  # fmt: skip
    assert wait_until(lambda: all(store.get_run(r).env_steps > 0 for r in sweep.run_ids), 90)
    victim, other = sweep.run_ids
    together = sweep.trial_pids()
    assert (together[victim] == together[other]) == (members == 2)  # one task, or two
    start = time.monotonic()
    store.request_stop(victim)
    assert wait_until(lambda: store.get_run(victim).status == "stopped", 30)
    print(f"\nRay: store stop flag → trial stopped in {time.monotonic() - start:.2f} s")
    assert store.get_run(victim).env_steps > 0 and store.get_run(other).status == "running"
    assert wait_until(lambda: set(sweep.trial_pids()) == {other}, 10)
    sweep.cancel()
    assert sweep.wait(timeout=30)
    store.close()


def test_a_tasks_messages_reach_the_inbox_together_in_order(local_ray):
    """The outbox holds flushes until ``every`` has passed since its last delivery, then sends
    what waits in one call, in order; a trial's end goes at once with everything before it;
    the reply tells every trial of the task whether it was asked to stop."""
    from gae_core.runs.ray_pool import _Inbox, _inbox_sink, _Outbox

    def drained():
        return [(m.kind, m.index) for m in ray.get(inbox.drain.remote())]

    inbox = _Inbox.remote()
    outbox = _Outbox(inbox, [3, 4], every=3600.0)
    first, second = _inbox_sink(outbox, 3), _inbox_sink(outbox, 4)
    assert not first.flush([("k", 1, 0.0, 1.0)], 1, None)  # the first goes at once
    assert drained() == [("flush", 3)]
    ray.get(inbox.stop.remote(4))
    assert not second.flush([], 2, None) and not first.flush([], 3, None)  # held back
    assert ray.get(inbox.drain.remote()) == []
    second.finish("stopped", None)  # its end: delivered at once, with what waited
    assert drained() == [("flush", 4), ("flush", 3), ("finish", 4)]
    assert outbox.stopped == {4} and not first.flush([], 4, None)
    lone = _Outbox(inbox, [5], every=0.0)  # a trial alone: every flush delivered
    assert not _inbox_sink(lone, 5).flush([], 1, None)
    assert drained() == [("flush", 5)]
    ray.kill(inbox)


#: What a C++ failure-signal handler or an abort leaves on stderr.
_DUMP_MARKS = ("*** SIG", "Aborted", "logging.cc", "StackTrace", "PC: @", "Traceback")


def test_sigterm_stops_a_ray_sweep_as_ctrl_c_does(tmp_path):
    """The CLI's Ray sweep (its own local Ray) gets SIGTERM while trials train: as with Ctrl-C
    (and as the local backend does), the sweep is cancelled, every trial ends stopped with its
    data, and the exit status is 130. Before, Ray's C++ failure-signal handler in the driver
    printed a stack dump and aborted the process 3 s later (exit 134)."""
    data = tmp_path / "data"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "gae_core", "--data-dir", str(data), "sweep", "--backend", "ray",
         "--lambdas", "0.9", "0.95", "--seeds", "0", "1", "--total-steps", "200000",
         *TINY_FLAGS, "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={k: v for k, v in cli_env().items() if k != "RAY_ADDRESS"},
    )  # fmt: skip

    def training() -> bool:  # a read of the store (a CLI process a poll would cost a core)
        if not (data / DB_FILENAME).exists():
            return False
        with RunStore(data, recover=False) as store:
            return any(r.status == "running" and r.env_steps > 0 for r in store.list_runs())

    try:
        assert wait_until(training, timeout=150, interval=1.0), "no trial started training"
        start = time.monotonic()
        sweep.send_signal(signal.SIGTERM)
        _, err = sweep.communicate(timeout=90)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
    print(f"\nRay sweep: SIGTERM → exit {sweep.returncode} in {time.monotonic() - start:.1f} s")
    assert sweep.returncode == 130, err[-3000:]
    assert not [line for line in err.splitlines() if any(m in line for m in _DUMP_MARKS)], err
    with RunStore(data) as store:
        (record,) = store.list_sweeps()
        runs = store.list_runs(sweep_id=record.id)
        assert record.status == "cancelled"
        assert {r.status for r in runs} == {"stopped"}  # as Ctrl-C leaves them
        assert any(r.env_steps > 0 for r in runs)  # data kept
        assert store.integrity_check() == "ok"


def _processes_marked(marker: str) -> list[str]:
    """The command lines of the processes whose environment holds ``marker`` (a CLI's own and
    every Ray process it started: they inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_the_cli_ray_sweep_starts_ray_in_its_main_thread_and_leaves_nothing_behind(tmp_path):
    """The CLI's Ray sweep starts its own local Ray in its main thread (no Ray warning that
    it could not set a SIGTERM handler, which ``ray.init`` prints from another thread), so
    its exit hook shuts Ray down from the thread that started it, and takes every Ray
    process it started with it."""
    marker = f"GAE_RAY_TEST_{os.getpid()}_{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-m", "gae_core", "--data-dir", str(tmp_path / "data"), "sweep",
         "--backend", "ray", "--lambdas", "0.9", "1", "--seeds", "0", "--total-steps", "500",
         *TINY_FLAGS, "--no-progress", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=180,
        env={**{k: v for k, v in cli_env().items() if k != "RAY_ADDRESS"}, marker: "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "finished"
    assert "SIGTERM handler is not set" not in done.stderr, done.stderr
    gone = wait_until(lambda: not _processes_marked(marker), timeout=30)
    assert gone, _processes_marked(marker)


@pytest.mark.parametrize("fails", [False, True], ids=["started", "failed"])
def test_connect_keeps_the_processs_sigterm_handler(monkeypatch, fails):
    """``ray.init`` in the main thread sets its own SIGTERM handler (``sys.exit``) before it
    connects; ``connect`` puts the process's back, whether ``ray.init`` returns or raises, and
    shuts down what a failed ``ray.init`` started."""
    from gae_core.runs import ray_pool

    shutdowns = []
    monkeypatch.setattr(ray_pool.ray, "shutdown", lambda: shutdowns.append(1))

    def ray_init(**kwargs):
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(15))  # as ray.init does
        if fails:
            raise RuntimeError("version mismatch")

    def ours(signum, frame):  # the process's own handler
        pass

    monkeypatch.setattr(ray_pool.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_pool.ray, "init", ray_init)
    previous = signal.signal(signal.SIGTERM, ours)
    try:
        if fails:
            with pytest.raises(RuntimeError, match="version mismatch"):
                ray_pool.connect(None)
        else:
            ray_pool.connect(None)
        assert signal.getsignal(signal.SIGTERM) is ours
        assert len(shutdowns) == (1 if fails else 0)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_cli_says_in_one_line_that_ray_did_not_start(tmp_path, monkeypatch):
    """A Ray that cannot start or be joined stops the CLI's sweep before it exists: one line
    naming it and why, exit 1, before a progress bar or a store."""
    from conftest import cli_in_process

    from gae_core.runs import ray_pool

    def ray_init(**kwargs):
        raise RuntimeError("Version mismatch:\nthe cluster runs 2.0")

    monkeypatch.setattr(ray_pool.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_pool.ray, "init", ray_init)
    data = tmp_path / "data"
    done = cli_in_process(
        data, "sweep", "--backend", "ray", "--seeds", "0", "--total-steps", "100", *TINY_FLAGS
    )  # fmt: skip (a progress bar)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: could not start or join a local Ray: RuntimeError: Version mismatch: the "
        "cluster runs 2.0"
    ), done.stderr
    assert "%|" not in done.stderr  # before the bar: the line is its own
    assert not data.exists()  # before the store
