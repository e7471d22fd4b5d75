"""Bring-your-own environments (gae_core.env_modules): the example module trains, sweeps on the
local pool and opens in the explorer; the dashboard's form lists its envs; a bad module or id
gives one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TINY, app, cli

from gae_core.env_modules import ENV_MODULES_VAR, EnvModuleError, import_env_modules
from gae_core.storage.store import RunStore

EXAMPLES = str(ROOT / "examples")
CORRIDOR = "GAEExample/Corridor-v0"


def _with_examples(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([EXAMPLES, str(ROOT)]), **extra}


def test_import_names_the_module_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_envs.py").write_text("raise RuntimeError('no licence\\nfor this')\n")
    (tmp_path / "needs_missing.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, words in (
        ("a/b", "env module 'a/b' is not a Python module name"),
        ("no_such_module_xyz", "env module 'no_such_module_xyz' not found"),
        ("broken_envs", "env module 'broken_envs' failed to import: RuntimeError: no licence for"),
        ("needs_missing", "env module 'needs_missing' failed to import: ModuleNotFoundError"),
    ):
        with pytest.raises(EnvModuleError) as caught:
            import_env_modules([name])
        assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_example_module_trains_sweeps_and_says_what_it_needed(tmp_path):
    data = tmp_path / "data"
    env = _with_examples()
    done = cli(data, "train", "--env-module", "gae_example_envs", "--env", CORRIDOR,
               "--total-steps", "4000", "--num-envs", "4", "--rollout-steps", "8", "--json",
               **env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["status"] == "finished" and run["env_id"] == CORRIDOR
    swept = cli(data, "sweep", "--env-module", "gae_example_envs", "--env", CORRIDOR,
                "--seeds", "0", "1", "--lambdas", "0.9", "1", "--total-steps", "2000",
                "--num-envs", "4", "--rollout-steps", "8", "--workers", "2", "--json",
                "--no-progress", **env)  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    with RunStore(data, recover=False) as store:
        runs = store.list_runs()
        assert len(runs) == 5 and {r.status for r in runs} == {"finished"}
        # each run says which modules it needed, with its code's provenance
        assert all(r.code["env_modules"] == ["gae_example_envs"] for r in runs)
    # without the module: the id is unknown, and the message says how to name it
    bare = cli(data, "train", "--env", CORRIDOR, "--total-steps", "100", **env)
    assert bare.returncode == 2 and "--env-module" in bare.stderr
    assert len(bare.stderr.strip().splitlines()) == 1
    # an env whose spaces the trainer cannot handle: one line naming the id and the space
    dict_obs = cli(data, "train", "--env-module", "gae_example_envs", "--env",
                   "GAEExample/DictObs-v0", "--total-steps", "100", **env)  # fmt: skip
    assert dict_obs.returncode == 2 and "GAEExample/DictObs-v0" in dict_obs.stderr
    assert "flat Box" in dict_obs.stderr and len(dict_obs.stderr.strip().splitlines()) == 1
    # an unknown id lists the module's envs the trainer can take, not the Dict one
    typo = cli(data, "train", "--env-module", "gae_example_envs", "--env", "Corridr-v0", **env)
    assert typo.returncode == 2 and "'Corridr-v0' is not a registered environment" in typo.stderr
    assert CORRIDOR in typo.stderr and "DictObs" not in typo.stderr
    missing = cli(data, "train", "--env-module", "nowhere_envs", "--env", CORRIDOR, **env)
    assert missing.returncode == 2 and "env module 'nowhere_envs' not found" in missing.stderr
    # the lab on a module env's run, the module not named: one line naming it, both views
    for view in ([], ["--gradient"]):
        lab = cli(data, "lab", run["run_id"], *view, **env)
        assert lab.returncode == 2, lab.stderr
        assert lab.stderr.strip() == (
            f"error: run {run['run_id']}'s env {CORRIDOR} cannot be built here: it was trained "
            "with env module gae_example_envs, which this process does not import: name it "
            "with --env-module gae_example_envs (the dashboard: "
            "GAE_CORE_ENV_MODULES=gae_example_envs)"
        )


@pytest.mark.slow
def test_the_dashboard_lists_and_explores_a_module_env(data_dir, monkeypatch):
    from pages import _ui

    monkeypatch.syspath_prepend(EXAMPLES)
    monkeypatch.setenv(ENV_MODULES_VAR, "gae_example_envs")
    at = app("pages/train.py")
    assert CORRIDOR in at.selectbox(key="train.env_id").options
    manager = _ui.manager()
    run_id = manager.start({**TINY, "env_id": CORRIDOR, "total_steps": 1200,
                            "checkpoint_every": 600})  # fmt: skip
    assert manager.wait(run_id, 60)
    assert RunStore(data_dir).get_run(run_id).status == "finished"
    at = app("pages/explorer.py")
    assert at.selectbox(key="ex.run").value == run_id and not at.exception
    assert len(at.get("plotly_chart")) == 1  # per-step panels, heat map and weights in one


def test_env_module_before_and_after_the_command_both_count(tmp_path, monkeypatch):
    from gae_core.cli import build_parser

    args = build_parser().parse_args(["--env-module", "a", "runs", "--env-module", "b"])
    assert (args.env_module_first, args.env_module) == (["a"], ["b"])
    # a module whose own dependency is missing is not reported as itself missing
    # (its name starts with the missing one's: gae_dep_envs needs gae_dep)
    (tmp_path / "gae_dep_envs.py").write_text("import gae_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvModuleError, match="'gae_dep_envs' failed to import: ModuleNotFound"):
        import_env_modules(["gae_dep_envs"])


_IMPORTED_AT_ONCE = """
import json, sys, threading, time
from gae_core.env_modules import import_env_modules
found = []
def load(wait):
    time.sleep(wait)  # the second arrives while the first's import is under way
    found.append(import_env_modules(["slow_envs"]))
