"""The CLI through real subprocesses: train --json contract, bad config, runs, export, sweep,
Ctrl-C, and a kill -9 mid-run followed by crash recovery."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import TINY_FLAGS, cli, cli_env, cli_in_process

from gae_core import metrics as M
from gae_core.cli import build_parser
from gae_core.cli.flags import config_from_args
from gae_core.storage.store import RunStore
from gae_core.storage.table import RUN_COLUMNS


def _popen(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gae_core", "--data-dir", str(tmp_path / "data"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=cli_env(),
    )


def _last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


def _wait_for_metrics(data: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (data / "runs.sqlite3").exists():
            with RunStore(data, recover=False) as store:  # (a sweep's: the one training)
                for run in store.list_runs():
                    if len(store.metrics(run.id)) > 0:
                        return run.id
        time.sleep(0.1)
    raise AssertionError("no metrics appeared")


def test_every_config_field_is_a_flag():
    parser = build_parser()
    args = parser.parse_args(
        [
            *("train", "--env", "Pendulum-v1", "--lambda", "0.9", "--total-steps", "1e4"),
            *("--hidden-sizes", "8", "8", "--no-normalize-advantages", "--learning-rate", "1e-3"),
        ]
    )
    assert args.env_id == "Pendulum-v1" and args.lambda_ == 0.9 and args.total_steps == 10_000
    config = config_from_args(args)
    assert config.hidden_sizes == (8, 8) and config.normalize_advantages is False
    assert config_from_args(
        parser.parse_args(["train", "--hidden-sizes", "64x32"])
    ).hidden_sizes == (
        64,
        32,
    )
    assert not hasattr(args, "gamma")  # unset flags keep the dataclass default
    help_text = parser._subparsers._group_actions[0].choices["train"].format_help()
    for flag in ["--gamma", "--num-envs", "--rollout-steps", "--checkpoint-every", "--seed"]:
        assert flag in help_text
    assert "Discount γ" in help_text  # the field's help text


@pytest.mark.slow
def test_train_json_contract_runs_and_export(tmp_path):
    done = cli(
        tmp_path / "data",
        "train",
        "--env",
        "CartPole-v1",
        "--seed",
        "3",
        "--total-steps",
        "2000",
        *TINY_FLAGS,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "finished"
    assert result["env_steps"] >= 2000
    assert result["wall_seconds"] > 0
    assert result["steps_per_second"] == pytest.approx(
        result["env_steps"] / result["wall_seconds"], rel=1e-6
    )
    assert result["solved"] is False and result["solved_at_step"] is None  # 475 not reached
    assert "%" in done.stderr  # the tqdm progress bar goes to stderr
    run_id = result["run_id"]

    listed = cli(tmp_path / "data", "runs", "--json")
    assert listed.returncode == 0
    (row,) = _last_json(listed.stdout)
    assert row["run_id"] == run_id and row["status"] == "finished" and row["seed"] == 3
    # one wall time and rate for a run: train --json reads them as runs --json does
    for key in ("wall_seconds", "steps_per_second"):
        assert row[key] == result[key], key
    table = cli(tmp_path / "data", "runs")
    head, line = table.stdout.strip().splitlines()
    assert head.split() == ["RUN_ID", "STATUS", "ALGO", "ENV", "ENV_STEPS", "RETURN", "SOLVED",
                            "NAME"]  # fmt: skip
    assert line.split()[:4] == [run_id, "finished", "A2C", "CartPole-v1"]

    out = tmp_path / "metrics.csv"
    exported = cli(tmp_path / "data", "export", run_id, "--csv", str(out))
    assert exported.returncode == 0, exported.stderr
    frame = pd.read_csv(out)
    assert list(frame.columns[:2]) == ["env_step", "wall_time"]
    assert {M.VALUE_LOSS.key, M.EPISODIC_RETURN.key} <= set(frame.columns)
    with RunStore(tmp_path / "data") as store:
        long = store.metrics(run_id)
    for key in (M.VALUE_LOSS.key, M.EPISODIC_RETURN.key):
        assert frame[key].notna().sum() == (long["key"] == key).sum()
    assert frame["env_step"].is_monotonic_increasing

    missing = cli(tmp_path / "data", "export", "nope", "--csv", str(out))
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr


@pytest.mark.slow
def test_env_without_threshold_reports_null_solved(tmp_path):
    done = cli(
        tmp_path / "data",
        "train",
        "--env",
        "Pendulum-v1",
        "--total-steps",
        "800",
        *TINY_FLAGS,
        "--json",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "finished"
    assert result["solved"] is None and result["solved_at_step"] is None


@pytest.mark.slow
def test_train_starts_from_the_envs_preset_and_stores_the_resolved_config(tmp_path):
    """`train --env Acrobot-v1` takes the Acrobot preset (16 envs, normalisation, RMSprop); the
    flags given override it; the run stores every field, resolved."""
    from dataclasses import asdict

    from gae_core.agent.presets import preset_config

    done = cli(
        tmp_path / "data", "train", "--env", "Acrobot-v1", "--total-steps", "320",
        "--seed", "3", "--json", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = RunStore(tmp_path / "data").list_runs()
    expected = asdict(preset_config("Acrobot-v1", total_steps=320, seed=3))
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in run.config.items()}
    assert stored == expected
    assert stored["num_envs"] == 16 and stored["normalize_rewards"] is True  # the preset's
    assert stored["optimizer"] == "rmsprop" and stored["total_steps"] == 320  # the flag wins


def test_train_dry_run_prints_the_resolved_config_with_sources_and_trains_nothing(tmp_path):
    """`train --dry-run`: each field as its flag with where it came from (the flag, the env's
    preset, the default), the idle fields apart with why, the preset's reason; its lines,
    given back as flags, make the same config; nothing is stored."""
    import shlex
    from dataclasses import asdict

    from gae_core.agent.presets import preset_config, preset_of

    data = tmp_path / "data"
    flags = ("train", "--algo", "ppo", "--env", "Acrobot-v1", "--n-epochs", "7", "--dry-run")
    done = cli_in_process(data, *flags)
    assert done.returncode == 0, done.stderr
    head, *lines = done.stdout.strip().splitlines()
    assert head.startswith("Acrobot-v1 with PPO, as `train` would run it")
    idle_at = lines.index("no effect here:")
    rows = {line.split()[0]: line.split() for line in lines[:idle_at]}
    assert rows["--n-epochs"] == ["--n-epochs", "7", "flag"]
    assert rows["--num-envs"] == ["--num-envs", "16", "preset"]
    assert rows["--value-coef"] == ["--value-coef", "0.5", "default"]
    assert rows["--normalize-rewards"] == ["--normalize-rewards", "preset"]
    assert "--log-std-init" not in rows  # discrete actions: apart, with why
    assert (
        "  --log-std-init, --use-sde, --sde-sample-freq: Acrobot-v1's actions are discrete" in lines
    )  # and a reason names the fields it depends on by their flags too
    assert "  --critic-lambda: --critic-target is advantage_lambda (the critic follows λ)" in lines
    assert lines[-2] == f"preset: {preset_of('Acrobot-v1', 'ppo').why}"
    expected = asdict(preset_config("Acrobot-v1", "ppo", n_epochs=7))
    as_json = cli_in_process(data, *flags, "--json")
    result = _last_json(as_json.stdout)
    assert {
        k: tuple(v) if isinstance(v, list) else v for k, v in result["config"].items()
    } == expected
    assert result["sources"]["n_epochs"] == "flag" and result["sources"]["seed"] == "default"
    # the printed flags, given back, make the same config (the idle fields are the defaults')
    words = [w for line in lines[:idle_at] for w in shlex.split(line.rsplit(None, 1)[0])]
    again = _last_json(cli_in_process(data, "train", *words, "--dry-run", "--json").stdout)
    assert again["config"] == result["config"]
    assert set(again["sources"].values()) <= {"flag", "default"}
    # the whole config as one command, a flag without effect given (A2C's --n-epochs) too
    idle = cli_in_process(data, "train", "--n-epochs", "3", "--dry-run")
    prefix = "as one command (every field, those without effect too): python -m gae_core train "
    (command,) = [line for line in idle.stdout.splitlines() if line.startswith(prefix)]
    whole = _last_json(cli_in_process(data, "train", *shlex.split(command[len(prefix) :]),
                                      "--dry-run", "--json").stdout)  # fmt: skip
    assert whole["config"]["n_epochs"] == 3
    assert (
        whole["config"]
        == _last_json(
            cli_in_process(data, "train", "--n-epochs", "3", "--dry-run", "--json").stdout
        )["config"]
    )
    assert not data.exists()


def test_train_and_sweep_note_what_the_train_form_warns_of(tmp_path):
    """A budget under one update, checkpoints and evaluations past the budget, no recordings,
    γ and λ both 1: the CLI says so (stderr, ``note:``, each field as its flag), as the Train
    form does, and ``--dry-run --json`` lists the same as ``warnings``; a sweep says each
    once, however many trials share it; a preset budget says nothing."""
    data = tmp_path / "data"
    short = cli_in_process(data, "train", "--algo", "ppo", "--env", "Pendulum-v1", "--total-steps",
                           "4000", "--record-episodes", "0", "--dry-run")  # fmt: skip
    assert short.returncode == 0, short.stderr
    assert [line for line in short.stderr.splitlines() if line.startswith("note: ")] == [
        "note: --total-steps (4,000) is smaller than one update (--num-envs × --rollout-steps "
        "= 4,096): the run will do one update.",
        "note: --checkpoint-every (10,000) exceeds --total-steps (4,000): only the final "
        "checkpoint will be saved, so the explorer will have one checkpoint to compare.",
        "note: --eval-every (5,000) is not below --total-steps (4,000): the policy is evaluated "
        "once, at the end of the budget (one point on the evaluation chart).",
        "note: --record-episodes is 0: no trajectories for the advantage explorer.",
    ]
    planned = _last_json(cli_in_process(data, "train", "--algo", "ppo", "--env", "Pendulum-v1",
                                        "--total-steps", "4000", "--record-episodes", "0",
                                        "--dry-run", "--json").stdout)  # fmt: skip
    assert [f"note: {w}" for w in planned["warnings"]] == [
        line for line in short.stderr.splitlines() if line.startswith("note: ")
    ]
    assert "note:" not in cli_in_process(data, "train", "--dry-run").stderr
    monte_carlo = cli_in_process(data, "train", "--gamma", "1", "--lambda", "1", "--dry-run")
    assert (
        "note: --gamma and --lambda both 1: undiscounted Monte Carlo advantages, the "
        "highest-variance setting." in monte_carlo.stderr.splitlines()
    )
    assert not data.exists()
    sweep = cli_in_process(data, "sweep", "--lambdas", "0.9", "1", "--seeds", "0",
                           "--total-steps", "300", *TINY_FLAGS, "--workers", "1")  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    notes = [line for line in sweep.stderr.splitlines() if line.startswith("note: ")]
    assert [n.split(" (")[0] for n in notes] == ["note: --checkpoint-every", "note: --eval-every"]


def test_train_like_a_stored_run_starts_from_its_config_with_the_flags_on_top(tmp_path):
    """`train --like RUN`: the run's stored config in the preset's place (--dry-run says each
    field came from the run, or the flag), a new run stores it with the flags given on top;
    an unknown id is one line, exit 1."""
    data = tmp_path / "data"
    flags = ["--env", "Acrobot-v1", "--lambda", "0.8", "--total-steps", "160", *TINY_FLAGS]
    first = cli_in_process(data, "train", *flags, "--json", "--no-progress")
    assert first.returncode == 0, first.stderr
    run_id = _last_json(first.stdout)["run_id"]
    planned = _last_json(cli_in_process(data, "train", "--like", run_id, "--seed", "9",
                                        "--dry-run", "--json").stdout)  # fmt: skip
    assert planned["sources"]["seed"] == "flag" and planned["preset"] is None
    assert {planned["sources"][name] for name in planned["sources"] if name != "seed"} == {"run"}
    head = cli_in_process(data, "train", "--like", run_id, "--dry-run").stdout.splitlines()[0]
    assert head.startswith(f"Acrobot-v1 with A2C, like run {run_id}, as `train` would run it")
    second = cli_in_process(data, "train", "--like", run_id, "--seed", "9", "--json",
                            "--no-progress")  # fmt: skip
    assert second.returncode == 0, second.stderr
    with RunStore(data) as store:
        old = store.get_run(run_id).config
        new = store.get_run(_last_json(second.stdout)["run_id"]).config
    assert new == {**old, "seed": 9} == planned["config"]
    assert old["lambda_"] == 0.8 and old["hidden_sizes"] == [16]  # not the preset's
    other = cli_in_process(data, "train", "--like", run_id, "--algo", "ppo", "--dry-run")
    assert (f"note: run {run_id} trained A2C on Acrobot-v1: its settings are kept, not "
            "Acrobot-v1's PPO preset") in other.stderr  # fmt: skip
    # a stored value out of today's range: named as the run's, and a flag mends it
    with RunStore(data) as store:
        odd = store.create_run({**store.get_run(run_id).config, "lambda_": 1.5})
    bad = cli_in_process(data, "train", "--like", odd, "--dry-run")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"error: run {odd}'s stored config: lambda_ must be in "
                                  "[0.0, 1.0], got 1.5")  # fmt: skip
    mended = cli_in_process(data, "train", "--like", odd, "--lambda", "0.9", "--dry-run")
    assert mended.returncode == 0, mended.stderr
    missing = cli_in_process(data, "train", "--like", "nope", "--dry-run")
    assert (
        missing.returncode == 1
        and missing.stderr.strip() == f"error: no run 'nope' in {data / 'runs.sqlite3'}"
    )


def test_each_episode_is_stored_at_the_wall_time_it_ended(tmp_path):
    """A PPO rollout of 512 steps holds many CartPole episodes: each is stored at the time it
    ended, not all at its update's end (a wall-time chart would stack them in columns), never
    after the update's own rows."""
    data = tmp_path / "data"
    done = cli_in_process(data, "train", "--algo", "ppo", "--num-envs", "1", "--rollout-steps",
                          "512", "--minibatch-size", "512", "--n-epochs", "1", "--total-steps",
                          "1024", "--log-every", "0", "--json", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    with RunStore(data) as store:
        metrics = store.metrics(_last_json(done.stdout)["run_id"])
    episodes = metrics[metrics["key"] == M.EPISODIC_RETURN.key]
    updates = metrics[metrics["key"] == M.VALUE_LOSS.key]
    assert len(updates) == 2 and len(episodes) > 10
    assert episodes["wall_time"].nunique() == len(episodes)  # one vector env: one end a step
    assert episodes["wall_time"].is_monotonic_increasing
    first = episodes[episodes["env_step"] <= 512]
    assert first["wall_time"].max() <= updates["wall_time"].iloc[0]


def test_bad_config_exits_2_naming_the_field(tmp_path):
    bad = cli(tmp_path / "data", "train", "--lambda", "1.5", "--json")
    assert bad.returncode == 2
    assert "lambda_" in bad.stderr and "[0.0, 1.0]" in bad.stderr and "1.5" in bad.stderr
    assert bad.stdout == ""
    # the rest in this process (the same main(); the subprocess above checks the real exit)
    bad_steps = cli_in_process(tmp_path / "data", "train", "--num-envs", "0")
    assert bad_steps.returncode == 2 and "num_envs" in bad_steps.stderr
    assert "[1, 1024]" in bad_steps.stderr
    not_a_number = cli_in_process(tmp_path / "data", "train", "--gamma", "abc")
    assert not_a_number.returncode == 2 and "--gamma" in not_a_number.stderr
    listed = cli_in_process(tmp_path / "data", "runs", "--json")
    assert listed.returncode == 1 and "no run store at" in listed.stderr  # nothing was created
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_data_dir_from_environment(tmp_path):
    env_dir = tmp_path / "from-env"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gae_core",
            "train",
            "--total-steps",
            "500",
            *TINY_FLAGS,
            "--json",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=cli_env(GAE_CORE_DATA=str(env_dir)),
    )
    assert done.returncode == 0, done.stderr
    with RunStore(env_dir) as store:
        assert [r.id for r in store.list_runs()] == [_last_json(done.stdout)["run_id"]]


