"""Every preset against Stable-Baselines3's A2C with the RL-Zoo's configuration, side by side.

Same env-step budget and same seeds for both; each run in its own subprocess; results appended to
a JSON-lines file so a long study can be run in pieces and reported at once:

    python benchmarks/bench_presets.py run --envs CartPole-v1 --seeds 0-9 --impl ours
    python benchmarks/bench_presets.py run --envs Pendulum-v1 Acrobot-v1 --seeds 0-4
    python benchmarks/bench_presets.py report

"final" is the mean return of the last 100 training episodes at the end of the budget (both
sides count the env's own rewards: our runs under reward normalisation too, SB3's through its
Monitor below VecNormalize). "late min" is the lowest 100-episode mean over the last 20 % of the
budget: a run that solved and then collapsed shows there. "eval" is the mean of 10 deterministic
episodes (mean / argmax action, normalisation frozen) after training, the measure of the Zoo's
published table (``benchmark.md``). SB3's rows are the Zoo's
``hyperparams/a2c.yml`` (its VecNormalize and gSDE included); its MuJoCo rows are for the v4
tasks, run here on v5.

Each of our rows carries a fingerprint of the preset it ran (every config field but the seed);
the report counts only rows whose fingerprint matches today's preset and says how many older rows
it left out, so a preset change can never be reported with the old preset's numbers.

Targets (issue "A trainer whose results can be trusted"): our median final ≥ SB3's on every
classic-control env; CartPole final ≥ 475 on 10 of 10 seeds with no run below 475 in its last
20 %.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: What computes our runs today (see ADDED_LATER).
ENGINE = "trainer"
sys.path.insert(0, str(ROOT))  # run from anywhere
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "presets.jsonl"

# The RL-Zoo's A2C rows (rl-baselines3-zoo/hyperparams/a2c.yml), as SB3 keyword arguments.
_SB3_DEFAULTS = {"n_envs": 1, "normalize": False}
ZOO = {
    "CartPole-v1": {"n_envs": 8, "n_timesteps": 500_000, "ent_coef": 0.0},
    "Acrobot-v1": {"normalize": True, "n_envs": 16, "n_timesteps": 500_000, "ent_coef": 0.0},
    "MountainCar-v0": {"normalize": True, "n_envs": 16, "n_timesteps": 1_000_000, "ent_coef": 0.0},
    "MountainCarContinuous-v0": {
        "normalize": True,
        "n_envs": 4,
        "n_steps": 100,
        "n_timesteps": 100_000,
        "ent_coef": 0.0,
        "use_sde": True,
        "sde_sample_freq": 16,
        "policy_kwargs": {"log_std_init": 0.0, "ortho_init": False},
    },
    "Pendulum-v1": {
        "normalize": True,
        "n_envs": 8,
        "n_timesteps": 1_000_000,
        "ent_coef": 0.0,
        "max_grad_norm": 0.5,
        "n_steps": 8,
        "gae_lambda": 0.9,
        "vf_coef": 0.4,
        "gamma": 0.9,
        "use_rms_prop": True,
        "normalize_advantage": False,
        "learning_rate": "lin_7e-4",
        "use_sde": True,
        "policy_kwargs": {"log_std_init": -2.0, "ortho_init": False},
    },
    **{
        env_id: {"normalize": True, "n_timesteps": 1_000_000}
        for env_id in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
    },
}
# The Zoo's published A2C results (rl-baselines3-zoo benchmark.md): one trained agent per env,
# mean ± std of deterministic evaluation episodes; MuJoCo rows are the v3 tasks at 1M steps.
# The Zoo publishes no A2C row for Walker2d (only Walker2DBulletEnv-v0), so there is none here.
ZOO_PUBLISHED = {
    "CartPole-v1": (500.0, 0.0),
    "Acrobot-v1": (-83.353, 17.213),
    "MountainCar-v0": (-111.263, 24.087),
    "MountainCarContinuous-v0": (91.166, 0.255),
    "Pendulum-v1": (-162.965, 103.210),
    "HalfCheetah-v5": (3041.174, 157.265),
    "Hopper-v5": (733.454, 376.574),
}
THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "MountainCar-v0": -110.0}

_OURS = """
import json, sys, time
import numpy as np
from gae_core.agent.presets import preset_config
from gae_core.agent.trainer import Trainer
ENGINE = "trainer"  # the one trainer: stacked networks, autograd (bench_presets.ENGINE)
env_id, seed = sys.argv[1], int(sys.argv[2])
config = preset_config(env_id, seed=seed, checkpoint_every=0, record_episodes=0, eval_every=0)
trainer = Trainer(config)
steps, returns = [], []
started = time.perf_counter()
while not trainer.done:
    for result in trainer.step().values():
        for episode in result.episodes:
            steps.append(episode.env_step)
            returns.append(episode.return_)
