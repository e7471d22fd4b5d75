"""Compiled CPU kernels behind :mod:`gae_core.estimators`.

Every kernel takes C-contiguous time-major ``[T, N]`` arrays that the public functions have
already validated, writes into a preallocated output and returns nothing. Flags arrive as
``uint8`` (a free view of a ``bool`` array). ``cache=True`` writes the machine code next to this
file (or to ``NUMBA_CACHE_DIR``), so only the first process on a machine pays the compile time.

Accumulators are float64 whatever the storage dtype, so float32 results differ from float64
ones only by the final rounding of each element, not by error that grows along the chain.

The GAE recursion is a chain: step t needs step t+1. On one long trajectory (N = 1) the
loop is therefore latency-bound, one fused multiply-add per step; ``fastmath={"contract"}``
lets LLVM fuse it without licensing any reordering that would change the result otherwise.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_JIT = {"cache": True, "nogil": True, "fastmath": {"contract"}}


@nb.njit(**_JIT)
def all_finite(x):  # pragma: no cover - compiled
    """True when no element of the 2-D array is NaN or infinite (one streaming pass)."""
    rows, cols = x.shape
    acc = 0.0
    for t in range(rows):
        for n in range(cols):
            # x - x is 0 for finite x and NaN for NaN/inf; summing keeps the loop branch-free.
            acc += x[t, n] - x[t, n]
    return acc == 0.0


@nb.njit(**_JIT)
def td_residuals(rewards, values, next_values, terminated, gamma, out):  # pragma: no cover
    rows, cols = rewards.shape
    for t in range(rows):
        for n in range(cols):
            bootstrap = gamma * next_values[t, n] if terminated[t, n] == 0 else 0.0
            out[t, n] = rewards[t, n] + bootstrap - values[t, n]


@nb.njit(**_JIT)
def gae(
    rewards, values, next_values, terminated, truncated, gamma, lambda_, out
):  # pragma: no cover
    rows, cols = rewards.shape
    decay = gamma * lambda_
    for n in range(cols):
        carry = 0.0
        for t in range(rows - 1, -1, -1):
            term = terminated[t, n]
            bootstrap = gamma * next_values[t, n] if term == 0 else 0.0
            delta = rewards[t, n] + bootstrap - values[t, n]
            # done = terminated or truncated: the recursion never crosses an episode boundary.
            keep = decay if (term | truncated[t, n]) == 0 else 0.0
            carry = delta + keep * carry
            out[t, n] = carry


@nb.njit(**_JIT)
def gae_sweep(
    rewards, values, next_values, terminated, truncated, gamma, lambdas, out
):  # pragma: no cover
    # out is [L, T, N]. The λ loop is innermost so the L recursions run as independent chains
    # (instruction-level parallelism) while δ_t is computed once per step.
    rows, cols = rewards.shape
    n_lambdas = lambdas.shape[0]
    decays = np.empty(n_lambdas, dtype=np.float64)
    carry = np.zeros(n_lambdas, dtype=np.float64)
    for i in range(n_lambdas):
        decays[i] = gamma * lambdas[i]
    for n in range(cols):
        carry[:] = 0.0
        for t in range(rows - 1, -1, -1):
            term = terminated[t, n]
            bootstrap = gamma * next_values[t, n] if term == 0 else 0.0
            delta = rewards[t, n] + bootstrap - values[t, n]
            alive = (term | truncated[t, n]) == 0
            for i in range(n_lambdas):
                keep = decays[i] if alive else 0.0
                carry[i] = delta + keep * carry[i]
                out[i, t, n] = carry[i]


@nb.njit(**_JIT)
def discounted_returns(rewards, next_values, terminated, truncated, gamma, out):  # pragma: no cover
    rows, cols = rewards.shape
    for n in range(cols):
        carry = 0.0
        for t in range(rows - 1, -1, -1):
            if terminated[t, n] != 0:
                carry = rewards[t, n]
            elif truncated[t, n] != 0 or t == rows - 1:
                # a cut (time limit or end of rollout): bootstrap from V(s_{t+1})
                carry = rewards[t, n] + gamma * next_values[t, n]
            else:
                carry = rewards[t, n] + gamma * carry
            out[t, n] = carry


@nb.njit(**_JIT)
def k_step(deltas, done, gamma, ks, out):  # pragma: no cover
    # ks: ascending distinct horizons; out: [K, T, N]. Â^(k)_t sums γ^l δ_{t+l} for l < k and
    # stops after the first done step or the last row; horizons past that copy the full sum.
    rows, cols = deltas.shape
    n_ks = ks.shape[0]
    max_k = ks[n_ks - 1]
    for n in range(cols):
        for t in range(rows):
            acc = 0.0
            discount = 1.0
            i = 0
            step = 0
            while step < max_k:
                j = t + step
                acc += discount * deltas[j, n]
                discount *= gamma
                step += 1
                while i < n_ks and ks[i] == step:
                    out[i, t, n] = acc
                    i += 1
                if done[j, n] != 0 or j == rows - 1:
                    break
            while i < n_ks:
                out[i, t, n] = acc
                i += 1


@nb.njit(**_JIT)
def streaming_floor(rewards, values, next_values, terminated, truncated, out):  # pragma: no cover
    """Benchmark floor: read the same five arrays as ``gae`` once, write one output, no chain."""
    rows, cols = rewards.shape
    for t in range(rows):
        for n in range(cols):
            flag = terminated[t, n] | truncated[t, n]
            out[t, n] = rewards[t, n] + next_values[t, n] - values[t, n] if flag == 0 else 0.0
