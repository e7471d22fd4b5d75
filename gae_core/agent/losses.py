"""The losses the trainer differentiates, each written once, for M ≥ 1 members at a time.

Every function takes the members' rows stacked member-major, ``[M, R]`` (the actor's and the
critic's outputs on those rows, the rollout's advantages and targets) with ``mask [M, R]`` (1 on
the member's valid rows, 0 on NEXT_STEP reset rows and rows past its budget) and returns each
member's terms ``[M]``: a member's means run over its own valid rows only, so its loss, and
therefore its gradient, never depends on another member's rows. Gradients come from autograd
(the trainer sums the members' losses; each member's parameters are its own slice of the
stack, so the sum's gradient is every member's own); without gSDE both also exist by hand
(below), and the trainer takes those.

The one combination of the terms, :func:`combine`, is

    loss = policy + c_v · value − c_e · entropy

with ``c_v = value_coef`` and ``c_e = entropy_coef`` of each member (SB3's A2C and PPO).

A2C (Mnih et al. 2016, with GAE advantages Â):

    policy = −mean(Â · log π(a|s)),   value = mean((R − V(s))²),   entropy = mean(H(π(·|s)))

PPO (Schulman et al. 2017, eq. 7; SB3's ``PPO.train``), with r = exp(log π − log π_old):

    policy  = −mean(min(r · Â, clip(r, 1 − ε, 1 + ε) · Â))
    value   = mean((R − V_clip)²),  V_clip = V_old + clip(V − V_old, −ε_v, ε_v)  (ε_v = ∞: V)
    approx_kl = mean((r − 1) − log r)       (SB3's estimator of KL(π_old ‖ π), for target_kl)
    clip_fraction = mean(r ∉ [1 − ε, 1 + ε])  (SB3's |r − 1| > ε, up to rounding)

The value loss is the mean squared error (SB3); CleanRL halves it and takes the larger of the
clipped and unclipped errors, so its ``vf_coef`` weighs half of ours.

Both gradients also exist by hand, beside their losses (:func:`a2c_gradients`,
:func:`ppo_gradients`; gSDE excepted, its noise scale depends on the features): at a small
network's few hundred rows, autograd's graph costs more than the arithmetic. A2C steps once per
rollout with the weights that collected it, so its update also reuses the rollout's actor
activations. Each writes, per row b, g_b = ∂loss/∂log π(a_b|s_b), h_b = ∂loss/∂H_b and
v_b = ∂loss/∂V_b, with w_b = mask_b / B_m (B_m the member's valid rows):

    A2C:  g_b = −w_b Â_b,          h_b = −c_e w_b,   v_b = −2 c_v w_b (R_b − V_b)
    PPO:  g_b = −w_b Â_b r_b κ_b,  h_b = −c_e w_b,   v_b = −2 c_v w_b (R_b − V_clip,b) ι_b

where κ_b is ``torch.minimum``'s gradient through both terms: 1 where r·Â < clip(r, 1 − ε,
1 + ε)·Â, 0 where it is greater, and on a tie ½(1 + 1[1 − ε ≤ r_b ≤ 1 + ε]) (every row inside
the range ties, and in float32 so can a row a few ulps outside it); and
ι_b = 1[|V_b − V_old,b| ≤ ε_v]. Then, with logits z, p = softmax(z), Gaussian means μ with
log-std ℓ and u = (a − μ) e^{−ℓ}:

    ∂loss/∂z_b = g_b (e_{a_b} − p_b) − h_b p_b ⊙ (log p_b + H_b)
    ∂loss/∂μ_b = g_b u_b e^{−ℓ},   ∂loss/∂ℓ = Σ_b [g_b (u_b² − 1) + h_b]

and back through each network (:meth:`~gae_core.agent.stacked.StackedMLP.backward`).
``tests/test_losses.py`` checks both against autograd of their losses;
``benchmarks/bench_hand_gradient.py`` measures what they buy on whole runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from gae_core.agent.policy import log_probs_and_entropy
from gae_core.agent.stacked import StackedMLP

__all__ = [
    "ADVANTAGE_EPSILON",
    "Coefficients",
    "LossTerms",
    "PPOFixed",
    "RowTerms",
    "Rows",
    "a2c_gradients",
    "a2c_loss",
    "combine",
    "masked_mean",
    "ppo_fixed",
    "ppo_gradients",
    "ppo_loss",
    "standardize",
    "take_rows",
]

#: Added to the advantages' std when they are standardised (SB3 and CleanRL).
ADVANTAGE_EPSILON = 1e-8


@dataclass(frozen=True)
class Coefficients:
    """Each member's weights and clip ranges ``[M]``, as every loss here takes them."""

    #: c_v, the value term's weight
    value_coef: torch.Tensor
    #: c_e, the entropy bonus's weight; None: no member weighs it (c_e = 0, its gradient is
    #: not written)
    entropy_coef: torch.Tensor | None
    #: PPO: ε, the policy's clip range
    clip_range: torch.Tensor | None = None
    #: PPO: ε_v, the value's clip range (∞: that member's value is not clipped); None: no
    #: member's is, V_clip = V
    clip_range_vf: torch.Tensor | None = None


