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
    """True when no element of the array is NaN or infinite (one streaming pass)."""
    flat = x.reshape(-1)  # callers pass C-contiguous arrays
    acc = 0.0
    for i in range(flat.shape[0]):
        # x - x is 0 for finite x and NaN for NaN/inf; summing keeps the loop branch-free.
        acc += flat[i] - flat[i]
    return acc == 0.0


@nb.njit(**_JIT)
def td_residuals(rewards, values, next_values, terminated, gamma, out):  # pragma: no cover
    # gamma: float64 [N], one per column
    rows, cols = rewards.shape
    for t in range(rows):
        for n in range(cols):
            bootstrap = gamma[n] * next_values[t, n] if terminated[t, n] == 0 else 0.0
            out[t, n] = rewards[t, n] + bootstrap - values[t, n]


@nb.njit(**_JIT)
def gae(
    rewards, values, next_values, terminated, truncated, gamma, lambda_, out
):  # pragma: no cover
    """GAE into ``out``; returns True iff every float input is finite. ``gamma`` and
    ``lambda_`` are float64 ``[N]``, one per column.

    The finiteness check rides along in the same pass instead of three extra ones, so the
    caller validates for free and only scans again, to name the culprit, when it fails. It is an
    integer OR-reduction (x − x is NaN exactly for NaN and ±inf): unlike a float sum, LLVM may
    reorder it, so the loop still vectorises.
    """
    rows, cols = rewards.shape
    if cols == 1:
        return _gae_column(
            rewards[:, 0], values[:, 0], next_values[:, 0], terminated[:, 0], truncated[:, 0],
            gamma[0], lambda_[0], out[:, 0],
        )  # fmt: skip
    decay = gamma * lambda_
    carry = np.zeros(cols, dtype=np.float64)
    bad = False
    for t in range(rows - 1, -1, -1):
        # n innermost: contiguous in a time-major array and free of dependencies, so it vectorises.
        for n in range(cols):
            r, v, nv = rewards[t, n], values[t, n], next_values[t, n]
            bad |= (r - r != 0.0) | (v - v != 0.0) | (nv - nv != 0.0)
            term = terminated[t, n]
            # δ_t = r_t + γ(1 − terminated_t) V(s_{t+1}) − V(s_t)
            delta = r + gamma[n] * (1 - term) * nv - v
            # done = terminated or truncated: the recursion never crosses an episode boundary.
            carry[n] = delta + decay[n] * (1 - (term | truncated[t, n])) * carry[n]
            out[t, n] = carry[n]
    return not bad


@nb.njit(**_JIT)
def _gae_column(
    rewards, values, next_values, terminated, truncated, gamma, lambda_, out
):  # pragma: no cover
    # One environment: a scalar carry keeps the chain in a register.
    decay = gamma * lambda_
    carry = 0.0
    bad = False
    for t in range(rewards.shape[0] - 1, -1, -1):
        r, v, nv = rewards[t], values[t], next_values[t]
        bad |= (r - r != 0.0) | (v - v != 0.0) | (nv - nv != 0.0)
        term = terminated[t]
        delta = r + gamma * (1 - term) * nv - v
        carry = delta + decay * (1 - (term | truncated[t])) * carry
        out[t] = carry
    return not bad


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
    # ks: ascending distinct horizons in [1, T]; out: [K, T, N]. Linear in T for any k:
    # S_t (the full segment sum, GAE λ=1) and L_t (steps left in t's segment) in one backward
    # pass, then Â^(k)_t = S_t − γ^k S_{t+k} while k < L_t, else S_t.
    rows, cols = deltas.shape
    n_ks = ks.shape[0]
    powers = np.empty(n_ks, dtype=np.float64)
    for i in range(n_ks):
        powers[i] = gamma ** float(ks[i])
    suffix = np.empty(rows, dtype=np.float64)
    left = np.empty(rows, dtype=np.int64)
    for n in range(cols):
        acc = 0.0
        remaining = 0
        for t in range(rows - 1, -1, -1):
            if done[t, n] != 0 or t == rows - 1:
                acc = deltas[t, n]
                remaining = 1
            else:
                acc = deltas[t, n] + gamma * acc
                remaining += 1
            suffix[t] = acc
            left[t] = remaining
        for t in range(rows):
            for i in range(n_ks):
                k = ks[i]
                if k < left[t]:
                    out[i, t, n] = suffix[t] - powers[i] * suffix[t + k]
                else:
                    out[i, t, n] = suffix[t]
