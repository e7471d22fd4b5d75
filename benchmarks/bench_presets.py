"""Every preset against Stable-Baselines3 with the RL-Zoo's configuration, side by side: A2C's
presets against SB3's A2C, PPO's (``--algo ppo``) against SB3's PPO and CleanRL's published
``ppo_continuous_action`` figures.

Same env-step budget and same seeds for both; each run in its own subprocess; results appended to
a JSON-lines file so a long study can be run in pieces and reported at once:

    python benchmarks/bench_presets.py run --envs CartPole-v1 --seeds 0-9 --impl ours
    python benchmarks/bench_presets.py run --envs Pendulum-v1 Acrobot-v1 --seeds 0-4
    python benchmarks/bench_presets.py run --algo ppo --envs HalfCheetah-v5 --seeds 0-4 \
        --impl ours --population     # the seeds as one trainer (population speed)
    python benchmarks/bench_presets.py report [--algo ppo]

``--population`` trains our seeds of one env as the members of one trainer in one process (what
a sweep does); each member is still scored as its own run.

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

Targets: A2C (issue "A trainer whose results can be trusted"): our median final ≥ SB3's on every
classic-control env; CartPole final ≥ 475 on 10 of 10 seeds with no run below 475 in its last
20 %. PPO (issue "One trainer"): our median final ≥ SB3's PPO on every classic env, and ≥
CleanRL's published mean at 1M steps on HalfCheetah, Hopper and Walker2d. Beside each verdict
against SB3: the Mann-Whitney p of the two sides' finals and a bootstrap interval of the gap
between their medians, so a verdict that a coin flip of seeds decides reads as one.
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
#: What computes our runs today (see ADDED_LATER): the one trainer, and without gSDE its
#: gradient by hand (``engine_of``), A2C's or PPO's.
ENGINE = "trainer"
ENGINE_BY_HAND = {"a2c": "trainer, A2C by hand", "ppo": "trainer, PPO by hand"}
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

# The RL-Zoo's PPO rows (rl-baselines3-zoo/hyperparams/ppo.yml) as SB3 keyword arguments; the
# Zoo has no row for the MuJoCo -v5 ids: HalfCheetah takes its tuned HalfCheetah-v4 row.
ZOO_PPO = {
    "CartPole-v1": {"n_envs": 8, "n_timesteps": 100_000, "n_steps": 32, "batch_size": 256,
                    "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
                    "learning_rate": "lin_0.001", "clip_range": "lin_0.2"},
    "Acrobot-v1": {"normalize": True, "n_envs": 16, "n_timesteps": 1_000_000, "n_steps": 256,
                   "gae_lambda": 0.94, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
    "MountainCar-v0": {"normalize": True, "n_envs": 16, "n_timesteps": 1_000_000, "n_steps": 16,
                       "gae_lambda": 0.98, "gamma": 0.99, "n_epochs": 4, "ent_coef": 0.0},
    "MountainCarContinuous-v0": {
        "normalize": True, "n_envs": 1, "n_timesteps": 20_000, "batch_size": 256, "n_steps": 8,
        "gamma": 0.9999, "learning_rate": 7.77e-05, "ent_coef": 0.00429, "clip_range": 0.1,
        "n_epochs": 10, "gae_lambda": 0.9, "max_grad_norm": 5, "vf_coef": 0.19, "use_sde": True,
        "policy_kwargs": {"log_std_init": -3.29, "ortho_init": False},
    },
    "Pendulum-v1": {"n_envs": 4, "n_timesteps": 100_000, "n_steps": 1024, "gae_lambda": 0.95,
                    "gamma": 0.9, "n_epochs": 10, "ent_coef": 0.0, "learning_rate": 1e-3,
                    "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4},
    "HalfCheetah-v5": {
        "normalize": True, "n_timesteps": 1_000_000, "batch_size": 64, "n_steps": 512,
        "gamma": 0.98, "learning_rate": 2.0633e-05, "ent_coef": 0.000401762, "clip_range": 0.1,
        "n_epochs": 20, "gae_lambda": 0.92, "max_grad_norm": 0.8, "vf_coef": 0.58096,
        "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu",
                          "net_arch": {"pi": [256, 256], "vf": [256, 256]}},
    },
}  # fmt: skip
# CleanRL's published ppo_continuous_action results at 1M steps on the v4 tasks (mean ± std of
# the episodic return over seeds, its docs' benchmark table).
CLEANRL_PUBLISHED = {
    "HalfCheetah-v5": (1442.64, 46.03),
    "Hopper-v5": (2382.86, 271.74),
    "Walker2d-v5": (2287.95, 571.78),
    "InvertedPendulum-v5": (963.09, 22.20),
}
LOCOMOTION = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")
CLASSIC = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
           "Pendulum-v1")  # fmt: skip

_OURS = """
import json, sys, time
import numpy as np
from gae_core.agent.presets import preset_config
from gae_core.agent.trainer import Trainer
env_id, algo, seeds = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
ENGINE = sys.argv[4]  # bench_presets.engine_of, checked against the trainer below
configs = [preset_config(env_id, algo, seed=seed, checkpoint_every=0, record_episodes=0,
                         eval_every=0) for seed in seeds]
