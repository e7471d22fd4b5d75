"""Accelerator path of :mod:`gae_core.estimators`: the same estimators as torch ops on the
tensors' own device, used for tensors that are not on the CPU (copying a rollout to the host and
back would cost more than the estimate).

Both backward recursions are instances of the affine recurrence A_t = b_t + c_t·A_{t+1}, A_T = 0,
solved by a Hillis–Steele doubling scan in ⌈log2 T⌉ rounds of element-wise ops: after the round
with offset o, element t holds the composition of the maps f_t ∘ … ∘ f_{t+2o−1} of
f_s(x) = b_s + c_s·x, and maps past row T−1 are the zero map. The products of c stay in [0, 1]
(no division), so the scan is as stable as the plain loop. Inputs are validated by the caller:
2-D ``[T, N]`` float tensors of one dtype and bool flags.
"""

from __future__ import annotations

import torch


def reverse_affine_scan(b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Solve A_t = b_t + c_t·A_{t+1} along dim 0 with A_T = 0; any trailing shape."""
    a, c = b.clone(), c.clone()
    offset = 1
    while offset < a.shape[0]:
        # right-hand sides read the previous round's values (torch evaluates them first)
        a[:-offset], c[:-offset] = a[:-offset] + c[:-offset] * a[offset:], c[:-offset] * c[offset:]
        offset *= 2
    return a


def _mask(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # bool → the float dtype first: `gamma * bool_tensor` alone would round γ to float32
    return flags.to(like.dtype)


def td_residuals(rewards, values, next_values, terminated, *, gamma: float) -> torch.Tensor:
    return rewards + gamma * _mask(~terminated, rewards) * next_values - values


def gae(rewards, values, next_values, terminated, truncated, *, gamma, lambda_) -> torch.Tensor:
    deltas = td_residuals(rewards, values, next_values, terminated, gamma=gamma)
    return reverse_affine_scan(deltas, gamma * lambda_ * _mask(~(terminated | truncated), deltas))


def gae_lambda_sweep(
    rewards, values, next_values, terminated, truncated, *, gamma, lambdas
) -> torch.Tensor:
    deltas = td_residuals(rewards, values, next_values, terminated, gamma=gamma)
    grid = torch.as_tensor(lambdas, dtype=rewards.dtype, device=rewards.device)
    keep = (gamma * _mask(~(terminated | truncated), deltas)).unsqueeze(-1) * grid  # [T, N, L]
    advantages = reverse_affine_scan(deltas.unsqueeze(-1).expand_as(keep), keep)
    return advantages.permute(2, 0, 1)


def discounted_returns(rewards, next_values, terminated, truncated, *, gamma) -> torch.Tensor:
    cut = truncated.clone()
    cut[-1:] = True  # the end of the rollout is an implicit cut (no row to cut when T = 0)
    alive = ~terminated
    # R_t = r_t + γ(1 − term_t)[cut_t·V(s_{t+1}) + (1 − cut_t)·R_{t+1}]
    b = rewards + gamma * _mask(alive & cut, rewards) * next_values
    return reverse_affine_scan(b, gamma * _mask(alive & ~cut, rewards))


def k_step_advantages(
    rewards, values, next_values, terminated, truncated, *, gamma, ks
) -> torch.Tensor:
    """``[K, T, N]`` for the horizons ``ks``, linear in T for any k: with S_t the full segment
    sum (GAE λ = 1) and L_t the steps left in t's segment, Â^(k)_t = S_t − γ^k S_{t+k} while
    k < L_t, else S_t."""
    deltas = td_residuals(rewards, values, next_values, terminated, gamma=gamma)
    steps = deltas.shape[0]
    cut = terminated | truncated
    cut[-1:] = True  # the end of the rollout ends every segment (no row when T = 0)
    alive = _mask(~cut, deltas)
    suffix = reverse_affine_scan(deltas, gamma * alive)
    # L_t = 1 + (1 − cut_t)·L_{t+1}, in float64 so counts stay exact on long rollouts
    left = reverse_affine_scan(torch.ones_like(alive, dtype=torch.float64), alive.double())
    table = torch.empty((len(ks), *deltas.shape), dtype=deltas.dtype, device=deltas.device)
    for i, k in enumerate(ks):
        table[i] = suffix
        if k < steps:
            inside = (left[: steps - k] > k).to(deltas.dtype)
            table[i, : steps - k] -= (gamma**k) * inside * suffix[k:]
    return table
