"""The λ study users run most, through each way a sweep can train, in one script run.

    python benchmarks/bench_study.py [--seeds 0-9] [--lambdas ...] [--total-steps 200000]
                                     [--modes single population ray] [--workers 2]
                                     [--config preset|field-defaults|halfcheetah]
                                     [--baseline REV]

CartPole-v1 from its preset, as the compare page and ``sweep`` launch it (8 envs × 5 steps,
RMSprop 7e-4, the critic's target held fixed, an evaluation every 25k steps and a checkpoint
with 2 recorded episodes every 50k), 7 λ × 10 seeds × 200k env steps by default, each mode in a
fresh data folder. ``--config field-defaults`` runs the study the issue first timed (168 s on 2
workers then): ``TrainConfig``'s field defaults, 16 envs × 64 steps with Adam 5e-3, no
checkpoints.

* ``single``: the local process pool before populations, one trial per worker process at a
  time (``--population 1``);
* ``population``: the local pool with batched populations (the default since: each worker
  trains its share of the trials as one population, :class:`gae_core.agent.trainer.Trainer`);
* ``ray``: Ray tasks on a local Ray (``ray.init(num_cpus=workers)``, started before its timer),
  each task a population, split as the local pool splits them (:mod:`gae_core.runs.gather`);
* ``ray-single`` (not run unless named): Ray with one trial per task, as before populations
  ran on Ray.

``--config halfcheetah`` times HalfCheetah-v5 from its A2C preset (normalised observations and
rewards; 4 λ × 4 seeds × 100k steps with ``--lambdas 0.9 0.95 0.99 1 --seeds 0-3
--total-steps 100000``) and prints the physics ceiling beside it: gymnasium's own HalfCheetah
step with random actions, one 8-env vector env per worker process, measured in the same run.

``--baseline REV`` runs the same study on the code of git revision ``REV`` first (a detached
worktree in a temporary folder, ``benchmarks/baseline.py``), mode by mode, and prints each
mode's ratio to it: the "no slower than the commit before" check, side by side in one run.

Prints, per mode, the study's wall time (grid submitted → every trial closed in the store,
worker start-up included), the aggregate env steps/s, the ratio to ``single``, and a PASS/FAIL
against the issue's target for the full study (≤ 30 s on a 2-core machine) with the figures
at full precision. Every trial is checked to have finished. Results of one row per mode are
appended to ``benchmarks/results/study.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gae_core.agent.config import TrainConfig
from gae_core.agent.envs import reward_threshold
from gae_core.agent.presets import preset_config
from gae_core.runs.backends import DEFAULT_MEMBERS, backend_factory
from gae_core.runs.gather import population_capacity
from gae_core.runs.sweep import grid_of, hold_critic_target, run_sweep
from gae_core.storage.store import RunStore

TARGET_S = 30.0
RESULTS = Path(__file__).resolve().parent / "results" / "study.jsonl"
MODES = ("single", "population", "ray", "ray-single")
DEFAULT_MODES = ("single", "population", "ray")


def _cpu_model() -> str:
    """The CPU's model name, its L2 per core and whether it has AVX-512: the same code's
    timings differ several-fold across the CPUs this machine kind has had (a row says which
    it was measured on)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line for line in info.splitlines() if line.startswith("model name"))
        model = model.split(":", 1)[1].strip()
        l2 = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
        avx512 = "AVX-512" if " avx512f" in info else "no AVX-512"
        return f"{model}, L2 {l2} a core, {avx512}"
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


CPU_MODEL = _cpu_model()


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def _members(mode: str) -> int:
    """The most trials one worker or task trains as a population in ``mode``."""
    return DEFAULT_MEMBERS if mode in ("population", "ray") else 1


def time_study(base, grid: dict, workers: int, mode: str) -> tuple[float, int, list[float]]:
    """(wall seconds, env steps of all trials, final returns) of one sweep in ``mode``."""
    backend = backend_factory("ray" if mode.startswith("ray") else "local", members=_members(mode))
    with tempfile.TemporaryDirectory(prefix="bench-study-") as data_dir:
        store = RunStore(data_dir)
        started = time.perf_counter()
        progress = run_sweep(store, base, grid, workers=workers, backend=backend)
        elapsed = time.perf_counter() - started
        if progress.counts["finished"] != progress.total:
            raise SystemExit(f"{mode}: the study did not finish: {progress.counts}")
        runs = store.list_runs()
        steps = sum(r.env_steps for r in runs)
        finals = [r.summary.final_return for r in runs]
        store.close()
    return elapsed, steps, finals


def physics_ceiling(env_id: str, num_envs: int, workers: int, seconds: float = 5.0) -> float:
    """Aggregate env steps/s of gymnasium's own vector env with random actions, one process per
    worker running at once (what the trainer could reach if learning cost nothing)."""
    import concurrent.futures as cf
    import multiprocessing

    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        rates = list(pool.map(_random_steps, [(env_id, num_envs, seconds)] * workers))
    return sum(rates)


def _random_steps(job: tuple[str, int, float]) -> float:
    import gymnasium as gym

    from gae_core.agent.envs import quiet_env_warnings

    env_id, num_envs, seconds = job
    quiet_env_warnings(env_id)
    env = gym.make_vec(env_id, num_envs, vectorization_mode="sync")
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        env.step(env.action_space.sample())
        steps += num_envs
    env.close()
    return steps / (time.perf_counter() - started)


