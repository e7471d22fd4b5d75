"""Compiled CPU kernels behind :mod:`gae_core.estimators`.

Every kernel takes C-contiguous time-major ``[T, N]`` arrays that the public functions have
already validated and writes into a preallocated output; the GAE kernels return whether the
inputs were finite (:func:`_finite`), the others nothing. Flags arrive as
``uint8`` (a free view of a ``bool`` array). ``cache=True`` writes the machine code next to this
file (or to ``NUMBA_CACHE_DIR``), so only the first process on a machine pays the compile time.

Accumulators are float64 whatever the storage dtype, so float32 results differ from float64
ones only by the final rounding of each element, not by error that grows along the chain (λ-
returns of N > 1 columns round the advantage, then add V(s_t) in the output's dtype, as
``gae(...) + values`` does).

The GAE recursion is a chain: step t needs step t+1. With N > 1 columns the N chains advance
together, one row at a time, vectorised over the row. On one long trajectory (N = 1) a chain
of one fused multiply-add per step is bound by its latency, so the column kernels take four
steps per link (:func:`_chain`). ``fastmath={"contract"}`` lets LLVM fuse multiply-adds without
licensing any other reordering.
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


#: Steps a single column's kernels take per chunk: a float64 scratch array of this length
#: (128 KB) and the chunk's inputs stay in a core's L2 cache between the chunk's passes; fewer,
#: larger chunks measured faster (``docs/PERFORMANCE.md``, "The estimators against their floor").
CHUNK = 16_384


@nb.njit(**_JIT)
def gae(
    rewards, values, next_values, terminated, truncated, gamma, lambda_, plus_values, out
):  # pragma: no cover
    """GAE into ``out`` (λ-returns, GAE + V(s_t), when ``plus_values``); returns False when
    an input may be NaN or infinite (see :func:`_finite`). ``gamma`` and ``lambda_`` are
    float64 ``[N]``, one per column. With N > 1 a λ-return is the advantage rounded to the
    output's dtype plus V(s_t) (what ``gae(...) + values`` gives); with one column it is the
    float64 sum rounded once (:func:`_returns_terms`)."""
    rows, cols = rewards.shape
    # flat 1-D views: numba types them contiguous (a [:, 0] column view would index generically)
    r, v, nv = rewards.reshape(-1), values.reshape(-1), next_values.reshape(-1)
    te, tr, o = terminated.reshape(-1), truncated.reshape(-1), out.reshape(-1)
    if cols == 1:
        return _gae_column(r, v, nv, te, tr, gamma[0], lambda_[0], plus_values, o)
    decay = gamma * lambda_
    carry = np.zeros(cols, dtype=np.float64)
    for j in range(rows):
        # One row's 1-D slices, n innermost: contiguous and free of dependencies, so the loop
        # vectorises (indexing the 2-D arrays with a descending t measured 4× slower).
        s = (rows - 1 - j) * cols
        rr, vv, nn, oo = r[s : s + cols], v[s : s + cols], nv[s : s + cols], o[s : s + cols]
        tt, uu = te[s : s + cols], tr[s : s + cols]
        for n in range(cols):
            delta = _delta(rr[n], vv[n], nn[n], tt[n], gamma[n])
            carry[n] = delta + _decay(tt[n], uu[n], decay[n]) * carry[n]
            oo[n] = carry[n]
        if plus_values:
            for n in range(cols):
                oo[n] += vv[n]
    return _finite(carry)


@nb.njit(**_JIT)
def _finite(last):  # pragma: no cover
    """Whether the chains' values at t = 0 are all finite: False when an input may be NaN or
    infinite, checked for free instead of in three passes over the inputs.

    A non-finite r_t, V(s_t) or V(s_{t+1}) makes δ_t non-finite (0 · ±inf is NaN, so a zero
    γ or a termination does not hide it), and a non-finite value stays so all the way back to
    t = 0: x_t = δ_t + c_t x_{t+1} is non-finite when either term is. The converse fails only
    when finite inputs overflow float64, so the caller scans the inputs before it names one.
    """
    for n in range(last.shape[0]):
        if last[n] - last[n] != 0.0:
            return False
    return True


@nb.njit(inline="always", **_JIT)
def _delta(r, v, nv, terminated, gamma):  # pragma: no cover
    """δ_t = r_t + γ(1 − terminated_t) V(s_{t+1}) − V(s_t), in float64 (inlined into loops)."""
    return r + gamma * (1 - terminated) * nv - v


@nb.njit(inline="always", **_JIT)
def _decay(terminated, truncated, decay):  # pragma: no cover
    """γλ(1 − done_t): for finite values the recursion never crosses an episode boundary
    (inlined into loops; a non-finite one does cross it, as 0 · inf is NaN: see _finite)."""
    return decay * (1 - (terminated | truncated))


@nb.njit(**_JIT)
def _deltas(r, v, nv, te, gamma, d):  # pragma: no cover
    """One chunk's δ_t into ``d`` (float64; one vectorised pass)."""
    for k in range(r.shape[0]):
        d[k] = _delta(r[k], v[k], nv[k], te[k], gamma)