trainer = Trainer(configs)  # one member per seed: a population when there are several
assert trainer.by_hand == (ENGINE != "trainer"), (ENGINE, trainer.by_hand)
steps, returns = [[] for _ in seeds], [[] for _ in seeds]
started = time.perf_counter()
while not trainer.done:
    for member, result in trainer.step().items():
        for episode in result.episodes:
            steps[member].append(episode.env_step)
            returns[member].append(episode.return_)
wall_s = time.perf_counter() - started
for member, seed in enumerate(seeds):
    evaluation = trainer.evaluate(member, 10, seed=10_000 + seed)
    print(json.dumps({"seed": seed, "steps": steps[member], "returns": returns[member],
                      "budget": configs[member].total_steps, "wall_s": wall_s,
                      "members": len(seeds), "eval_returns": evaluation, "engine": ENGINE}))
"""

_SB3 = """
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
env_id, seed, zoo, algo = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
zoo = dict(zoo)
kwargs = zoo.get("policy_kwargs", {})
if kwargs.get("activation_fn") == "relu":
    kwargs["activation_fn"] = torch.nn.ReLU
budget = int(zoo.pop("n_timesteps"))
env = make_vec_env(env_id, n_envs=zoo.pop("n_envs", 1), seed=seed)
gamma = zoo.get("gamma", 0.99)
if zoo.pop("normalize", False):
    env = VecNormalize(env, gamma=gamma)
def schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda remaining: remaining * start
    return value
lr = schedule(zoo.pop("learning_rate", 7e-4 if algo == "a2c" else 3e-4))
if "clip_range" in zoo:
    zoo["clip_range"] = schedule(zoo["clip_range"])
steps, returns = [], []
class Episodes(BaseCallback):
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                steps.append(self.num_timesteps)
                returns.append(float(info["episode"]["r"]))
        return True
model = (A2C if algo == "a2c" else PPO)("MlpPolicy", env, learning_rate=lr, seed=seed,
                                        device="cpu", **zoo)
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
#: since the one trainer "trainer" (stacked networks, autograd), and without gSDE "trainer, A2C
#: by hand" (losses.a2c_gradients) and "trainer, PPO by hand" (losses.ppo_gradients), both since
#: 2026-11-26; trajectories differ in float rounding and in how a run's actions are drawn, so
#: each engine's rows are its own.
#: ``normalize_clip``: rows run before it existed never clipped (0.0); ``reward_norm_reset``:
#: their return restarted at termination only; ``sde_sample_freq``: gSDE's matrices were drawn
#: once per rollout. Each is left out of the fingerprint of a preset whose normalisation it does
#: not touch.
ADDED_LATER = {
    "use_sde": False,
    "ortho_init": True,
    "engine": "autograd",
    "normalize_clip": 0.0,
    "reward_norm_reset": "termination",
    "sde_sample_freq": -1,
}


#: Fields that change what a run logs, not what it learns: never part of the fingerprint.
LOGGING_ONLY = ("log_every",)


def engine_of(config) -> str:
    """What trains ``config`` today: the trainer, with its gradient by hand where it takes it."""
    from gae_core.agent.update import gradient_by_hand

    return ENGINE_BY_HAND[config.algo] if gradient_by_hand(config) else ENGINE


