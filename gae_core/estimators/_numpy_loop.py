"""Short-rollout path of :func:`gae_core.estimators.gae` for CPU tensors: the backward recursion
Â_t = δ_t + γλ(1 − done_t)Â_{t+1} as a loop over t in NumPy, on zero-copy views, accumulating in
float64 like the compiled kernels.

Why: a trainer's rollout is a few steps of a few envs, where the torch doubling scan pays about
20 torch dispatches (some 100 µs) for what this loop does in about 3 µs a step, without loading
numba (see ``TORCH_CPU_MAX_ELEMENTS``). ``python benchmarks/bench_estimators.py`` prints both
side by side; :data:`LOOP_MAX_STEPS` is where the loop stops winning. Inputs are validated by
the caller: 2-D ``[T, N]`` float arrays of one dtype and bool flags.
"""

from __future__ import annotations

import numpy as np

#: CPU tensors with at most this many rows (time steps) take this loop.
LOOP_MAX_STEPS = 32


def gae(rewards, values, next_values, terminated, truncated, *, gamma, lambda_) -> np.ndarray:
    deltas = rewards + gamma * ~terminated * next_values.astype(np.float64) - values
    keep = gamma * lambda_ * ~(terminated | truncated)
    out = np.empty(deltas.shape, np.float64)
    running = np.zeros(deltas.shape[1:])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + keep[t] * running
        out[t] = running
    return out.astype(rewards.dtype)
