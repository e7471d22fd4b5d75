"""Would a compiled per-member kernel bring the preset λ study under 30 s? A measurement, not
an engine: the population update's arithmetic written as one numba kernel (every member's
actor and critic forward and backward passes, its gradient-norm clipping and RMSprop step, one
member at a time so its working set stays in cache), timed side by side with the torch engine
doing the same work (:class:`~gae_core.agent.stacked_a2c.StackedA2C`: the rollout's five actor
passes, the critic pass, the gradients, clipping, and :class:`~gae_core.agent.optim.Optimizer`).

    pip install numba   # not a dependency of the project: only this script uses it
    python benchmarks/bench_fused_update.py [--members 35] [--rounds 5]

The CartPole preset's population: M members × 40 rows (8 envs × 5 steps), a 4-64-64-2 actor
and a 4-64-64-1 critic, one thread. The kernel runs the actor's forward pass over the 40 rows
once (the torch engine runs it in five rollout steps of 8 rows); it runs no env, no sampling,
no GAE and no metrics, so it is the kernel's best case. Two kernels: tanh from libm (what
numba compiles ``np.tanh`` to here) and, to bound what a faster tanh could give, the same
kernel with the activation replaced by a multiply (wrong results, timing only).

Why: on the CPU of earlier sittings the preset study took 50.8 to 64 s, about 42 s of each
worker's time in its 5,000 updates of 35 members, so a kernel had to make the update about
1.7× faster to bring the study to 30 s (PASS at a ratio ≥ 1.7 of torch's time to the
kernel's). ``docs/PERFORMANCE.md`` has the results.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch import nn

from gae_core.agent.optim import Optimizer
from gae_core.agent.stacked import StackedMLP
from gae_core.agent.stacked_a2c import StackedA2C

ENVS, STEPS, OBS, HIDDEN, TARGET = 8, 5, 4, 64, 1.7


def kernels():
    from numba import njit

    def build(activation):
        @njit(fastmath=True, inline="always")
        def forward(x, weight, bias, out, hidden):
            rows, fan_in = x.shape
            fan_out = weight.shape[1]
            for r in range(rows):
                for n in range(fan_out):
                    out[r, n] = bias[n]
                for k in range(fan_in):
                    xv = x[r, k]
                    for n in range(fan_out):
                        out[r, n] += xv * weight[k, n]
                if hidden:
                    for n in range(fan_out):
                        out[r, n] = activation(out[r, n])

        @njit(fastmath=True, inline="always")
        def backward(x, weight, grad, grad_weight, grad_bias, grad_x, with_x):
            rows, fan_in = x.shape
            fan_out = weight.shape[1]
            grad_weight[:] = 0.0
            grad_bias[:] = 0.0
            for r in range(rows):
                for n in range(fan_out):
                    grad_bias[n] += grad[r, n]
                for k in range(fan_in):
                    xv = x[r, k]
                    for n in range(fan_out):
                        grad_weight[k, n] += xv * grad[r, n]
            if with_x:
                for r in range(rows):
                    for k in range(fan_in):
                        total = 0.0
                        for n in range(fan_out):
                            total += grad[r, n] * weight[k, n]
                        grad_x[r, k] = total

        @njit(fastmath=True, inline="always")
        def net_backward(x, h1, h2, w1, w2, w3, grad_out, g, offset, d1, d2, unused):
            fan_in, width = w1.shape
            outputs = w3.shape[1]
            o = offset
            gw1 = g[o : o + fan_in * width].reshape(fan_in, width)
            o += fan_in * width
            gb1 = g[o : o + width]
            o += width
            gw2 = g[o : o + width * width].reshape(width, width)
            o += width * width
            gb2 = g[o : o + width]
            o += width
            gw3 = g[o : o + width * outputs].reshape(width, outputs)
            o += width * outputs
            gb3 = g[o : o + outputs]
            o += outputs
            backward(h2, w3, grad_out, gw3, gb3, d2, True)
            d2 *= 1.0 - h2 * h2
            backward(h1, w2, d2, gw2, gb2, d1, True)
            d1 *= 1.0 - h1 * h1
            backward(x, w1, d1, gw1, gb1, unused, False)
            return o

        @njit(fastmath=True)
        def update(obs, actions, advantages, returns, actor, critic, grad, square, flat, lr):
            members, rows, fan_in = obs.shape
            width = actor[0].shape[2]
            h1 = np.empty((rows, width), np.float32)
            h2 = np.empty((rows, width), np.float32)
            c1 = np.empty((rows, width), np.float32)
            c2 = np.empty((rows, width), np.float32)
            logits = np.empty((rows, 2), np.float32)
            value = np.empty((rows, 1), np.float32)
            grad_logits = np.empty((rows, 2), np.float32)
            grad_value = np.empty((rows, 1), np.float32)
            d1 = np.empty((rows, width), np.float32)
            d2 = np.empty((rows, width), np.float32)
            unused = np.empty((rows, fan_in), np.float32)
            for m in range(members):
                x = obs[m]
                forward(x, actor[0][m], actor[1][m], h1, True)
                forward(h1, actor[2][m], actor[3][m], h2, True)
                forward(h2, actor[4][m], actor[5][m], logits, False)
                forward(x, critic[0][m], critic[1][m], c1, True)
                forward(c1, critic[2][m], critic[3][m], c2, True)
                forward(c2, critic[4][m], critic[5][m], value, False)
                for r in range(rows):  # softmax policy gradient, entropy bonus 0 (preset)
                    top = max(logits[r, 0], logits[r, 1])
                    e0, e1 = np.exp(logits[r, 0] - top), np.exp(logits[r, 1] - top)
                    a = advantages[m, r] / rows
                    grad_logits[r, 0] = a * (e0 / (e0 + e1) - (actions[m, r] == 0))
                    grad_logits[r, 1] = a * (e1 / (e0 + e1) - (actions[m, r] == 1))
                    grad_value[r, 0] = -(returns[m, r] - value[r, 0]) / rows
                g = grad[m]
                o = net_backward(x, h1, h2, actor[0][m], actor[2][m], actor[4][m],
                                 grad_logits, g, 0, d1, d2, unused)  # fmt: skip
                net_backward(x, c1, c2, critic[0][m], critic[2][m], critic[4][m],
                             grad_value, g, o, d1, d2, unused)  # fmt: skip
                norm = np.sqrt(np.sum(g * g))
                scale = min(1.0, 0.5 / (norm + 1e-6))
                s, p = square[m], flat[m]
                for i in range(g.shape[0]):
                    gi = g[i] * scale
                    s[i] = 0.99 * s[i] + 0.01 * gi * gi
                    p[i] -= lr * gi / (np.sqrt(s[i]) + 1e-5)

        return update

    @njit(fastmath=True, inline="always")
    def tanh(x):
        return np.tanh(x)

    @njit(fastmath=True, inline="always")
    def scale(x):
        return 0.5 * x

    return build(tanh), build(scale)


def nets(members: int, outputs: int) -> list[nn.Sequential]:
    def net() -> nn.Sequential:
        return nn.Sequential(
            nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
            nn.Linear(HIDDEN, outputs),
        )  # fmt: skip

    return [net() for _ in range(members)]


def torch_update(members: int):
    """One update of the torch engine on fixed data, as a callable."""
    engine = StackedA2C(StackedMLP(nets(members, 2)), StackedMLP(nets(members, 1)), None, STEPS)
    engine.flat.grad = engine.grad
    optimizer = Optimizer([engine.flat], "rmsprop", 7e-4)
    rows = ENVS * STEPS
    steps_obs = torch.randn(STEPS, members, ENVS, OBS)
    observations = steps_obs.transpose(0, 1).reshape(members, rows, OBS)
    actions = torch.randint(0, 2, (members, rows)).float()
    advantages, returns = torch.randn(members, rows), torch.randn(members, rows)
    mask, ones = torch.ones(members, rows), torch.ones(members)
    every = torch.ones(members, dtype=torch.bool)

    def run() -> None:
        for step in range(STEPS):
            engine.act(steps_obs[step], step)
        engine.values(observations)
        engine.gradients(observations, actions, advantages, returns, mask, 0.5 * ones, 0 * ones)
        engine.clip(0.5 * ones, every)
        optimizer.step(rows=every, keep=~every)

    return run


def kernel_update(kernel, members: int):
    rng = np.random.default_rng(0)

    def layers(outputs: int):
        shapes = [(OBS, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, outputs),
                  (outputs,)]  # fmt: skip
        return tuple((0.1 * rng.standard_normal((members, *s))).astype(np.float32)
                     for s in shapes)  # fmt: skip

    actor, critic = layers(2), layers(1)
    size = sum(a[0].size for a in actor + critic)
    grad, square = np.zeros((members, size), np.float32), np.zeros((members, size), np.float32)
    flat = np.zeros((members, size), np.float32)  # stands in for the parameters' buffer
    rows = ENVS * STEPS
    obs = rng.standard_normal((members, rows, OBS)).astype(np.float32)
    actions = rng.integers(0, 2, (members, rows))
    advantages = rng.standard_normal((members, rows)).astype(np.float32)
    returns = rng.standard_normal((members, rows)).astype(np.float32)
    args = (obs, actions, advantages, returns, actor, critic, grad, square, flat, np.float32(7e-4))
    return lambda: kernel(*args)


def seconds(fn, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    try:
        with_tanh, without_tanh = kernels()
    except ImportError:
        print("numba is not installed: pip install numba (only this script needs it)")
        return 2
    torch.set_num_threads(1)
    candidates = {"torch engine": torch_update(args.members)}
    for name, kernel in (("numba, libm tanh", with_tanh), ("numba, no tanh", without_tanh)):
        started = time.perf_counter()
        candidates[name] = kernel_update(kernel, args.members)
        candidates[name]()  # compiles
        print(f"{name}: compiled in {time.perf_counter() - started:.1f} s")
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(args.rounds):  # alternating, so machine noise hits all alike
        for name, fn in candidates.items():
            fn()
            times[name].append(seconds(fn, args.repeats))
    base = statistics.median(times["torch engine"])
    print(f"{args.members} members, one update (median of {args.rounds} rounds):")
    ok = True
    for name, measured in times.items():
        median = statistics.median(measured)
        line = (
            f"  {name:18s} {median * 1e3:7.3f} ms ({median / args.members * 1e6:6.1f} µs a member)"
        )
        if name != "torch engine":
            ratio = base / median
            verdict = "PASS" if ratio >= TARGET else "FAIL"
            ok &= verdict == "PASS" or name == "numba, no tanh"
            line += f"  torch/kernel {ratio:.4f} (target ≥ {TARGET}: {verdict})"
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