@pytest.mark.slow
def test_sweep_json(tmp_path):
    done = cli(
        tmp_path / "data",
        "sweep",
        "--env",
        "CartPole-v1",
        "--lambdas",
        "0.9",
        "1.0",
        "--seeds",
        "0",
        "--workers",
        "2",
        "--total-steps",
        "1000",
        *TINY_FLAGS,
        "--json",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "finished" and result["workers"] == 2
    assert result["total"] == 2 and result["counts"]["finished"] == 2
    assert result["population"] == 1  # two trials on two workers: one each, not the cap of 64
    assert sorted(r["lambda_"] for r in result["runs"]) == [0.9, 1.0]
    assert all(list(r) == list(RUN_COLUMNS) for r in result["runs"])
    assert all(r["sweep_id"] == result["sweep_id"] for r in result["runs"])
    listed = _last_json(
        cli(tmp_path / "data", "runs", "--sweep", result["sweep_id"], "--json").stdout
    )
    assert len(listed) == 2
    assert "λ study: every trial's critic regresses on λ-returns with λ = 0.95" in done.stderr
    with RunStore(tmp_path / "data") as store:
        configs = [r.config for r in store.list_runs(sweep_id=result["sweep_id"])]
    assert {(c["critic_target"], c["critic_lambda"]) for c in configs} == {("fixed_lambda", 0.95)}
    # the summary: the comparison page's numbers, per λ
    assert [entry["value"] for entry in result["summary"]] == [0.9, 1.0]
    keys = {"iqm", "iqm_ci_low", "iqm_ci_high", "mean", "mean_ci_low", "mean_ci_high"}
    for entry in result["summary"]:
        assert set(entry["final_return"]) == keys == set(entry["auc"])
        assert entry["seeds"] == entry["runs"] == 1
        final = entry["final_return"]
        # one seed: no interval (null), not one of a single value
        assert final["iqm_ci_low"] is final["iqm_ci_high"] is None and final["iqm"] is not None
    table = cli(tmp_path / "data", "summary", result["sweep_id"])
    assert table.returncode == 0 and "final return IQM [CI]" in table.stdout
    lines = table.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["0.9", "1"]
    assert all(line.count("(one seed: no interval)") == 4 for line in lines[2:4])
    # each cell apart from the next (they ran together when the words outgrew the column)
    assert all(line.count("interval)  ") == 3 for line in lines[2:4]), lines[2:4]
    assert lines[-1].startswith("methods: 2 runs of A2C with GAE, λ ∈ {0.9, 1}, 1 seed per")
    assert "per value. Shared by every run: algo=a2c, env_id=CartPole-v1" in lines[-1]
    assert "critic_target=fixed_lambda, critic_lambda=0.95" in lines[-1]
    again = _last_json(cli(tmp_path / "data", "summary", result["sweep_id"], "--json").stdout)
    assert again["summary"] == result["summary"]  # the same numbers from both commands
    methods = again["methods"]  # what they were made from
    assert methods["groups"] == [
        {"value": 0.9, "seeds": [0], "runs": 1},
        {"value": 1.0, "seeds": [0], "runs": 1},
    ]
    assert methods["also_varies"] == {} and methods["shared_config"]["total_steps"] == 1000
    assert sorted(r["id"] for r in methods["runs"]) == sorted(r["run_id"] for r in result["runs"])
    bad = cli(tmp_path / "data", "sweep", "--lambdas", "0.5", "2.0")
    assert bad.returncode == 2 and "lambda_" in bad.stderr


@pytest.mark.slow
def test_a_sweep_without_lambda_axis_summarises_by_its_other_axis_in_numeric_order(tmp_path):
    # seeds are what each group's statistics run over: never the group, even when listed first
    # (which axis: tests/test_grid.py, study_axes)
    done = cli(
        tmp_path, "sweep", "--env", "CartPole-v1", "--seeds", "0", "1", "--grid",
        "hidden_sizes=32x32,8x8", "--workers", "2", "--total-steps", "600", "--json",
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert [(e["group"], e["value"], e["seeds"]) for e in result["summary"]] == [
        ("hidden_sizes", [8, 8], 2),
        ("hidden_sizes", [32, 32], 2),
    ]
    table = cli(tmp_path, "summary", result["sweep_id"])
    assert table.returncode == 0, table.stderr
    assert [line.split()[0] for line in table.stdout.splitlines()[2:4]] == ["8x8", "32x32"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_and_keeps_data(tmp_path, signum):
    proc = _popen(tmp_path, "train", "--total-steps", "100000000", *TINY_FLAGS, "--json")
    try:
        run_id = _wait_for_metrics(tmp_path / "data")
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    result = _last_json(stdout)
    assert result["run_id"] == run_id and result["status"] == "stopped"
    with RunStore(tmp_path / "data") as store:
        run = store.get_run(run_id)
        assert run.status == "stopped" and run.env_steps == result["env_steps"] > 0
        assert len(store.metrics(run_id)) > 0
        assert store.checkpoint_steps(run_id)[-1] == run.env_steps


@pytest.mark.slow
def test_a_cancelled_sweep_tells_stopped_trials_from_those_that_never_started(tmp_path):
    """Ctrl-C on a sweep training one trial at a time: the trial it stopped reads "stopped",
    those still queued "not started", in its table and its last line (all are stored as
    stopped; a walk-through read "16 stopped" of which 14 had not trained a step)."""
    proc = _popen(tmp_path, "sweep", "--lambdas", "0.9", "1", "--seeds", "0", "1",
                  "--total-steps", "100000000", "--workers", "1", "--population", "1",
                  *TINY_FLAGS, "--no-progress")  # fmt: skip
    try:
        _wait_for_metrics(tmp_path / "data")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    head, *table, last = stdout.strip().splitlines()
    assert head.split() == ["RUN_ID", "STATUS", "ALGO", "ENV", "ENV_STEPS", "RETURN", "SOLVED",
                            "NAME"]  # as `runs` heads them  # fmt: skip
    assert [line.split()[1] for line in table].count("stopped") == 1, stdout
    assert [line.split()[1] for line in table].count("not") == 3, stdout  # "not started"
    assert last.endswith(": 1 stopped, 3 not started"), last
    # its summary says what the cancel left: runs short of their budget, a λ without a run
    sweep_id = last.split()[1]
    summary = cli(tmp_path / "data", "summary", sweep_id)
    assert summary.returncode == 0, summary.stderr
    notes = [line for line in summary.stdout.splitlines() if line.startswith("note: ")]
    assert notes[0].startswith("note: 4 of these 4 runs have not finished their budget (1 "
                               "stopped, 3 not started); 3 finished no episode"), notes  # fmt: skip
    assert "leaves λ = 1 with no run" in notes[0] and "Only 1 seed" in notes[1], notes
    assert [line for line in summary.stdout.splitlines() if line.startswith("Final return: ")]
    report = _last_json(cli(tmp_path / "data", "summary", sweep_id, "--json").stdout)
    assert [n.split(":")[0] for n in report["notes"]] == [n[6:].split(":")[0] for n in notes]
    assert set(report["best"]) == {"final_return", "auc"}


@pytest.mark.slow
def test_a_second_ctrl_c_exits_130_with_the_run_stopped_and_its_data(tmp_path):
    """Ctrl-C twice in a row: the command exits 130 without waiting on its own, and the run,
    trained in a thread of the command, still ends ``stopped`` with its data (the exit waits
    for its update to end), not ``running`` or ``interrupted``, and no C++ abort at exit."""
    proc = _popen(tmp_path, "train", "--total-steps", "100000000", *TINY_FLAGS, "--no-progress")
    try:
        run_id = _wait_for_metrics(tmp_path / "data")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "terminate called" not in stderr, stderr
    with RunStore(tmp_path / "data") as store:
        run = store.get_run(run_id)
        assert run.status == "stopped" and run.env_steps > 0, (run.status, run.error)
        assert len(store.metrics(run_id)) > 0


@pytest.mark.slow
def test_kill_9_mid_run_is_reported_interrupted(tmp_path):
    # frequent checkpoints: a kill lands near one, where a checkpoint written before the
    # run's step count would be ahead of it
    proc = _popen(
        tmp_path,
        *("train", "--total-steps", "100000000", *TINY_FLAGS, "--no-progress"),
        *("--checkpoint-every", "3000", "--record-episodes", "0"),
    )
    try:
        run_id = _wait_for_metrics(tmp_path / "data")
        time.sleep(1.5)  # a few more flushes
        with RunStore(tmp_path / "data") as store:  # a second live process: run stays running
            assert store.get_run(run_id).status == "running"
            flushed = len(store.metrics(run_id))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    with RunStore(tmp_path / "data") as store:
        run = store.get_run(run_id)
        assert run.status == "interrupted"
        assert "killed or crashed" in run.error
        metrics = store.metrics(run_id)
        assert len(metrics) >= flushed > 0
        assert metrics["value"].notna().any()
        assert store.metrics_wide(run_id)["env_step"].max() <= run.env_steps
        steps = store.checkpoint_steps(run_id)
        assert len(steps) >= 2 and max(steps) <= run.env_steps  # never ahead of the run
        assert store.integrity_check() == "ok"
    listed = _last_json(cli(tmp_path / "data", "runs", "--json").stdout)
    assert listed[0]["status"] == "interrupted"


def test_solved_flag_matches_the_stored_returns(tmp_path):
    """A run whose returns rise past 475, hold, then fall (synthetic, stored through the run
    loop's own tracker): ``runs --json`` reports the solved and fell-below steps, the final and
    best returns exactly as Gym's rule recomputed from the stored returns gives them."""
    from gae_core.agent.config import TrainConfig
    from gae_core.outcome import ReturnTracker

    rng = np.random.default_rng(6)
    values = np.concatenate([
        np.linspace(20.0, 500.0, 150), np.full(120, 500.0), np.linspace(500.0, 150.0, 60),
        rng.uniform(100.0, 300.0, 40),
    ]).round(1)  # fmt: skip
    steps = np.cumsum(np.maximum(values, 1.0)).astype(int)  # an episode of CartPole: its length
    tracker = ReturnTracker(475.0)
    for step, value in zip(steps.tolist(), values.tolist(), strict=True):
        tracker.add(step, value)
    with RunStore(tmp_path / "data") as store:
        run_id = store.create_run(TrainConfig().to_dict(), name="synthetic", reward_threshold=475.0)
        assert store.claim_run(run_id)
        rows = [
            (M.EPISODIC_RETURN.key, int(s), 0.0, float(v))
            for s, v in zip(steps, values, strict=True)
        ]
        store.flush(run_id, rows, env_steps=int(steps[-1]), summary=tracker.summary())
        store.finish_run(run_id, "finished")
        returns = store.metrics(run_id, [M.EPISODIC_RETURN.key])
    (result,) = [r for r in _last_json(cli(tmp_path / "data", "runs", "--json").stdout)
                 if r["run_id"] == run_id]  # fmt: skip
    window = returns["value"].rolling(100).mean()
    reached = returns["env_step"][window >= 475.0]
    assert result["solved"] is True
    assert result["solved_at_step"] == int(reached.iloc[0])
    assert result["final_return"] == pytest.approx(returns["value"].tail(100).mean())
    # Best: the best mean of 100 consecutive episodes (full windows only).
    assert result["best_return"] == pytest.approx(window.max())
    below = returns["env_step"][(window < 475.0) & (returns["env_step"] > reached.iloc[0])]
    assert result["fell_below_at_step"] == int(below.iloc[0])
    assert result["stayed_solved"] is False
    # the plain-text listing says so too, not just "solved"
    (line,) = [
        x for x in cli(tmp_path / "data", "runs").stdout.splitlines() if result["run_id"] in x
    ]
    assert line.split()[6] == "fell", line  # (after ALGO and ENV)


@pytest.mark.slow
def test_train_algo_ppo_and_its_minibatch_check(tmp_path):
    """``--algo ppo`` starts from the env's PPO preset with the flags on top, trains, and the
    stored config and name say PPO; a minibatch larger than the rollout is refused before any
    run exists, naming the flag and the rollout's size."""
    done = cli(tmp_path / "data", "train", "--algo", "ppo", "--total-steps", "512",
               "--minibatch-size", "32", "--n-epochs", "2", *TINY_FLAGS, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "finished"
    with RunStore(tmp_path / "data") as store:
        run = store.get_run(result["run_id"])
        assert run.config["algo"] == "ppo" and run.config["gamma"] == 0.98  # the PPO preset's
        assert run.name.startswith("PPO CartPole-v1")
        assert len(store.metrics(run.id, [M.APPROX_KL.key])) > 0
    bad = cli(tmp_path / "data", "train", "--algo", "ppo", "--minibatch-size", "100",
              *TINY_FLAGS)  # fmt: skip
    assert bad.returncode == 2
    assert "--minibatch-size: minibatch_size must be at most num_envs × rollout_steps = 64" in (
        bad.stderr
    )
    with RunStore(tmp_path / "data") as store:
        assert len(store.list_runs()) == 1


def test_sweep_with_one_trial_stopped_by_the_user_exits_0(tmp_path, monkeypatch):
    """``stop RUN_ID`` on one trial of a sweep ends that trial ``stopped`` while the others
    finish: ``sweep`` reports ``finished`` and exits 0 (130 is for a cancel of the whole
    sweep)."""
    from test_sweep import _StopOneBackend

    from gae_core.runs import backends

    data = tmp_path / "data"
    monkeypatch.setattr(
        backends,
        "backend_factory",
        lambda *a, **k: lambda workers, trials, flush: _StopOneBackend(data),
    )
    done = cli_in_process(data, "sweep", "--seeds", "0", "1", "--total-steps", "100", "--json")
    assert done.returncode == 0, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "finished"
    assert result["counts"]["stopped"] == 1 and result["counts"]["finished"] == 1
    assert result["error"] == "1 of 2 trials stopped by request"


def test_sweep_on_a_full_disk_exits_1_with_one_line_and_not_running(tmp_path, monkeypatch):
    """A sweep whose store refuses writes for a full disk ends ``failed`` (not ``running``)
    with one line naming the full disk, and exits 1."""
    from test_sweep import _CheckpointBackend, fill_the_disk_on_first_report

    from gae_core.runs import backends

    data = tmp_path / "data"
    monkeypatch.setattr(
        backends,
        "backend_factory",
        lambda *a, **k: lambda workers, trials, flush: _CheckpointBackend(data),
    )
    fill_the_disk_on_first_report(monkeypatch)
    done = cli_in_process(data, "sweep", "--seeds", "0", "1", "--total-steps", "100", "--json")
    assert done.returncode == 1, done.stderr
    result = _last_json(done.stdout)
    assert result["status"] == "failed" and "is full" in result["error"]
    assert "\n" not in result["error"] and "Traceback" not in done.stderr


def test_a_flag_that_changes_nothing_given_the_others_is_said_to(tmp_path):
    """``--n-epochs`` under A2C, ``--use-sde`` on CartPole's discrete actions: a note each on
    stderr (as the Train form says of odd combinations), and the run trains; a flag that
    matters in some of a sweep's trials (an algorithm axis) gets none."""
    done = cli_in_process(tmp_path, "train", "--n-epochs", "5", "--use-sde", "--total-steps",
                          "200", *TINY_FLAGS, "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "has no effect" in line]
    assert notes == [
        "note: --n-epochs has no effect: --algo is a2c (one gradient step per rollout, "
        "no clipping)",
        "note: --use-sde has no effect: CartPole-v1's actions are discrete",
    ]
    quiet = cli_in_process(tmp_path, "train", "--total-steps", "200", *TINY_FLAGS,
                           "--no-progress")  # fmt: skip
    assert "has no effect" not in quiet.stderr, quiet.stderr
    swept = cli_in_process(tmp_path, "sweep", "--grid", "algo=a2c,ppo", "--n-epochs", "2",
                           "--minibatch-size", "64", "--seeds", "0", "--total-steps", "200",
                           *TINY_FLAGS, "--no-progress")  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    assert "--n-epochs has no effect" not in swept.stderr, swept.stderr
