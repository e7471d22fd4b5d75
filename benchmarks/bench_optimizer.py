"""Why the trainer's optimizer is not ``torch.optim``: memory and import time, side by side.

Each case runs in a fresh subprocess (so one case's imports cannot help another): build the
default actor-critic, take 20 optimizer steps on CartPole-sized batches, and report peak resident
memory (``ru_maxrss``) and the seconds the first ``step()`` took. ``ours`` is
``gae_core.agent.optim.Optimizer``; ``torch.optim`` is ``torch.optim.Adam`` with the same
hyperparameters. ``tests/test_trainer.py`` checks the two agree step for step.

Then, in this process, the time of one Adam step on a trainer's parameter buffer (every
parameter of a CartPole run's actor and critic in one ``[M, P]`` tensor, ``stacked.one_buffer``)
for one run and for 16 members, ours against ``torch.optim.Adam`` with foreach kernels (what our
optimizer ran before it took torch's fused kernel) and with ``fused=True`` (the same kernel, through
``torch.optim``); and of one RMSprop step for one run and 35 members, ours (the fused Adam kernel
with β1 = 0) against ``torch.optim.RMSprop`` with foreach kernels (what ours ran before);
alternating, best of five.

    python benchmarks/bench_optimizer.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE = """
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from gae_core.agent.optim import Optimizer
net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                          torch.nn.Tanh(), torch.nn.Linear(64, 2))
params = list(net.parameters())
built = time.perf_counter()
if sys.argv[1] == "ours":
    opt = Optimizer(params, "adam", 5e-3)
else:
    opt = torch.optim.Adam(params, lr=5e-3, eps=1e-5)
first = None
for i in range(20):
    loss = net(torch.randn(1024, 4)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if first is None:
        first = time.perf_counter() - built  # construction and the first step
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "to_first_step_s": first, "dynamo": "torch._dynamo" in sys.modules}))
"""


def run(case: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CASE, case],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    results = {case: min((run(case) for _ in range(3)), key=lambda r: r["peak_mb"])
               for case in ("ours", "torch.optim")}  # fmt: skip
    ours, theirs = results["ours"], results["torch.optim"]
    print(f"{'':<14}{'peak MB':>10}{'to 1st step s':>14}{'imports dynamo':>16}")
    for name, r in results.items():
        print(f"{name:<14}{r['peak_mb']:>10.1f}{r['to_first_step_s']:>14.3f}{r['dynamo']!s:>16}")
    extra = theirs["peak_mb"] - ours["peak_mb"]
    seconds = theirs["to_first_step_s"]
    print(f"torch.optim costs {extra:+.1f} MB, and {seconds:.3f} s to its first step")
    print(f"ratio peak memory ours / torch.optim = {ours['peak_mb'] / theirs['peak_mb']:.4f}")


def step_times(
    members: int, kind: str = "adam", repeats: int = 5, steps: int = 2000
) -> dict[str, float]:
    """Microseconds per Adam or RMSprop step on one ``[members, P]`` buffer, best of
    ``repeats`` (torch.optim has no fused RMSprop: foreach only)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from gae_core.agent.optim import Optimizer
    from gae_core.agent.presets import preset_config
    from gae_core.agent.trainer import Trainer

    trainer = Trainer(preset_config("CartPole-v1", "ppo"))
    size = trainer.parameters.shape[1]  # the actor's and the critic's parameters
    trainer.close()
    torch.set_num_threads(1)
    cases = {}
    names = ("ours", "torch.optim foreach") + (("torch.optim fused",) if kind == "adam" else ())
    for name in names:
        param = torch.zeros(members, size, requires_grad=True)
        param.grad = torch.randn(members, size)
        if name == "ours":
            optimizer = Optimizer([param], kind, 3e-4)
            rows = torch.ones(members, dtype=torch.bool)
            step = lambda o=optimizer, r=rows: o.step(rows=r)  # noqa: E731
        elif kind == "rmsprop":  # SB3's A2C settings: α 0.99, ε 1e-5
            optimizer = torch.optim.RMSprop([param], lr=3e-4, alpha=0.99, eps=1e-5, foreach=True)
            step = optimizer.step
        else:
            fused = name.endswith("fused")
            optimizer = torch.optim.Adam([param], lr=3e-4, eps=1e-5, foreach=not fused,
                                         fused=fused)  # fmt: skip
            step = optimizer.step
        cases[name] = step
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeats):
        for name, step in cases.items():
            for _ in range(50):
                step()
            started = time.perf_counter()
            for _ in range(steps):
                step()
            best[name] = min(best[name], (time.perf_counter() - started) / steps * 1e6)
    return best


def print_step_times() -> None:
    """Adam for one run and 16 members; RMSprop (the A2C presets') for one run and the preset
    study's population of 35 (7 λ × 10 seeds on 2 workers)."""
    for kind, sizes in (("adam", (1, 16)), ("rmsprop", (1, 35))):
        name = {"adam": "Adam", "rmsprop": "RMSprop"}[kind]
        for members in sizes:
            best = step_times(members, kind)
            cells = "  ".join(f"{case} {us:.2f} µs" for case, us in best.items())
            ratio = best["torch.optim foreach"] / best["ours"]
            print(f"one {name} step, {members} member(s): {cells}; foreach / ours = {ratio:.4f}")


if __name__ == "__main__":
    main()
    print_step_times()
