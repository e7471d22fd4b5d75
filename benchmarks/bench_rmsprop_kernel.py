"""Learning with RMSprop's two kernels, side by side: an A2C preset's seeds as one population
(as ``bench_presets.py run --population`` trains them) with RMSprop's step on the fused Adam
kernel (today's, ``agent/optim.py``) or on the foreach kernels it replaced (forced here by
handing the optimizer one step size per member, the path a linear schedule with mixed progress
takes). Everything else is today's code. The two differ by float rounding (``tests/
test_trainer.py`` checks both against ``torch.optim.RMSprop``); this shows what that rounding
does to whole runs, seed by seed. Appends one JSON line per seed (final = mean return of the
last 100 training episodes) to ``benchmarks/results/rmsprop_kernel.jsonl``:

    python benchmarks/bench_rmsprop_kernel.py HalfCheetah-v5 --kernel foreach --seeds 0-7
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere

from gae_core.agent import optim  # noqa: E402
from gae_core.agent.presets import preset_config  # noqa: E402
from gae_core.agent.trainer import Trainer  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "rmsprop_kernel.jsonl"


def force_foreach() -> None:
    """RMSprop's step on the foreach kernels: one step size per member (the same for all)."""
    fused_or_foreach = optim.Optimizer._step

    def step(self, index, steps):
        if self.kind != "rmsprop" or isinstance(self.learning_rate, np.ndarray):
            return fused_or_foreach(self, index, steps)
        rate = self.learning_rate
        self.learning_rate = np.full(self.params[0].shape[0], float(rate))
        try:
            return fused_or_foreach(self, index, steps)
        finally:
            self.learning_rate = rate

    optim.Optimizer._step = step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env")
    parser.add_argument("--kernel", choices=("fused", "foreach"), required=True)
    parser.add_argument("--seeds", default="0-4", help="0-4 or 0,3,7")
    args = parser.parse_args()
    if "-" in args.seeds:
        first, last = map(int, args.seeds.split("-"))
        seeds = list(range(first, last + 1))
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
    if args.kernel == "foreach":
        force_foreach()
    configs = [preset_config(args.env, seed=s, checkpoint_every=0, record_episodes=0,
                             eval_every=0) for s in seeds]  # fmt: skip
    trainer = Trainer(configs)
    returns: list[list[float]] = [[] for _ in seeds]
    started = time.perf_counter()
    while not trainer.done:
        for member, result in trainer.step().items():
            returns[member] += [e.return_ for e in result.episodes]
    wall_s = time.perf_counter() - started
    trainer.close()
    with OUT.open("a") as out:
        for member, seed in enumerate(seeds):
            row = {"env": args.env, "algo": "a2c", "kernel": args.kernel, "seed": seed,
                   "budget": configs[member].total_steps,
                   "final": float(np.mean(returns[member][-100:])), "wall_s": wall_s}  # fmt: skip
            out.write(json.dumps(row) + "\n")
            print(f"{args.env} {args.kernel} seed {seed}: final {row['final']:.1f}", flush=True)


if __name__ == "__main__":
    main()