@nb.njit(**_JIT)
def _chain(d, te, tr, decay, m, carry, out):  # pragma: no cover
    """The recursion x_k = d_k + c_k x_{k+1}, c_k = γλ(1 − done_k), for k < m, with
    x_m = ``carry``, into ``out[:m]``; returns x_0 (float64).

    One step at a time it is a chain of m dependent multiply-adds, bound by their latency. Four
    steps at a time, x_k = D + C x_{k+4} with D = d_k + c_k d_{k+1} + c_k c_{k+1} d_{k+2}
    + c_k c_{k+1} c_{k+2} d_{k+3} and C = c_k c_{k+1} c_{k+2} c_{k+3}: D and C need no earlier
    x, so the chain is one multiply-add per four steps, and x_{k+1..k+3} hang off it. In a link
    with no done (nearly all of them) every c is γλ, so D and C take the powers a, a², a³, a⁴ of
    a = γλ and the kernel reads the flags, not a stored c; a link with a done goes one step at a
    time. The sum is regrouped, so results differ from the one-step chain by float64 rounding
    only. A done multiplies the carry by 0 rather than dropping it, so a non-finite carry stays
    non-finite (:func:`_finite`).
    """
    a = decay
    a2 = a * a
    a3 = a2 * a
    a4 = a2 * a2
    k = m
    while k >= 4:
        k -= 4
        if (
            te[k] | te[k + 1] | te[k + 2] | te[k + 3] | tr[k] | tr[k + 1] | tr[k + 2] | tr[k + 3]
        ) == 0:
            x3 = d[k + 3] + a * carry
            x2 = d[k + 2] + a * x3
            x1 = d[k + 1] + a * x2
            carry = ((d[k] + a * d[k + 1]) + (a2 * d[k + 2] + a3 * d[k + 3])) + a4 * carry
            out[k], out[k + 1], out[k + 2], out[k + 3] = carry, x1, x2, x3
        else:
            for j in range(k + 3, k - 1, -1):
                carry = d[j] + _decay(te[j], tr[j], decay) * carry
                out[j] = carry
    while k > 0:
        k -= 1
        carry = d[k] + _decay(te[k], tr[k], decay) * carry
        out[k] = carry
    return carry


@nb.njit(**_JIT)
def _gae_column(
    rewards, values, next_values, terminated, truncated, gamma, lambda_, plus_values, out
):  # pragma: no cover
    # One environment, backwards in chunks: a vectorised pass for δ, then the recursion four
    # steps a link (:func:`_chain`), both on a chunk that sits in the L2 cache.
    decay = gamma * lambda_
    d = np.empty(CHUNK, dtype=np.float64)
    carry = np.zeros(1, dtype=np.float64)
    end = rewards.shape[0]
    while end > 0:
        start = max(0, end - CHUNK)
        te, tr = terminated[start:end], truncated[start:end]
        chunk = (rewards[start:end], values[start:end], next_values[start:end], te)
        if plus_values:
            v_after = values[end] if end < values.shape[0] else 0.0
            _returns_terms(*chunk, tr, gamma, decay, v_after, d)
        else:
            _deltas(*chunk, gamma, d)
        carry[0] = _chain(d, te, tr, decay, end - start, carry[0], out[start:end])
        end = start
    return _finite(carry)