wall_s = time.perf_counter() - started
evaluation = trainer.evaluate(0, 10, seed=10_000 + seed)
print(json.dumps({"steps": steps, "returns": returns, "budget": config.total_steps,
                  "wall_s": wall_s, "eval_returns": evaluation, "engine": ENGINE}))
"""

_SB3 = """
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
env_id, seed, zoo = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
zoo = dict(zoo)
budget = int(zoo.pop("n_timesteps"))
env = make_vec_env(env_id, n_envs=zoo.pop("n_envs", 1), seed=seed)
gamma = zoo.get("gamma", 0.99)
if zoo.pop("normalize", False):
    env = VecNormalize(env, gamma=gamma)
lr = zoo.pop("learning_rate", 7e-4)
if isinstance(lr, str) and lr.startswith("lin_"):
    start = float(lr[4:])
    lr = lambda remaining: remaining * start
steps, returns = [], []
class Episodes(BaseCallback):
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                steps.append(self.num_timesteps)
                returns.append(float(info["episode"]["r"]))
        return True
model = A2C("MlpPolicy", env, learning_rate=lr, seed=seed, device="cpu", **zoo)
started = time.perf_counter()
model.learn(total_timesteps=budget, callback=Episodes())
wall_s = time.perf_counter() - started
from stable_baselines3.common.evaluation import evaluate_policy
eval_env = make_vec_env(env_id, n_envs=1, seed=10_000 + seed)
if isinstance(env, VecNormalize):  # the training statistics, frozen; raw rewards
    eval_env = VecNormalize(eval_env, training=False, norm_reward=False, gamma=gamma)
    eval_env.obs_rms = env.obs_rms
evaluation, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True,
                                return_episode_rewards=True)
print(json.dumps({"steps": steps, "returns": returns, "budget": budget,
                  "wall_s": wall_s, "eval_returns": [float(r) for r in evaluation]}))