def preset_fingerprint(env_id: str, algo: str = "a2c", engine: str | None = None) -> str:
    """A short hash of today's preset for ``env_id`` and ``algo`` (every field but the seed)
    and of the engine it trains on (today's, or ``engine``)."""
    from gae_core.agent.presets import preset_config

    config = preset_config(env_id, algo, seed=0)
    fields = dataclasses.asdict(config)
    fields.pop("seed")
    fields["engine"] = engine or engine_of(config)
    for name in LOGGING_ONLY:
        fields.pop(name)
    if not (config.normalize_observations or config.normalize_rewards):
        fields.pop("normalize_clip")
    if not config.normalize_rewards:
        fields.pop("reward_norm_reset")
    if config.algo == "a2c":  # fields added with PPO, idle for A2C: A2C rows keep their hash
        from gae_core.agent.config import PPO_FIELDS

        for name in ("algo", *PPO_FIELDS):
            fields.pop(name)
    for name, old_behaviour in ADDED_LATER.items():
        if fields.get(name) == old_behaviour:
            del fields[name]
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def run_one(impl: str, env_id: str, seeds: list[int], algo: str = "a2c") -> list[dict]:
    """Our runs of ``seeds`` (one trainer of them all) or SB3's of one seed; one row per seed."""
    if impl == "ours":
        from gae_core.agent.presets import preset_config

        engine = engine_of(preset_config(env_id, algo))
        command = [sys.executable, "-c", _OURS, env_id, algo, ",".join(map(str, seeds)), engine]
    else:
        zoo = (ZOO if algo == "a2c" else ZOO_PPO)[env_id]
        command = [sys.executable, "-c", _SB3, env_id, str(seeds[0]), json.dumps(zoo), algo]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        return [{"impl": impl, "algo": algo, "env": env_id, "seed": seed,
                 "error": done.stderr[-2000:]} for seed in seeds]  # fmt: skip
    rows = []
    for line in done.stdout.strip().splitlines():
        if not line.startswith("{"):
            continue
        raw = json.loads(line)
        seed = raw.get("seed", seeds[0])
        row = {"impl": impl, "algo": algo, "env": env_id, "seed": seed,
               **summarize(raw, env_id)}  # fmt: skip
        for key in ("engine", "members"):
            if key in raw:
                row[key] = raw[key]
        if impl == "ours":
            row["preset"] = preset_fingerprint(env_id, algo)
        rows.append(row)
    return rows


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(x) for x in text.split(",")]


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    impls = ["ours", "sb3"] if args.impl == "both" else [args.impl]
    seeds = seeds_of(args.seeds)
    jobs = []
    for env in args.envs:
        for impl in impls:
            if impl == "ours" and args.population:
                jobs.append((impl, env, seeds, args.algo))
            else:
                jobs += [(impl, env, [seed], args.algo) for seed in seeds]
    started = time.perf_counter()
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for results in pool.map(lambda job: run_one(*job), jobs):
            for result in results:
                with out.open("a") as handle:
                    handle.write(json.dumps(result) + "\n")
                print(
                    f"{result['impl']:<5} {args.algo} {result['env']:<26} seed "
                    f"{result['seed']}: final {result.get('final')}  late min "
                    f"{result.get('late_min')}  {result.get('wall_s', 0):.0f} s  "
                    f"{result.get('error', '')[:200]}",
                    flush=True,
                )
    print(f"{len(jobs)} jobs in {time.perf_counter() - started:.0f} s -> {out}")


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("algo", "a2c") == args.algo]
    current = {env: preset_fingerprint(env, args.algo) for env in {r["env"] for r in rows}}
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
        if env in ZOO_PUBLISHED and args.algo == "a2c":
            mean, std = ZOO_PUBLISHED[env]
            published = f"{env:<26}{'zoo':<6}{'1':>6}{'':>24}{mean:>13.1f}"
            print(f"{published}  ± {std:.1f} published (benchmark.md)")
        if env in CLEANRL_PUBLISHED and args.algo == "ppo":
            mean, std = CLEANRL_PUBLISHED[env]
            print(f"{env:<26}{'clean':<6}{'':>6}{mean:>14.1f}  ± {std:.1f} published (CleanRL, "
                  "v4, 1M steps)")  # fmt: skip
            if "ours" in medians and env in LOCOMOTION:
                ok = medians["ours"] >= mean
                verdicts.append(
                    f"{env}: median final ours {medians['ours']:.1f} vs CleanRL's mean "
                    f"{mean:.1f}: {'PASS' if ok else 'FAIL'} (target ours ≥ CleanRL)"
                )
        if {"ours", "sb3"} <= set(medians) and env in CLASSIC:
            ok = medians["ours"] >= medians["sb3"]
            ours = [r["final"] for (i, e, _), r in latest.items() if i == "ours" and e == env]
            theirs = [r["final"] for (i, e, _), r in latest.items() if i == "sb3" and e == env]
            p = mann_whitney(ours, theirs)
            from gae_core.insight.stats import CONFIDENCE_TEXT, median_gap_ci

            gap, low, high = median_gap_ci(ours, theirs)
            verdicts.append(
                f"{env}: median final ours {medians['ours']:.1f} vs SB3 {medians['sb3']:.1f}: "
                f"{'PASS' if ok else 'FAIL'} (target ours ≥ SB3; Mann-Whitney p = {p:.3f}; "
                f"ours − SB3 {gap:+.1f}, {CONFIDENCE_TEXT} bootstrap interval "
                f"[{low:+.1f}, {high:+.1f}] over {len(ours)} and {len(theirs)} seeds)"
            )
    ours_cartpole = [r for (i, e, _), r in latest.items() if i == "ours" and e == "CartPole-v1"]
    if ours_cartpole and args.algo == "a2c":
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


