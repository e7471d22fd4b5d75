"""The losses the trainer differentiates, each written once, for M ≥ 1 members at a time.

Every function takes the members' rows stacked member-major, ``[M, R]`` (the actor's and the
critic's outputs on those rows, the rollout's advantages and targets) with ``mask [M, R]`` (1 on
the member's valid rows, 0 on NEXT_STEP reset rows and rows past its budget) and returns each
member's terms ``[M]``: a member's means run over its own valid rows only, so its loss, and
therefore its gradient, never depends on another member's rows. Gradients come from autograd;
the trainer sums the members' losses (each member's parameters are its own slice of the
stack, so the sum's gradient is every member's own).

The one combination of the terms, :func:`combine`, is

    loss = policy + c_v · value − c_e · entropy

with ``c_v = value_coef`` and ``c_e = entropy_coef`` of each member (SB3's A2C and PPO).

A2C (Mnih et al. 2016, with GAE advantages Â):

    policy = −mean(Â · log π(a|s)),   value = mean((R − V(s))²),   entropy = mean(H(π(·|s)))

PPO (Schulman et al. 2017, eq. 7; SB3's ``PPO.train``), with r = exp(log π − log π_old):

    policy  = −mean(min(r · Â, clip(r, 1 − ε, 1 + ε) · Â))
    value   = mean((R − V_clip)²),  V_clip = V_old + clip(V − V_old, −ε_v, ε_v)  (ε_v = ∞: V)
    approx_kl = mean((r − 1) − log r)       (SB3's estimator of KL(π_old ‖ π), for target_kl)
    clip_fraction = mean(|r − 1| > ε)

The value loss is the mean squared error (SB3); CleanRL halves it and takes the larger of the
clipped and unclipped errors, so its ``vf_coef`` weighs half of ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ADVANTAGE_EPSILON",
    "LossTerms",
    "a2c_loss",
    "combine",
    "masked_mean",
    "ppo_loss",
    "standardize",
]

#: Added to the advantages' std when they are standardised (SB3 and CleanRL).
ADVANTAGE_EPSILON = 1e-8


@dataclass
class LossTerms:
    """Each member's terms ``[M]``; ``loss`` is the one :func:`combine` made of them."""

    loss: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor | None = None
    clip_fraction: torch.Tensor | None = None


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each member's mean of ``x [M, R]`` over its rows where ``mask`` is 1 (0 with none)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def standardize(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each member's advantages ``[M, R]`` as (Â − mean) / (std + 1e-8) over its valid rows, with
    the unbiased std as SB3 and CleanRL compute it (``torch.std``); a member with fewer than
    two valid rows keeps its advantages (a std of one row is undefined)."""
    count = mask.sum(-1, keepdim=True)
    mean = (advantages * mask).sum(-1, keepdim=True) / count.clamp(min=1.0)
    squares = ((advantages - mean).square() * mask).sum(-1, keepdim=True)
    std = (squares / (count - 1.0).clamp(min=1.0)).sqrt()
    scaled = (advantages - mean) / (std + ADVANTAGE_EPSILON)
    return torch.where(count > 1, scaled, advantages)


def combine(
    policy: torch.Tensor,
    value: torch.Tensor,
    entropy: torch.Tensor,
    value_coef: torch.Tensor,
    entropy_coef: torch.Tensor,
) -> torch.Tensor:
    """policy + c_v · value − c_e · entropy, per member ``[M]`` (the module docstring)."""
    return policy + value_coef * value - entropy_coef * entropy


def a2c_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_coef: torch.Tensor,
    entropy_coef: torch.Tensor,
) -> LossTerms:
    """The A2C loss of each member (module docstring); every row argument ``[M, R]``, the
    coefficients ``[M]``. ``advantages`` are used as given (standardised or not)."""
    policy = -masked_mean(advantages * log_probs, mask)
    value = masked_mean((returns - values).square(), mask)
    mean_entropy = masked_mean(entropy, mask)
    loss = combine(policy, value, mean_entropy, value_coef, entropy_coef)
    return LossTerms(loss, policy, value, mean_entropy)


def ppo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range: torch.Tensor,
    clip_range_vf: torch.Tensor,
    value_coef: torch.Tensor,
    entropy_coef: torch.Tensor,
) -> LossTerms:
    """The PPO loss of each member (module docstring); every row argument ``[M, R]``, the
    coefficients and clip ranges ``[M]`` (``clip_range_vf`` ∞: the value is not clipped)."""
    epsilon, epsilon_v = clip_range[:, None], clip_range_vf[:, None]
    log_ratio = log_probs - old_log_probs
    ratio = log_ratio.exp()
    surrogate = torch.minimum(
        ratio * advantages, ratio.clamp(1.0 - epsilon, 1.0 + epsilon) * advantages
    )
    policy = -masked_mean(surrogate, mask)
    clipped = old_values + torch.maximum(torch.minimum(values - old_values, epsilon_v), -epsilon_v)
    value = masked_mean((returns - clipped).square(), mask)
    mean_entropy = masked_mean(entropy, mask)
    loss = combine(policy, value, mean_entropy, value_coef, entropy_coef)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask)
        clip_fraction = masked_mean(((ratio - 1.0).abs() > epsilon).to(ratio.dtype), mask)
    return LossTerms(loss, policy, value, mean_entropy, approx_kl, clip_fraction)
