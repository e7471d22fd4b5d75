"""What :func:`~gae_core.agent.stacked.stacked_tanh`, :func:`~gae_core.agent.stacked.
stacked_linear` and :func:`~gae_core.agent.memory.keep_freed_memory` buy a population of the
trainer, against ``torch.tanh``, ``torch.baddbmm`` and glibc's defaults.

    python benchmarks/bench_population.py [--members 35] [--repeats 3]

Measurements side by side in this one process (baseline and candidate alternate, so machine
noise hits both alike), one torch thread as in a sweep worker:

1. the activation alone on the stacked hidden activations of a CartPole population
   (``[members, rows, 64]``) at the rows of a rollout step and of an update, for the preset
   (8 envs × 5 steps) and ``TrainConfig``'s field defaults (16 envs × 64 steps);
2. the narrow output layers alone (the actor's 64 → 2 logits, the critic's 64 → 1 value),
   forward and backward at an update's rows, and forward at a rollout step's;
3. whole :class:`~gae_core.agent.trainer.Trainer` updates (collect, estimate, update) of the
   λ study's population, from the same seeds: ``torch.tanh`` against
   ``stacked_tanh`` (with ``baddbmm`` layers), then ``baddbmm`` layers against
   ``stacked_linear`` (with ``stacked_tanh``): env steps per second of each and the ratio.

4. the C allocator's setting (:func:`~gae_core.agent.memory.keep_freed_memory`, which every
   population sets): the same populations, each timed in a fresh process (the setting is
   process-wide and cannot be undone), with and without it, alternating.

The ratios print with four decimals and PASS/FAIL against the target: a candidate must not be
slower anywhere (ratio of times ≤ 1, within 5 % noise), and must be faster on the population it
was written for (``stacked_tanh`` and ``stacked_linear``: ≥ 1.05× env steps/s on the field
defaults, no slower (≥ 1.0×) on the preset; ``keep_freed_memory``: ≥ 1.05× on both).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gae_core.agent.config import TrainConfig
from gae_core.agent.presets import preset_config
from gae_core.agent.stacked import stacked_linear, stacked_tanh
from gae_core.agent.trainer import Trainer

LAMBDAS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


def _time(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def activation_rows(members: int, repeats: int) -> bool:
    ok = True
    print("activation alone (ms per call, median of alternating rounds):")
    for label, rows in (("preset step", 8), ("preset update", 48), ("defaults step", 16),
                        ("defaults update", 1040)):  # fmt: skip
        x = torch.randn(members, rows, 64)
        base, cand = [], []
        for _ in range(repeats):
            base.append(_time(lambda x=x: torch.tanh(x), 50))
            cand.append(_time(lambda x=x: stacked_tanh(x), 50))
        b, c = statistics.median(base), statistics.median(cand)
        ratio = c / b
        verdict = "PASS" if ratio <= 1.0 + 0.05 else "FAIL"  # within noise of no regression
        ok &= verdict == "PASS"
        print(
            f"  {label:>16} [{members}, {rows:4d}, 64]: torch.tanh {b * 1e3:8.4f}  "
            f"stacked_tanh {c * 1e3:8.4f}  time ratio {ratio:.4f}  {verdict} (≤ 1.05)"
        )
    return ok


def narrow_rows(members: int, repeats: int) -> bool:
    ok = True
    print("narrow layers alone (ms per call, median of alternating rounds):")
    cases = (
        ("actor update", 48, 2, True), ("critic update", 48, 1, True), ("actor step", 8, 2, False),
        ("defaults actor update", 1040, 2, True), ("defaults critic update", 1040, 1, True),
        ("defaults actor step", 16, 2, False),
    )  # fmt: skip
    for label, rows, outputs, backward in cases:
        x = torch.randn(members, rows, 64, requires_grad=backward)
        weight = torch.randn(members, 64, outputs, requires_grad=backward)
        bias = torch.randn(members, 1, outputs, requires_grad=backward)
        grad = torch.randn(members, rows, outputs)

        def run(layer, x=x, weight=weight, bias=bias, grad=grad, backward=backward):
            if not backward:
                with torch.inference_mode():
                    return layer(bias, x, weight)
            return layer(bias, x, weight).backward(grad)

        base, cand = [], []
        for _ in range(repeats):
            base.append(_time(lambda: run(torch.baddbmm), 20))
            cand.append(_time(lambda: run(stacked_linear), 20))
        b, c = statistics.median(base), statistics.median(cand)
        ratio = c / b
        verdict = "PASS" if ratio <= 1.0 + 0.05 else "FAIL"
        ok &= verdict == "PASS"
        what = "fwd+bwd" if backward else "fwd"
        print(
            f"  {label:>22} [{members}, {rows:4d}, 64] → {outputs} {what}: baddbmm "
            f"{b * 1e3:8.4f}  stacked_linear {c * 1e3:8.4f}  time ratio {ratio:.4f}  {verdict} "
            f"(≤ 1.05)"
        )
    return ok


def _population_rate(
    configs: list[TrainConfig], activation=stacked_tanh, linear=stacked_linear
) -> float:
    """Env steps/s of a whole population run with the given stacked ops."""
    population = Trainer(configs)
    population.actor.activation = population.critic.activation = activation
    population.actor.linear = population.critic.linear = linear
    try:
        started = time.perf_counter()
        while not population.done:
            population.step()
        elapsed = time.perf_counter() - started
        steps = sum(population.member(i).env_steps for i in range(population.size))
        return steps / elapsed
    finally:
        population.close()


def _study_configs(members: int) -> list[tuple[str, list[TrainConfig]]]:
    seeds = max(1, members // len(LAMBDAS))
    cases = (
        ("preset", dataclasses.replace(preset_config("CartPole-v1"), total_steps=10_000)),
        ("field defaults", TrainConfig(total_steps=30_000)),
    )
    return [
        (label, [dataclasses.replace(base, seed=s, lambda_=lam, critic_target="fixed_lambda",
                                     checkpoint_every=0, eval_every=0, record_episodes=0)
                 for lam in LAMBDAS for s in range(seeds)])
        for label, base in cases
    ]  # fmt: skip


def population_rows(members: int, repeats: int) -> bool:
    ok = True
    seeds = max(1, members // len(LAMBDAS))
    print(f"population updates ({len(LAMBDAS)} λ × {seeds} seeds, env steps/s, alternating):")
    for (label, configs), target in zip(_study_configs(members), (1.0, 1.05), strict=True):
        pairs = (
            ("torch.tanh", (torch.tanh, torch.baddbmm), "stacked_tanh",
             (stacked_tanh, torch.baddbmm), target),
            ("baddbmm", (stacked_tanh, torch.baddbmm), "stacked_linear",
             (stacked_tanh, stacked_linear), target),
        )  # fmt: skip
        for base_name, base_ops, cand_name, cand_ops, goal in pairs:
            base = (base_name, lambda ops=base_ops, c=configs: _population_rate(c, *ops))
            cand = (cand_name, lambda ops=cand_ops, c=configs: _population_rate(c, *ops))
            ok &= _speed_up_row(label, base, cand, goal, repeats)
    return ok


def _speed_up_row(label: str, base: tuple, candidate: tuple, goal: float, repeats: int) -> bool:
    """Alternate ``base`` and ``candidate`` ((name, a function returning env steps/s))
    ``repeats`` times; print the medians and the speed-up, PASS at ≥ ``goal``."""
    base_rates, cand_rates = [], []
    for _ in range(repeats):
        base_rates.append(base[1]())
        cand_rates.append(candidate[1]())
    b, c = statistics.median(base_rates), statistics.median(cand_rates)
    ratio = c / b
    verdict = "PASS" if ratio >= goal else "FAIL"
    print(f"  {label:>16}: {base[0]} {b:10,.0f}  {candidate[0]} {c:10,.0f}  "
          f"speed-up {ratio:.4f}×  {verdict} (≥ {goal:.2f}×)")  # fmt: skip
    return verdict == "PASS"


_ALLOCATOR_RUN = """
import dataclasses, sys, time
import torch
from gae_core.agent import trainer as P
from gae_core.agent.config import TrainConfig
from gae_core.agent.presets import preset_config
case, keep, seeds = sys.argv[1], sys.argv[2] == "keep", int(sys.argv[3])
if not keep:
    P.keep_freed_memory = lambda: False  # the baseline: glibc's defaults