threads = [threading.Thread(target=load, args=(wait,)) for wait in (0.0, 0.2)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(found))
"""


def test_a_module_imported_by_two_threads_at_once_registers_its_envs_for_both(tmp_path):
    """Two sessions' first pages import the env module at nearly the same moment, the second
    while the first's import is under way (its env registered, the module not yet done): both
    learn the ids it registered (unserialised, the second read the registry with the env in
    it, waited for the import, and recorded that the module registered nothing)."""
    (tmp_path / "slow_envs.py").write_text(
        "import time\nimport gymnasium as gym\n"
        "gym.register('SlowCartPole-v0', entry_point="
        "'gymnasium.envs.classic_control.cartpole:CartPoleEnv')\ntime.sleep(0.6)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", _IMPORTED_AT_ONCE], capture_output=True,
                          text=True, timeout=120, env=env, check=True)  # fmt: skip
    assert json.loads(done.stdout) == [{"slow_envs": ["SlowCartPole-v0"]}] * 2


CRASHING = """
import gymnasium as gym
import numpy as np


STEPS = [0]  # every copy's steps: the checks build copies of their own


class Crash(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        STEPS[0] += 1
        if STEPS[0] > 500:
            raise ValueError("the env gave up at step 500")
        return np.zeros(2, np.float32), 1.0, False, False, {}


gym.register("Crashes/Crash-v0", entry_point=Crash, max_episode_steps=40)
"""


def test_a_run_that_fails_says_why_in_one_line_and_keeps_its_traceback(tmp_path):
    """An env that raises mid-run: the command says the reason once, in one line (its last
    line), exit 1; the traceback is stored with the run for whoever wants it."""
    (tmp_path / "crashing_envs.py").write_text(CRASHING)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    data = tmp_path / "data"
    done = cli(data, "--env-module", "crashing_envs", "train", "--env", "Crashes/Crash-v0",
               "--total-steps", "5000", "--num-envs", "2", "--no-progress", **env)  # fmt: skip
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "failed" in line]
    assert len(said) == 1 and "Traceback" not in done.stderr, done.stderr
    assert said[0].endswith("failed: ValueError: the env gave up at step 500 (the whole "
                            "traceback: `runs --json`, its error)")  # fmt: skip
    with RunStore(data, recover=False) as store:
        (run,) = store.list_runs()
        assert run.status == "failed" and run.error.startswith("Traceback")


def test_an_env_module_that_registers_nothing_is_named_by_the_unknown_ids_message(
    tmp_path, monkeypatch
):
    from gae_core.agent.envs import env_id_problem

    (tmp_path / "registers_nothing.py").write_text("ANSWER = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_MODULES_VAR, "registers_nothing")
    problem = env_id_problem("Mine/Corridor-v0")
    assert problem.startswith("'Mine/Corridor-v0' is not a registered environment")
    assert problem.endswith("(env module registers_nothing registered no env)"), problem
    monkeypatch.delenv(ENV_MODULES_VAR)
    assert "name the module with --env-module" in env_id_problem("Mine/Corridor-v0")