@dataclass(frozen=True)
class Rows:
    """A batch's numbers per row ``[M, R]`` besides the networks' outputs: the advantages Â as
    the loss uses them (standardised or not), the critic's targets R and the valid-row mask;
    for PPO also the rollout's log π_old(a|s) and V_old(s)."""

    advantages: torch.Tensor
    returns: torch.Tensor
    mask: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    def take(self, index: torch.Tensor) -> Rows:
        """Rows ``index [M, B]`` of each member's rows."""
        return Rows(*(None if x is None else take_rows(x, index) for x in _fields_of(self)))

    def with_advantages(self, advantages: torch.Tensor) -> Rows:
        return replace(self, advantages=advantages)


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index [M, B]`` of each member's ``x [M, R, ...]``."""
    if x.dim() == 2:
        return x.gather(1, index)
    return x.gather(1, index[..., None].expand(-1, -1, *x.shape[2:]))


def _fields_of(rows: Rows) -> tuple[torch.Tensor | None, ...]:
    """The fields of ``rows`` in order, not copied (``dataclasses.astuple`` deep-copies)."""
    return tuple(getattr(rows, f.name) for f in fields(rows))


@dataclass(frozen=True)
class RowTerms:
    """Per row ``[M, R]``, what a gradient by hand takes from its loss (it runs without a
    graph): the value error's factor (R − V_clip)·ι (A2C: R − V); PPO's r, r·Â, clip(r)·Â and
    1[r within the clip range]."""

    value_error: torch.Tensor
    ratio: torch.Tensor | None = None
    unclipped: torch.Tensor | None = None
    clipped: torch.Tensor | None = None
    inside: torch.Tensor | None = None


@dataclass
class LossTerms:
    """Each member's terms ``[M]``; ``loss`` is the one :func:`combine` made of them."""

    loss: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor | None = None
    clip_fraction: torch.Tensor | None = None
    rows: RowTerms | None = None


@dataclass(frozen=True)
class PPOFixed:
    """What :func:`ppo_loss` and :func:`ppo_gradients` take from a minibatch's mask and
    advantages and the members' coefficients alone: the same at every epoch over that
    minibatch, so an update whose one minibatch holds every row (CartPole's Zoo row, 20 epochs)
    computes it once (:func:`ppo_fixed`)."""

    #: w_b = mask_b / B_m, each row's share of its member's mean ``[M, R]``
    weight: torch.Tensor
    #: the clip range's bounds 1 − ε and 1 + ε ``[M, 1]``
    low: torch.Tensor
    high: torch.Tensor
    #: −w_b Â_b, g_b before its r_b κ_b; −c_e w_b (None without entropy); −2 c_v w_b
    policy_grad: torch.Tensor
    entropy_grad: torch.Tensor | None
    value_grad: torch.Tensor


def ppo_fixed(rows: Rows, coefficients: Coefficients) -> PPOFixed:
    """:class:`PPOFixed` of these rows and coefficients, as :func:`ppo_loss` takes them."""
    weight = _weight(rows.mask)
    epsilon = coefficients.clip_range[:, None]
    entropy_grad, value_grad = _term_gradients(weight, coefficients)
    return PPOFixed(weight, 1.0 - epsilon, 1.0 + epsilon, -weight * rows.advantages,
                    entropy_grad, value_grad)  # fmt: skip


def _term_gradients(
    weight: torch.Tensor, coefficients: Coefficients
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """h_b = −c_e w_b (None without entropy) and −2 c_v w_b, v_b before its value error: the
    same in A2C and PPO (module docstring)."""
    entropy_coef = coefficients.entropy_coef
    entropy_grad = None if entropy_coef is None else -entropy_coef[:, None] * weight
    return entropy_grad, (-2.0 * coefficients.value_coef[:, None]) * weight


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
    policy: torch.Tensor, value: torch.Tensor, entropy: torch.Tensor, coefficients: Coefficients
) -> torch.Tensor:
    """policy + c_v · value − c_e · entropy, per member ``[M]`` (the module docstring); no
    entropy coefficient (None): c_e = 0 for every member."""
    loss = policy + coefficients.value_coef * value
    entropy_coef = coefficients.entropy_coef
    return loss if entropy_coef is None else loss - entropy_coef * entropy