def mann_whitney(a: list[float], b: list[float]) -> float:
    """The two-sided Mann-Whitney U test's p-value (scipy) of two samples of final returns."""
    from scipy.stats import mannwhitneyu

    if not a or not b or len(set(a) | set(b)) == 1:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def compare_engines(args: argparse.Namespace) -> None:
    """Today's engine against an older one's rows of the same preset (the rerun after a
    trainer change): per env, the medians and the Mann-Whitney p of the final returns."""
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["impl"] == "ours" and r.get("algo", "a2c") == args.algo
            and r.get("final") is not None]  # fmt: skip
    if args.engine is None:
        args.engine = "numpy" if args.algo == "a2c" else ENGINE
    from gae_core.insight.stats import CONFIDENCE_TEXT, median_gap_ci

    print(
        f"{'env':<26}{'engine':<22}{'seeds':>6}{'median':>10}   vs {args.engine} (p; the gap "
        f"of medians, today − {args.engine}, with its {CONFIDENCE_TEXT} bootstrap interval)"
    )
    for env in dict.fromkeys(r["env"] for r in rows):
        today = preset_fingerprint(env, args.algo)
        now = {r["seed"]: r["final"] for r in rows
               if r["env"] == env and r.get("preset") == today}  # fmt: skip
        engine = next((r["engine"] for r in rows if r.get("preset") == today), ENGINE)
        # the older engine's rows of the same preset (its fingerprint under that engine)
        before = preset_fingerprint(env, args.algo, engine=args.engine)
        old = {r["seed"]: r["final"] for r in rows if r["env"] == env
               and r.get("engine", "autograd") == args.engine
               and r.get("preset") in (before, None)}  # fmt: skip
        if not now or not old or engine == args.engine:
            continue
        drop = statistics.median(now.values()) < statistics.median(old.values())
        p = mann_whitney(list(now.values()), list(old.values()))
        gap, low, high = median_gap_ci(list(now.values()), list(old.values()))
        print(f"{env:<26}{engine:<22}{len(now):>6}{statistics.median(now.values()):>10.1f}   "
              f"{args.engine} {len(old)} seeds {statistics.median(old.values()):.1f} "
              f"(p = {p:.3f}; {gap:+.1f} [{low:+.1f}, {high:+.1f}]) "
              f"{'LOWER' if drop else 'not lower'}")  # fmt: skip


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
    runner.add_argument("--algo", choices=("a2c", "ppo"), default="a2c")
    runner.add_argument("--population", action="store_true",
                        help="our seeds of an env as one trainer (one process)")  # fmt: skip
    runner.set_defaults(handler=run)
    engines = sub.add_parser("engines", help="today's rows against an older engine's")
    engines.add_argument("--out", default=str(DEFAULT_OUT))
    engines.add_argument("--algo", choices=["a2c", "ppo"], default="a2c")
    engines.add_argument(
        "--engine",
        default=None,
        help="the older rows' engine (default: numpy for A2C, trainer for PPO)",
    )
    engines.set_defaults(handler=compare_engines)
    reporter = sub.add_parser("report")
    reporter.add_argument("--out", default=str(DEFAULT_OUT))
    reporter.add_argument("--algo", choices=("a2c", "ppo"), default="a2c")
    reporter.add_argument(
        "--curves", nargs="*", metavar="ENV", default=None,
        help="also print these envs' learning curves (at each fifth of the budget)",
    )  # fmt: skip
    reporter.set_defaults(handler=report)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