@nb.njit(**_JIT)
def _returns_terms(r, v, nv, te, tr, gamma, decay, v_after, d):  # pragma: no cover
    """:func:`_deltas` for λ-returns: ``d`` gets the terms of their recursion.
    From G_t = Â_t + V(s_t) and Â_t = δ_t + c_t Â_{t+1}, G_t = (δ_t + V(s_t) − c_t V(s_{t+1}))
    + c_t G_{t+1}, the same chain as GAE's (c_t is 0 at a done, where V(s_{t+1}) of the next
    row does not belong to t's episode). ``v_after`` is V of the row after the chunk, 0 after
    the last row (where Â_T = 0 gives G_{T−1} = δ_{T−1} + V(s_{T−1}) with a zero carry).

    δ_t + V(s_t) is formed from δ_t, not as r_t + γ(1 − terminated_t) V(s_{t+1}), so that a
    non-finite V(s_t) still reaches the chain (V(s_0) enters no λ-return otherwise)."""
    m = r.shape[0]
    for k in range(m - 1):
        c = _decay(te[k], tr[k], decay)
        d[k] = _delta(r[k], v[k], nv[k], te[k], gamma) + (v[k] - c * v[k + 1])
    k = m - 1
    c = _decay(te[k], tr[k], decay)
    d[k] = _delta(r[k], v[k], nv[k], te[k], gamma) + (v[k] - c * v_after)


@nb.njit(**_JIT)
def gae_sweep(
    rewards, values, next_values, terminated, truncated, gamma, lambdas, out
):  # pragma: no cover
    # out is [L, T, N]; δ_t is computed once per step for every λ. Returns :func:`_finite`.
    rows, cols = rewards.shape
    n_lambdas = lambdas.shape[0]
    r, v, nv = rewards.reshape(-1), values.reshape(-1), next_values.reshape(-1)
    te, tr = terminated.reshape(-1), truncated.reshape(-1)
    o = out.reshape(n_lambdas, rows * cols)
    if cols == 1:
        return _sweep_column(r, v, nv, te, tr, gamma, lambdas, o)
    carry = np.zeros((n_lambdas, cols), dtype=np.float64)
    delta = np.empty(cols, dtype=np.float64)
    alive = np.empty(cols, dtype=np.float64)
    for j in range(rows):
        # rows backwards, n innermost (contiguous 1-D slices: see gae)
        s = (rows - 1 - j) * cols
        rr, vv, nn = r[s : s + cols], v[s : s + cols], nv[s : s + cols]
        tt, uu = te[s : s + cols], tr[s : s + cols]
        for n in range(cols):
            delta[n] = _delta(rr[n], vv[n], nn[n], tt[n], gamma)
            alive[n] = _decay(tt[n], uu[n], 1.0)
        for i in range(n_lambdas):
            decay = gamma * lambdas[i]
            running, oo = carry[i], o[i, s : s + cols]
            for n in range(cols):
                running[n] = delta[n] + decay * alive[n] * running[n]
                oo[n] = running[n]
    return _finite(carry.reshape(-1))


@nb.njit(**_JIT)
def _sweep_column(
    rewards, values, next_values, terminated, truncated, gamma, lambdas, out
):  # pragma: no cover
    # One environment: per chunk, δ once (:func:`_deltas`), then each λ's recursion by
    # :func:`_chain` into its own contiguous row.
    n_lambdas = lambdas.shape[0]
    d = np.empty(CHUNK, dtype=np.float64)
    carry = np.zeros(n_lambdas, dtype=np.float64)
    end = rewards.shape[0]
    while end > 0:
        start = max(0, end - CHUNK)
        m = end - start
        te, tr = terminated[start:end], truncated[start:end]
        _deltas(rewards[start:end], values[start:end], next_values[start:end], te, gamma, d)
        for i in range(n_lambdas):
            decay = gamma * lambdas[i]
            carry[i] = _chain(d, te, tr, decay, m, carry[i], out[i, start:end])
        end = start
    return _finite(carry)


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