torch.set_num_threads(1)
base = (dataclasses.replace(preset_config("CartPole-v1"), total_steps=10_000) if case == "preset"
        else TrainConfig(total_steps=30_000))
configs = [dataclasses.replace(base, seed=s, lambda_=lam, critic_target="fixed_lambda",
                               checkpoint_every=0, eval_every=0, record_episodes=0)
           for lam in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0) for s in range(seeds)]
population = P.Trainer(configs)
started = time.perf_counter()
while not population.done:
    population.step()
elapsed = time.perf_counter() - started
print(sum(population.member(i).env_steps for i in range(population.size)) / elapsed)
"""


def allocator_rows(members: int, repeats: int) -> bool:
    ok = True
    seeds = max(1, members // len(LAMBDAS))
    print(
        f"allocator ({len(LAMBDAS)} λ × {seeds} seeds, env steps/s, fresh processes, alternating):"
    )
    root = str(Path(__file__).resolve().parents[1])
    for case in ("preset", "field defaults"):
        rates: dict[str, list[float]] = {"default": [], "keep": []}
        for _ in range(repeats):
            for mode in rates:
                out = subprocess.run(
                    [sys.executable, "-c", _ALLOCATOR_RUN, case.split()[0], mode, str(seeds)],
                    capture_output=True, text=True, check=True, cwd=root,
                    env={**os.environ, "PYTHONPATH": root},
                )  # fmt: skip
                rates[mode].append(float(out.stdout.split()[-1]))
        b, c = statistics.median(rates["default"]), statistics.median(rates["keep"])
        ratio = c / b
        verdict = "PASS" if ratio >= 1.05 else "FAIL"
        ok &= verdict == "PASS"
        print(f"  {case:>16}: glibc defaults {b:10,.0f}  keep_freed_memory {c:10,.0f}  "
              f"speed-up {ratio:.4f}×  {verdict} (≥ 1.05×)")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=35, help="a worker's share of 70 trials")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ok = activation_rows(args.members, args.repeats)
    ok &= narrow_rows(args.members, args.repeats)
    ok &= population_rows(args.members, args.repeats)
    ok &= allocator_rows(args.members, args.repeats)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