def _baseline_walls(args: argparse.Namespace) -> dict[str, float]:
    """Each mode's wall time on revision ``args.baseline`` (its own bench_study, same
    arguments, run in a worktree of it)."""
    from baseline import run_at

    flags = ["--lambdas", *map(str, args.lambdas), "--seeds", ",".join(map(str, args.seeds)),
             "--total-steps", str(args.total_steps), "--workers", str(args.workers),
             "--config", args.config, "--modes", *args.modes]  # fmt: skip
    out = run_at(args.baseline, "benchmarks/bench_study.py", flags)
    walls = {}
    for line in out.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() in MODES and "s wall" in rest:
            walls[name.strip()] = float(rest.split("s wall")[0])
    print(f"baseline {args.baseline}: " + ", ".join(f"{m} {w:.3f} s" for m, w in walls.items()),
          flush=True)  # fmt: skip
    return walls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lambdas", type=float, nargs="+",
                        default=[0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0])  # fmt: skip
    parser.add_argument("--seeds", type=_seeds, default=list(range(10)), help="0-9 or 0,3,7")
    parser.add_argument("--total-steps", type=int, default=200_000, help="per trial")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES))
    parser.add_argument("--config", choices=["preset", "field-defaults", "halfcheetah"],
                        default="preset")  # fmt: skip
    parser.add_argument("--baseline", metavar="REV", help="also time git revision REV's code")
    args = parser.parse_args()
    baseline = _baseline_walls(args) if args.baseline else {}

    grid = grid_of(lambdas=args.lambdas, seeds=args.seeds)
    if args.config in ("preset", "halfcheetah"):
        env_id = "CartPole-v1" if args.config == "preset" else "HalfCheetah-v5"
        preset = dataclasses.replace(preset_config(env_id), total_steps=args.total_steps)
        base = hold_critic_target(preset, grid)
    else:
        base = TrainConfig(total_steps=args.total_steps, checkpoint_every=0, record_episodes=0)
    trials = len(args.lambdas) * len(args.seeds)
    full = trials == 70 and args.total_steps == 200_000
    print(
        f"study: {len(args.lambdas)} λ × {len(args.seeds)} seeds = {trials} trials of "
        f"{args.total_steps:,} env steps ({base.env_id} {args.config}: num_envs={base.num_envs}, "
        f"rollout_steps={base.rollout_steps}, {base.optimizer} {base.learning_rate:g}, eval every "
        f"{base.eval_every:,}, checkpoint every {base.checkpoint_every:,}), {args.workers} "
        f"workers, {os.cpu_count()} CPUs ({CPU_MODEL})",
        flush=True,
    )
    if args.config == "halfcheetah":
        ceiling = physics_ceiling(base.env_id, base.num_envs, args.workers)
        print(f"physics ceiling: {ceiling:,.0f} env steps/s aggregate (gymnasium's step, random "
              f"actions, {base.num_envs} envs per process, {args.workers} processes)")  # fmt: skip
    results: dict[str, float] = {}
    ray_started = False
    for mode in args.modes:
        if mode.startswith("ray") and not ray_started:
            ray_started = True
            import ray

            from gae_core.runs.ray_pool import RUNTIME_ENV

            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                     runtime_env=RUNTIME_ENV)  # fmt: skip
        wall, steps, finals = time_study(base, grid, args.workers, mode)
        results[mode] = wall
        ratio = f"{wall / results['single']:.4f}× single's wall time" if "single" in results else ""
        verdict = ""
        if full:
            verdict = f"  {'PASS' if wall <= TARGET_S else 'FAIL'} (target ≤ {TARGET_S:g} s)"
        threshold = reward_threshold(base.env_id)  # CartPole's 475; none for HalfCheetah
        solved = sum(f is not None and threshold is not None and f >= threshold for f in finals)
        reached = f"{solved}/{len(finals)} final ≥ {threshold:g}" if threshold else ""
        if args.config == "halfcheetah":
            ratio += f", {steps / wall / ceiling:.4f} of the physics ceiling"
            if mode == "population" and "single" in results:
                speed_up = results["single"] / wall
                ratio += (f"; populations {speed_up:.4f}× one run per worker: "
                          f"{'PASS' if speed_up >= 1.3 else 'FAIL'} (≥ 1.3×)")  # fmt: skip
        print(f"{mode:>11}: {wall:9.3f} s wall, {steps / wall:10,.0f} env steps/s aggregate, "
              f"{reached}  {ratio}{verdict}", flush=True)  # fmt: skip
        if mode in baseline:
            then = baseline[mode]
            print(f"{'':>11}  {args.baseline}: {then:9.3f} s wall; this code / {args.baseline} = "
                  f"{wall / then:.4f} of its wall time: "
                  f"{'PASS' if wall <= then else 'FAIL'} (no slower)", flush=True)  # fmt: skip
        row = {
            "mode": mode, "config": args.config, "wall_s": wall,
            "population": population_capacity(_members(mode), trials, args.workers),
            "env_steps": steps, "trials": trials,
            "total_steps": args.total_steps, "workers": args.workers, "cpus": os.cpu_count(),
            "cpu_model": CPU_MODEL, "final_returns": finals,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }  # fmt: skip
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
    if not full:
        print("(not the full study: no verdict against the 30 s target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
