"""The losses the trainer differentiates, each written once, for M ≥ 1 members at a time.

Every function takes the members' rows stacked member-major, ``[M, R]`` (the actor's and the
critic's outputs on those rows, the rollout's advantages and targets) with ``mask [M, R]`` (1 on
the member's valid rows, 0 on NEXT_STEP reset rows and rows past its budget) and returns each
member's terms ``[M]``: a member's means run over its own valid rows only, so its loss, and
therefore its gradient, never depends on another member's rows. Gradients come from autograd
(the trainer sums the members' losses; each member's parameters are its own slice of the
stack, so the sum's gradient is every member's own), except A2C's without gSDE, which also
exists by hand (below).

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

A2C's gradient also exists by hand, beside the loss (:func:`a2c_gradients`), because A2C takes
one step per rollout with the weights that collected it: the rollout's actor activations are
the update's, so the update needs no second actor pass and no graph. With w_b = mask_b / B_m
(B_m the member's valid rows), logits z, p = softmax(z), Gaussian means μ with log-std ℓ and
u = (a − μ) e^{−ℓ}:

    ∂loss/∂z_b = w_b [Â_b (p_b − e_{a_b}) + c_e p_b ⊙ (log p_b + H_b)]
    ∂loss/∂μ_b = −w_b Â_b u_b e^{−ℓ},   ∂loss/∂ℓ = −Σ_b w_b [Â_b (u_b² − 1) + c_e]
    ∂loss/∂V_b = −2 c_v w_b (R_b − V_b)

then back through each network (:meth:`~gae_core.agent.stacked.StackedMLP.backward`).
``tests/test_losses.py`` checks it against autograd of :func:`a2c_loss`;
``benchmarks/bench_hand_gradient.py`` measures what it buys on whole runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gae_core.agent.policy import log_probs_and_entropy
from gae_core.agent.stacked import StackedMLP

__all__ = [
    "ADVANTAGE_EPSILON",
    "LossTerms",
    "a2c_gradients",
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


@torch.no_grad()
def a2c_gradients(
    actor: StackedMLP,
    critic: StackedMLP,
    log_std: torch.Tensor | None,
    actor_pass: list[torch.Tensor],
    critic_pass: list[torch.Tensor],
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_coef: torch.Tensor,
    entropy_coef: torch.Tensor,
) -> LossTerms:
    """The gradient of every member's :func:`a2c_loss` by hand (module docstring), written into
    the ``.grad`` of the actor's and critic's stacks and of ``log_std`` (Gaussian policies;
    None: logits); returns the loss terms, from :func:`a2c_loss` itself.

    ``actor_pass`` and ``critic_pass`` are :meth:`StackedMLP.layers` of the two networks on
    the rollout's ``[M, R]`` rows, by the weights being differentiated; the other arguments
    as :func:`a2c_loss` takes them. Without gSDE only (its noise scale depends on the
    features)."""
    out, values = actor_pass[-1], critic_pass[-1].squeeze(-1)
    log_probs, entropy = log_probs_and_entropy(
        out, actions, None if log_std is None else log_std[:, None, :]
    )
    terms = a2c_loss(log_probs, entropy, values, advantages, returns, mask, value_coef,
                     entropy_coef)  # fmt: skip
    weight = mask / mask.sum(-1, keepdim=True).clamp(min=1.0)  # w_b, as masked_mean weighs
    errors = returns - values
    critic.backward(critic_pass, ((-2.0 * value_coef[:, None]) * weight * errors)[..., None])
    if log_std is None:
        log_p = F.log_softmax(out, dim=-1)
        p = log_p.exp()
        grad_out = p * (log_p + entropy[..., None]) * entropy_coef[:, None, None]
        grad_out += p * advantages[..., None]
        grad_out.scatter_add_(-1, actions.long()[..., None], -advantages[..., None])
        grad_out *= weight[..., None]
    else:
        inverse_std = torch.exp(-log_std[:, None, :])  # [M, 1, A]
        u = (actions - out) * inverse_std
        weighted = (weight * advantages)[..., None]
        grad_out = -weighted * u * inverse_std
        grad_log_std = -(weighted * (u.square() - 1.0)).sum(1)
        grad_log_std -= (entropy_coef * weight.sum(1))[:, None]  # Σ_b w_b: 1, or 0 if no row
        if log_std.grad is None:
            log_std.grad = torch.zeros_like(log_std)
        log_std.grad.copy_(grad_log_std)
    actor.backward(actor_pass, grad_out)
    return terms


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
