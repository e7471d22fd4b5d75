"""Sweep scaling: the same λ × seed grid with 1 worker and with 2 workers.

    python benchmarks/bench_sweep.py [--total-steps N] [--lambdas ...] [--seeds ...]

Prints both wall times (grid submitted → every trial closed in the store, worker start-up
included) and their ratio. Target: 2 workers take at most 0.6x the time of 1 worker. Each run
uses a fresh temporary data folder; the trials are ordinary runs, checked to have finished.
With ``--repeat K`` the 1- and 2-worker sweeps alternate K times and the best time of each
counts. The load average is printed: on a machine whose cores are busy with other work, two
workers cannot get two cores and the ratio says more about the neighbours than about the sweep.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gae_core.agent.config import TrainConfig
from gae_core.runs.sweep import grid_of, run_sweep
from gae_core.storage.store import RunStore

TARGET = 0.6


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_sweep(base: TrainConfig, grid: dict, workers: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the worker processes) of one sweep."""
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as data_dir:
        store = RunStore(data_dir)
        cpu_before = _children_cpu()
        started = time.perf_counter()
        progress = run_sweep(store, base, grid, workers=workers)
        elapsed = time.perf_counter() - started
        cpu = _children_cpu() - cpu_before  # the pool has joined its workers: they are counted
        if progress.counts["finished"] != progress.total:
            raise SystemExit(f"sweep with {workers} workers did not finish: {progress.counts}")
        store.close()
    return elapsed, cpu


def wait_idle(limit_s: float, threshold: float = 0.5) -> None:
    """Wait (at most ``limit_s``) for the 1-minute load average to drop below ``threshold``."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--total-steps", type=int, default=200_000, help="per trial")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.9, 0.95, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--repeat", type=int, default=1, help="alternate K times, keep the best")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before each sweep wait up to S seconds for the load average to drop below 0.5",
    )
    args = parser.parse_args()

    base = TrainConfig(env_id=args.env, total_steps=args.total_steps, checkpoint_every=0)
    grid = grid_of(lambdas=args.lambdas, seeds=args.seeds)
    trials = len(args.lambdas) * len(args.seeds)
    print(
        f"grid: {trials} trials ({args.env}, {args.total_steps} env steps each, "
        f"num_envs={base.num_envs}, rollout_steps={base.rollout_steps}); "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    ones, twos = [], []
    for _ in range(args.repeat):
        for workers, times in ((1, ones), (2, twos)):
            wait_idle(args.wait_idle)
            load = os.getloadavg()[0]
            wall, cpu = time_sweep(base, grid, workers=workers)
            times.append(wall)
            print(
                f"{workers} worker{'s' if workers > 1 else ' '}: {wall:7.2f} s wall, "
                f"{cpu:7.2f} CPU-s in workers (load average before: {load:.2f})",
                flush=True,
            )
    one, two = min(ones), min(twos)
    ratio = two / one
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"ratio 2 workers / 1 worker = {ratio:.3f} ({verdict} target <= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