def a2c_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    rows: Rows,
    coefficients: Coefficients,
) -> LossTerms:
    """The A2C loss of each member (module docstring); ``log_probs``, ``entropy`` and
    ``values`` per row ``[M, R]``. ``rows.advantages`` are used as given (standardised or
    not)."""
    weight = _weight(rows.mask)
    error = rows.returns - values
    surrogate, value, mean_entropy = _means(
        weight, rows.advantages * log_probs, error.square(), entropy
    )
    policy = -surrogate
    loss = combine(policy, value, mean_entropy, coefficients)
    return LossTerms(loss, policy, value, mean_entropy, rows=RowTerms(error))


@torch.no_grad()
def a2c_gradients(
    actor: StackedMLP,
    critic: StackedMLP,
    log_std: torch.Tensor | None,
    actor_pass: list[torch.Tensor],
    critic_pass: list[torch.Tensor],
    actions: torch.Tensor,
    rows: Rows,
    coefficients: Coefficients,
) -> LossTerms:
    """The gradient of every member's :func:`a2c_loss` by hand (module docstring), written into
    the ``.grad`` of the actor's and critic's stacks and of ``log_std`` (Gaussian policies;
    None: logits); returns the loss terms, from :func:`a2c_loss` itself.

    ``actor_pass`` and ``critic_pass`` are :meth:`StackedMLP.layers` of the two networks on
    the rows, by the weights being differentiated; ``rows`` and ``coefficients`` as
    :func:`a2c_loss` takes them. Without gSDE only (its noise scale depends on the
    features)."""
    log_probs, entropy, values, probs = _outputs(actor_pass, critic_pass, actions, log_std)
    terms = a2c_loss(log_probs, entropy, values, rows, coefficients)
    weight = _weight(rows.mask)
    entropy_grad, value_grad = _term_gradients(weight, coefficients)
    _backward(
        actor, critic, log_std, actor_pass, critic_pass, actions, entropy, probs,
        log_prob_grad=-weight * rows.advantages,
        entropy_grad=entropy_grad,
        value_grad=value_grad * terms.rows.value_error,
    )  # fmt: skip
    return terms


@torch.no_grad()
def ppo_gradients(
    actor: StackedMLP,
    critic: StackedMLP,
    log_std: torch.Tensor | None,
    actor_pass: list[torch.Tensor],
    critic_pass: list[torch.Tensor],
    actions: torch.Tensor,
    rows: Rows,
    coefficients: Coefficients,
    fixed: PPOFixed | None = None,
) -> LossTerms:
    """The gradient of every member's :func:`ppo_loss` by hand (module docstring), written as
    :func:`a2c_gradients` writes A2C's; returns the loss terms, from :func:`ppo_loss` itself.
    ``actor_pass`` and ``critic_pass`` as there, the other arguments as :func:`ppo_loss` takes
    them. Without gSDE only."""
    if fixed is None:
        fixed = ppo_fixed(rows, coefficients)
    log_probs, entropy, values, probs = _outputs(actor_pass, critic_pass, actions, log_std)
    terms = ppo_loss(log_probs, entropy, values, rows, coefficients, fixed)
    kept = terms.rows
    ratio = kept.ratio
    # κ = 1[r·Â < clip(r)·Â] + ½ 1[tie] + ½ 1[inside] (a row inside the range always ties)
    choice = (kept.unclipped < kept.clipped).to(ratio.dtype)
    choice.add_((kept.unclipped == kept.clipped).to(ratio.dtype).add_(kept.inside), alpha=0.5)
    _backward(
        actor, critic, log_std, actor_pass, critic_pass, actions, entropy, probs,
        log_prob_grad=fixed.policy_grad * ratio * choice,  # autograd's order of products
        entropy_grad=fixed.entropy_grad,
        value_grad=fixed.value_grad * kept.value_error,
    )  # fmt: skip
    return terms


