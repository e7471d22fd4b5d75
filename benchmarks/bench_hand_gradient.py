"""What the gradients by hand (``gae_core.agent.losses.a2c_gradients``, ``ppo_gradients``)
buy on whole runs, against the autograd of the same loss, side by side in this one process.

    python benchmarks/bench_hand_gradient.py [--repeats 3] [--quick]

Each case trains a :class:`~gae_core.agent.trainer.Trainer` from its first update to its budget
(collect, estimate, update; one torch thread, as a sweep worker), once with its gradient by hand
(the default without gSDE) and once by autograd (``trainer.by_hand = False``), the two
alternating ``--repeats`` times from the same seeds. It prints each side's median env steps/s
and their ratio with four decimals. The issue "One trainer" keeps a hand-derived gradient only
where it is at least 1.3× faster on whole runs: PASS/FAIL against that on every case.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gae_core.agent.presets import preset_config
from gae_core.agent.trainer import Trainer

TARGET = 1.3
LAMBDAS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


def cases(quick: bool) -> list[tuple[str, list]]:
    """(label, configs) of each whole run: one run and a population, CartPole and HalfCheetah,
    A2C and PPO."""
    scale = 0.25 if quick else 1.0

    def configs(env_id: str, members: int, steps: int, algo: str = "a2c") -> list:
        base = dataclasses.replace(
            preset_config(env_id, algo), total_steps=int(steps * scale), eval_every=0,
            checkpoint_every=0, record_episodes=0, torch_threads=1,
        )  # fmt: skip
        return [
            dataclasses.replace(base, seed=i, lambda_=LAMBDAS[i % len(LAMBDAS)])
            for i in range(members)
        ]

    return [
        ("CartPole-v1 preset, one run, 100k steps", configs("CartPole-v1", 1, 100_000)),
        (
            "CartPole-v1 preset, 35 members × 10k (a worker's share of the λ study)",
            configs("CartPole-v1", 35, 10_000),
        ),
        ("HalfCheetah-v5 preset, one run, 20k steps", configs("HalfCheetah-v5", 1, 20_000)),
        ("HalfCheetah-v5 preset, 16 members × 5k", configs("HalfCheetah-v5", 16, 5_000)),
        ("PPO CartPole-v1 preset, one run, 50k steps", configs("CartPole-v1", 1, 50_000, "ppo")),
        ("PPO CartPole-v1 preset, 10 members × 10k", configs("CartPole-v1", 10, 10_000, "ppo")),
        ("PPO HalfCheetah-v5 preset, one run, 20k", configs("HalfCheetah-v5", 1, 20_480, "ppo")),
        ("PPO HalfCheetah-v5 preset, 8 members × 8k", configs("HalfCheetah-v5", 8, 8192, "ppo")),
    ]


def whole_run(configs: list, by_hand: bool) -> float:
    """Env steps/s of one trainer run to its budget."""
    trainer = Trainer(configs)
    trainer.by_hand = by_hand
    try:
        started = time.perf_counter()
        while not trainer.done:
            trainer.step()
        elapsed = time.perf_counter() - started
        return sum(trainer.member(i).env_steps for i in range(len(configs))) / elapsed
    finally:
        trainer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of each budget")
    parser.add_argument("--only", default="", help="the cases whose label contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    passed = True
    for label, configs in cases(args.quick):
        if args.only not in label:
            continue
        whole_run(configs[:1], True)  # warm both paths' first calls
        rates = {True: [], False: []}
        for _ in range(args.repeats):
            for by_hand in (False, True):
                rates[by_hand].append(whole_run(configs, by_hand))
        hand, auto = statistics.median(rates[True]), statistics.median(rates[False])
        ratio = hand / auto
        verdict = "PASS" if ratio >= TARGET else "FAIL"
        passed &= ratio >= TARGET
        print(f"{label:55} by hand {hand:10,.0f}  autograd {auto:10,.0f} env steps/s  "
              f"{ratio:.4f}x  (target >= {TARGET}x) {verdict}", flush=True)  # fmt: skip
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
