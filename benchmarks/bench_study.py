"""The λ study users run most, through each sweep backend, in one script run.

    python benchmarks/bench_study.py [--seeds 0-9] [--lambdas ...] [--total-steps 200000]
                                     [--backends local ray] [--workers 2]

CartPole-v1 with the form's defaults (7 λ × 10 seeds × 200k env steps by default), on the local
process pool and on a local Ray (``ray.init(num_cpus=workers)``, started before its timer), each
in a fresh data folder. Prints, per backend, the study's wall time (grid submitted → every trial
closed in the store, worker start-up included), the aggregate env steps/s and the ratio to the
local pool, and a PASS/FAIL against the issue's target for the full study: at most 30 s on a
2-core machine. Every trial is checked to have finished.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gae_core.agent.config import TrainConfig
from gae_core.runs.backends import backend_factory
from gae_core.runs.store import RunStore
from gae_core.runs.sweep import grid_of, run_sweep

TARGET_S = 30.0


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def time_study(base: TrainConfig, grid: dict, workers: int, backend: str) -> tuple[float, int]:
    """(wall seconds, env steps of all trials) of one sweep on ``backend``."""
    with tempfile.TemporaryDirectory(prefix="bench-study-") as data_dir:
        store = RunStore(data_dir)
        started = time.perf_counter()
        progress = run_sweep(store, base, grid, workers=workers, backend=backend_factory(backend))
        elapsed = time.perf_counter() - started
        if progress.counts["finished"] != progress.total:
            raise SystemExit(f"{backend}: the study did not finish: {progress.counts}")
        steps = sum(r.env_steps for r in store.list_runs())
        store.close()
    return elapsed, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lambdas", type=float, nargs="+",
                        default=[0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0])  # fmt: skip
    parser.add_argument("--seeds", type=_seeds, default=list(range(10)), help="0-9 or 0,3,7")
    parser.add_argument("--total-steps", type=int, default=200_000, help="per trial")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backends", nargs="+", choices=["local", "ray"],
                        default=["local", "ray"])  # fmt: skip
    args = parser.parse_args()

    base = TrainConfig(total_steps=args.total_steps, checkpoint_every=0, record_episodes=0)
    grid = grid_of(lambdas=args.lambdas, seeds=args.seeds)
    trials = len(args.lambdas) * len(args.seeds)
    full = trials == 70 and args.total_steps == 200_000
    print(
        f"study: {len(args.lambdas)} λ × {len(args.seeds)} seeds = {trials} trials of "
        f"{args.total_steps:,} env steps ({base.env_id}, num_envs={base.num_envs}, "
        f"rollout_steps={base.rollout_steps}), {args.workers} workers, {os.cpu_count()} CPUs",
        flush=True,
    )
    results = {}
    for backend in args.backends:
        if backend == "ray":
            import ray

            from gae_core.runs.ray_pool import RUNTIME_ENV

            ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                     runtime_env=RUNTIME_ENV)  # fmt: skip
        wall, steps = time_study(base, grid, args.workers, backend)
        results[backend] = wall
        ratio = (
            f"{wall / results['local']:.3f}× the local pool's time" if "local" in results else ""
        )
        verdict = ""
        if full:
            verdict = f"  {'PASS' if wall <= TARGET_S else 'FAIL'} (target ≤ {TARGET_S:g} s)"
        print(f"{backend:>5}: {wall:8.2f} s wall, {steps / wall:10,.0f} env steps/s aggregate  "
              f"{ratio}{verdict}", flush=True)  # fmt: skip
    if not full:
        print("(not the full study: no verdict against the 30 s target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