def _outputs(
    actor_pass: list[torch.Tensor],
    critic_pass: list[torch.Tensor],
    actions: torch.Tensor,
    log_std: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """log π(a|s), the entropy and V(s) per row from the networks' passes, and (logits) log p
    and p of every action."""
    probs: list[torch.Tensor] = []
    log_probs, entropy = log_probs_and_entropy(
        actor_pass[-1], actions, None if log_std is None else log_std[:, None, :], probs
    )
    return log_probs, entropy, critic_pass[-1].squeeze(-1), probs


def _weight(mask: torch.Tensor) -> torch.Tensor:
    """w_b = mask_b / B_m: each row's share of its member's mean, as :func:`masked_mean`."""
    return mask / mask.sum(-1, keepdim=True).clamp(min=1.0)


def _means(weight: torch.Tensor, *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each member's mean ``[M]`` of each of ``rows`` (``[M, R]`` each) over its valid rows,
    from :func:`_weight`'s weights (:func:`masked_mean` of the same rows): one stack, one
    product and one sum for all of them."""
    return (torch.stack(rows) * weight).sum(-1).unbind(0)


def _backward(
    actor: StackedMLP,
    critic: StackedMLP,
    log_std: torch.Tensor | None,
    actor_pass: list[torch.Tensor],
    critic_pass: list[torch.Tensor],
    actions: torch.Tensor,
    entropy: torch.Tensor,
    probs: list[torch.Tensor],
    log_prob_grad: torch.Tensor,
    entropy_grad: torch.Tensor | None,
    value_grad: torch.Tensor,
) -> None:
    """Write every parameter's gradient from g, h and v per row (the module docstring's last
    formulas, then :meth:`StackedMLP.backward` of each network); ``probs``: log p and p from
    :func:`_outputs` (logits); ``entropy_grad`` None: h = 0."""
    critic.backward(critic_pass, value_grad[..., None])
    out, g = actor_pass[-1], log_prob_grad[..., None]
    if log_std is None:
        log_p, p = probs
        if entropy_grad is None:
            grad_out = (p * g).neg_()
        else:
            grad_out = p * (log_p + entropy[..., None]) * (-entropy_grad)[..., None]
            grad_out -= p * g
        grad_out.scatter_add_(-1, actions.long()[..., None], g)
    else:
        inverse_std = torch.exp(-log_std[:, None, :])  # [M, 1, A]
        u = (actions - out) * inverse_std
        grad_out = g * u * inverse_std
        grad_log_std = (g * (u.square() - 1.0)).sum(1)
        if entropy_grad is not None:
            grad_log_std = grad_log_std + entropy_grad.sum(1)[:, None]
        if log_std.grad is None:  # a normal tensor, even when written in inference mode
            with torch.inference_mode(False):
                log_std.grad = torch.zeros_like(log_std)
        log_std.grad.copy_(grad_log_std)
    actor.backward(actor_pass, grad_out)


def ppo_loss(
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    rows: Rows,
    coefficients: Coefficients,
    fixed: PPOFixed | None = None,
) -> LossTerms:
    """The PPO loss of each member (module docstring); ``log_probs``, ``entropy`` and
    ``values`` per row ``[M, R]``, ``rows`` with the rollout's log-probs and values, the
    clip ranges in ``coefficients``; ``fixed``: :func:`ppo_fixed` of the same arguments, where
    the caller kept it. :attr:`LossTerms.rows` holds the per-row numbers :func:`ppo_gradients`
    takes from it."""
    if fixed is None:
        fixed = ppo_fixed(rows, coefficients)
    advantages = rows.advantages
    log_ratio = log_probs - rows.old_log_probs
    ratio = log_ratio.exp()
    clamped = ratio.clamp(fixed.low, fixed.high)
    unclipped, clipped = ratio * advantages, clamped * advantages
    error, value_error = _value_error(values, rows, coefficients.clip_range_vf)
    with torch.no_grad():
        inside = (ratio == clamped).to(ratio.dtype)  # clamp's gradient: 1 within its bounds
        # the diagnostics: r outside [1 − ε, 1 + ε] (|r − 1| > ε up to rounding), and the KL
        diagnostics = ((ratio - 1.0) - log_ratio, 1.0 - inside)
    surrogate, value, mean_entropy, approx_kl, clip_fraction = _means(
        fixed.weight, torch.minimum(unclipped, clipped), error.square(), entropy, *diagnostics
    )
    policy = -surrogate
    loss = combine(policy, value, mean_entropy, coefficients)
    kept = RowTerms(value_error, ratio, unclipped, clipped, inside)
    return LossTerms(loss, policy, value, mean_entropy, approx_kl, clip_fraction, kept)


def _value_error(
    values: torch.Tensor, rows: Rows, clip_range_vf: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """R − V_clip per row (with its graph), and (R − V_clip)·ι without one, ι = 1[|V − V_old|
    ≤ ε_v] (the clip's gradient); with no clip (None), R − V for both."""
    if clip_range_vf is None:
        error = rows.returns - values
        return error, error
    epsilon_v = clip_range_vf[:, None]
    change = values - rows.old_values
    limited = change.clamp(-epsilon_v, epsilon_v)
    # a member that does not clip takes V itself, as it would alone (V_old + (V − V_old) can
    # round away from V): its numbers never depend on whether another member clips
    clipped_values = torch.where(epsilon_v.isinf(), values, rows.old_values + limited)
    error = rows.returns - clipped_values
    with torch.no_grad():
        return error, error * (limited == change).to(error.dtype)