"""


def summarize(raw: dict, env_id: str) -> dict:
    steps, returns = np.asarray(raw["steps"], float), np.asarray(raw["returns"], float)
    budget = raw["budget"]
    out = {"episodes": len(returns), "budget": budget, "wall_s": raw["wall_s"]}
    if raw.get("eval_returns"):  # 10 deterministic episodes after training (the Zoo's measure)
        out["eval"] = float(np.mean(raw["eval_returns"]))
    out["final"] = float(returns[-100:].mean()) if len(returns) else None
    if len(returns) >= 100:
        window = np.convolve(returns, np.ones(100) / 100, mode="valid")
        window_steps = steps[99:]
        out["best"] = float(window.max())
        late = window[window_steps >= 0.8 * budget]
        out["late_min"] = float(late.min()) if len(late) else None
        threshold = THRESHOLDS.get(env_id)
        if threshold is not None:
            hits = np.flatnonzero(window >= threshold)
            out["solved_at"] = int(window_steps[hits[0]]) if len(hits) else None
        grid = np.linspace(0, budget, 21)[1:]
        index = np.searchsorted(window_steps, grid, side="right") - 1
        out["curve"] = [
            [int(g), float(window[i]) if i >= 0 else None] for g, i in zip(grid, index, strict=True)
        ]
    return out


#: Config fields added after rows in the results file were run, with the value that gives the
#: behaviour those runs had: left out of the fingerprint at that value, so adding a field does
#: not disown every earlier row, and any preset that sets it otherwise gets a new fingerprint.
#: ``engine`` is not a config field but what computed a run: rows run before the NumPy engine
#: were "autograd" (the single-run torch path), then "numpy" (its hand-derived gradients), and
#: since the one trainer "trainer" (stacked networks, autograd); trajectories differ in float
#: rounding and in how a run's actions are drawn, so each engine's rows are its own.
#: ``normalize_clip``: rows run before it existed never clipped (0.0); ``reward_norm_reset``:
#: their return restarted at termination only. Each is left out of the fingerprint of a preset
#: whose normalisation it does not touch.
ADDED_LATER = {
    "use_sde": False,
    "ortho_init": True,
    "engine": "autograd",
    "normalize_clip": 0.0,
    "reward_norm_reset": "termination",
}


#: Fields that change what a run logs, not what it learns: never part of the fingerprint.
LOGGING_ONLY = ("log_every",)


def preset_fingerprint(env_id: str) -> str:
    """A short hash of today's preset for ``env_id`` (every field but the seed) and of the
    engine it trains on."""
    from gae_core.agent.presets import preset_config

    config = preset_config(env_id, seed=0)
    fields = dataclasses.asdict(config)
    fields.pop("seed")
    fields["engine"] = ENGINE
    for name in LOGGING_ONLY:
        fields.pop(name)
    if not (config.normalize_observations or config.normalize_rewards):
        fields.pop("normalize_clip")
    if not config.normalize_rewards:
        fields.pop("reward_norm_reset")
    for name, old_behaviour in ADDED_LATER.items():
        if fields.get(name) == old_behaviour:
            del fields[name]
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def run_one(impl: str, env_id: str, seed: int) -> dict:
    if impl == "ours":
        command = [sys.executable, "-c", _OURS, env_id, str(seed)]
    else:
        command = [sys.executable, "-c", _SB3, env_id, str(seed), json.dumps(ZOO[env_id])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        return {"impl": impl, "env": env_id, "seed": seed, "error": done.stderr[-2000:]}
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    row = {"impl": impl, "env": env_id, "seed": seed, **summarize(raw, env_id)}
    if "engine" in raw:
        row["engine"] = raw["engine"]
    if impl == "ours":
        row["preset"] = preset_fingerprint(env_id)
    return row


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(x) for x in text.split(",")]


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    impls = ["ours", "sb3"] if args.impl == "both" else [args.impl]
    jobs = [
        (impl, env, seed) for env in args.envs for seed in seeds_of(args.seeds) for impl in impls
    ]
    started = time.perf_counter()
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for result in pool.map(lambda job: run_one(*job), jobs):
            with out.open("a") as handle:
                handle.write(json.dumps(result) + "\n")
            print(
                f"{result['impl']:<5} {result['env']:<26} seed {result['seed']}: "
                f"final {result.get('final')}  late min {result.get('late_min')}  "
                f"{result.get('wall_s', 0):.0f} s  {result.get('error', '')[:200]}",
                flush=True,
            )
    print(f"{len(jobs)} runs in {time.perf_counter() - started:.0f} s -> {out}")


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    current = {env: preset_fingerprint(env) for env in {r["env"] for r in rows}}
    stale = [r for r in rows if r["impl"] == "ours" and r.get("preset") != current[r["env"]]]
    stale += [r for r in rows if r.get("superseded")]  # code fixed since (the row says how)
    latest: dict[tuple, dict] = {}
    for row in rows:  # the last result of a run wins (a rerun replaces it)
        if row not in stale:
            latest[(row["impl"], row["env"], row["seed"])] = row
    envs = list(dict.fromkeys(env for _, env, _ in latest))
    print(
        f"{'env':<26}{'impl':<6}{'seeds':>6}{'median final':>14}{'min late':>10}"
        f"{'median eval':>13}  finals"
    )
    verdicts = []
    for env in envs:
        medians = {}
        for impl in ("ours", "sb3"):
            runs = [r for (i, e, _), r in sorted(latest.items()) if i == impl and e == env]
            good = [r for r in runs if r.get("final") is not None]
            if not good:
                continue
            finals = [r["final"] for r in good]
            medians[impl] = statistics.median(finals)
            lates = [r["late_min"] for r in good if r.get("late_min") is not None]
            evals = [r["eval"] for r in good if r.get("eval") is not None]
            print(
                f"{env:<26}{impl:<6}{len(good):>6}{medians[impl]:>14.1f}"
                f"{min(lates) if lates else float('nan'):>10.1f}"
                f"{statistics.median(evals) if evals else float('nan'):>13.1f}  "
                + " ".join(f"{f:.0f}" for f in finals)
            )
        if env in ZOO_PUBLISHED:
            mean, std = ZOO_PUBLISHED[env]
            published = f"{env:<26}{'zoo':<6}{'1':>6}{'':>24}{mean:>13.1f}"
            print(f"{published}  ± {std:.1f} published (benchmark.md)")
        if {"ours", "sb3"} <= set(medians) and env in ("CartPole-v1", "Acrobot-v1",
                "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"):  # fmt: skip
            ok = medians["ours"] >= medians["sb3"]
            verdicts.append(
                f"{env}: median final ours {medians['ours']:.1f} vs SB3 {medians['sb3']:.1f}: "
                f"{'PASS' if ok else 'FAIL'} (target ours ≥ SB3)"
            )
    ours_cartpole = [r for (i, e, _), r in latest.items() if i == "ours" and e == "CartPole-v1"]
    if ours_cartpole:
        solved = sum(r.get("final", 0) >= 475 for r in ours_cartpole)
        stayed = sum((r.get("late_min") or 0) >= 475 for r in ours_cartpole)
        ok = solved == stayed == len(ours_cartpole) >= 10
        verdicts.append(
            f"CartPole-v1: final ≥ 475 on {solved}/{len(ours_cartpole)} seeds, never below 475 in "
            f"the last 20 % on {stayed}/{len(ours_cartpole)}: {'PASS' if ok else 'FAIL'} "
            "(target 10/10 and 10/10)"
        )
    if stale:
        envs_left = sorted({r["env"] for r in stale})
        verdicts.append(
            f"left out: {len(stale)} of our rows from older presets or superseded code "
            f"({', '.join(envs_left)})"
        )
    print("\n".join(["", *verdicts]))
    if args.curves:
        print_curves(latest, args.curves)


def print_curves(latest: dict[tuple, dict], envs: list[str]) -> None:
    """The learning curves (100-episode mean of the training returns) at every fifth of the
    budget, per run and as the median over seeds: what the README's curve tables quote."""
    print("\nlearning curves: 100-episode mean at each fifth of the budget")
    for env in envs:
        for impl in ("ours", "sb3"):
            runs = [r for (i, e, _), r in sorted(latest.items()) if i == impl and e == env]
            runs = [r for r in runs if r.get("curve")]
            if not runs:
                continue
            marks = [point[0] for point in runs[0]["curve"]][3::4]  # 20 points → 5
            print(f"{env} {impl}: at " + " ".join(f"{m / 1e3:.0f}k" for m in marks))
            table = []
            for run in runs:
                by_step = dict((step, value) for step, value in run["curve"])
                values = [by_step.get(m) for m in marks]
                table.append(values)
                cells = " ".join("—" if v is None else f"{v:.0f}" for v in values)
                print(f"  seed {run['seed']}: {cells}")
            medians = []
            for column in zip(*table, strict=True):
                known = [v for v in column if v is not None]
                medians.append(f"{statistics.median(known):.0f}" if known else "—")
            print(f"  median: {' '.join(medians)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run")
    runner.add_argument("--envs", nargs="+", default=list(ZOO))
    runner.add_argument("--seeds", default="0-4", help="0-4 or 0,3,7")
    runner.add_argument("--impl", choices=("ours", "sb3", "both"), default="both")
    runner.add_argument("--jobs", type=int, default=2, help="runs at once (one core each)")
    runner.add_argument("--out", default=str(DEFAULT_OUT))
    runner.set_defaults(handler=run)
    reporter = sub.add_parser("report")
    reporter.add_argument("--out", default=str(DEFAULT_OUT))
    reporter.add_argument(
        "--curves", nargs="*", metavar="ENV", default=None,
        help="also print these envs' learning curves (at each fifth of the budget)",
    )  # fmt: skip
    reporter.set_defaults(handler=report)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
