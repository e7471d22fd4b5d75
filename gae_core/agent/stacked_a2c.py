"""A population's update without autograd: hand-derived gradients of every member's A2C loss,
written into one ``[M, P]`` buffer (member m's P parameters in row m).

Why: a CartPole preset population (35 members × 8 envs × 5 steps) spent its update in a few
hundred small torch ops, and autograd's graph, per-parameter clipping and a 13-tensor optimizer
step added their own overhead to the matrix products that are the real work.
``python benchmarks/bench_population.py`` measures the two engines side by side. Here:

* the rollout's actor pass keeps its layer activations (:meth:`StackedA2C.act`): the weights
  do not change within a rollout, so they are the activations the update's actor pass would
  compute, and the update runs no second actor pass;
* the backward pass is two batched products and a sum per layer (one product at the first
  layer), no graph;
* each member's gradient norm is one reduction over its row; the optimizer steps one tensor.

The loss and its gradients with respect to the networks' outputs are those of the single-run
engine (:mod:`gae_core.agent.numpy_a2c`, whose docstring derives them), per member m over its
B_m valid rows (mask w, so a member's mean is Σ_b w_b (·) / B_m)::

    ∂loss_m/∂z_b = w_b [A_b (p_b − e_{a_b}) + c_e p_b ⊙ (log p_b + H_b)] / B_m
    ∂loss_m/∂μ_b = −w_b A_b u_b e^{−ℓ} / B_m,  ∂loss_m/∂ℓ = −Σ_b w_b [A_b (u_b² − 1) + c_e] / B_m
    ∂loss_m/∂V_b = −2 c_v w_b (R_b − V_b) / B_m

with each layer y = x W + b (``W [fan_in, fan_out]`` as :class:`StackedMLP` stores it),
h = tanh(y): ∂W = xᵀ ∂y, ∂b = Σ_rows ∂y, ∂x = ∂y Wᵀ, ∂y = ∂h ⊙ (1 − h²).
``tests/test_population.py`` checks whole updates against single runs on the same data, on
both engines, and ``tests/test_stacked_a2c.py`` every gradient against torch autograd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gae_core.agent.stacked import NARROW_MAX, StackedMLP, stacked_linear

__all__ = ["LossTerms", "StackedA2C", "log_probs_and_entropy"]

_LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class LossTerms:
    """Each member's loss terms ``[M]`` (means over its valid rows)."""

    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor


def log_probs_and_entropy(
    out: torch.Tensor, actions: torch.Tensor, log_std: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(a|s) and the policy's entropy per row, ``[M, R]``, from the actor's outputs
    ``out [M, R, A]`` (logits, or Gaussian means with ``log_std [M, A]``) and ``actions``."""
    if log_std is None:
        log_p = F.log_softmax(out, dim=-1)
        log_probs = log_p.gather(2, actions.long().unsqueeze(2)).squeeze(2)
        return log_probs, -(log_p.exp() * log_p).sum(-1)
    log_std = log_std[:, None, :]  # [M, 1, A]
    z = (actions - out) * torch.exp(-log_std)
    log_probs = (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)
    entropy = (0.5 + 0.5 * _LOG_2PI + log_std).sum(-1).expand(out.shape[:2])
    return log_probs, entropy


def _forward(net: StackedMLP, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's input and the output, ``[x, h_1, …, out]``.

    A hidden layer's tanh(y) is 2σ(2y) − 1 (:func:`~gae_core.agent.stacked.stacked_tanh`'s
    form, measured faster there) with the 2y from the product itself (``alpha = beta = 2``,
    exact in floating point) and σ and the rest in place: three passes, no allocation."""
    outputs = [x]
    last = len(net.weights) - 1
    for i, (weight, bias) in enumerate(zip(net.weights, net.biases, strict=True)):
        if i < last:
            x = torch.baddbmm(bias, x, weight, beta=2.0, alpha=2.0).sigmoid_()
            x = x.mul_(2.0).sub_(1.0)
        else:
            x = stacked_linear(bias, x, weight)
        outputs.append(x)
    return outputs


def _backward(
    net: StackedMLP, grads: list[tuple[torch.Tensor, torch.Tensor]], outputs: list, grad
) -> None:
    """Write ∂loss/∂(W, b) of every layer into ``grads`` (views of the flat gradient), from
    ``grad`` = ∂loss/∂out ``[M, B, N]`` and :func:`_forward`'s ``outputs``."""
    for i in range(len(net.weights) - 1, -1, -1):
        grad_weight, grad_bias = grads[i]
        x, weight = outputs[i], net.weights[i]
        narrow = weight.shape[2] <= NARROW_MAX
        if narrow:  # (∂yᵀ x)ᵀ: the fast form for narrow layers (see stacked_linear)
            grad_weight.copy_(torch.bmm(grad.transpose(1, 2), x).transpose(1, 2))
        else:
            grad_weight.copy_(torch.bmm(x.transpose(1, 2), grad))
        grad_bias.copy_(grad.sum(1, keepdim=True))
        if i > 0:
            transposed = weight.transpose(1, 2)
            if weight.shape[2] == 1:  # one output: a broadcast product
                grad = grad * transposed
            else:
                grad = torch.bmm(grad, transposed)
            grad = torch.ops.aten.tanh_backward(grad, outputs[i])


class StackedA2C:
    """A population's actor and critic (and Gaussian log-std) on one flat ``[M, P]`` buffer,
    with the rollout pass, the critic pass and the loss gradient of every member.

    Construction moves the stacked parameters into :attr:`flat` (the given
    :class:`StackedMLP` objects and ``log_std`` then hold views of it) and its gradient
    :attr:`grad`; :attr:`log_std` is the view the population samples with.
    """

    def __init__(
        self, actor: StackedMLP, critic: StackedMLP, log_std: torch.Tensor | None, steps: int
    ) -> None:
        self.actor, self.critic = actor, critic
        params = actor.parameters() + critic.parameters()
        if log_std is not None:
            params.append(log_std)
        members = params[0].shape[0]
        self.flat = torch.cat([p.detach().reshape(members, -1) for p in params], dim=1)
        self.grad = torch.zeros_like(self.flat)
        views, grads, offset = [], [], 0
        for p in params:
            size = p[0].numel()
            views.append(self.flat[:, offset : offset + size].view(p.shape))
            grads.append(self.grad[:, offset : offset + size].view(p.shape))
            offset += size
        # the stacks' attributes in :meth:`StackedMLP.parameters`'s order, then the log-std
        owners = [(actor, "weights"), (actor, "biases"), (critic, "weights"), (critic, "biases")]
        grad_lists, start = [], 0
        for net, name in owners:
            count = len(getattr(net, name))
            setattr(net, name, views[start : start + count])
            grad_lists.append(grads[start : start + count])
            start += count
        self._actor_grads = list(zip(grad_lists[0], grad_lists[1], strict=True))
        self._critic_grads = list(zip(grad_lists[2], grad_lists[3], strict=True))
        self.log_std = views[-1] if log_std is not None else None
        self._grad_log_std = grads[-1] if log_std is not None else None
        self._steps = steps
        self._kept: list[torch.Tensor] = []  # the rollout's activations, [M, T, E, width]
        self._acted = 0  # the steps of the current rollout kept so far
        self._critic_pass: list[torch.Tensor] = []

    @property
    def discrete(self) -> bool:
        return self.log_std is None

    @torch.no_grad()
    def act(self, obs: torch.Tensor, step: int) -> torch.Tensor:
        """The actor's outputs for ``obs [M, E, obs_dim]`` at rollout step ``step``; the
        activations are kept for the update."""
        if step not in (0, self._acted):  # a rollout's steps in order, from 0
            raise RuntimeError(f"act() at rollout step {step} after {self._acted} steps")
        self._acted = step + 1
        outputs = _forward(self.actor, obs)
        if not self._kept:
            members, envs = obs.shape[:2]
            with torch.inference_mode(False):  # normal tensors, written in or out of that mode
                self._kept = [
                    torch.empty(members, self._steps, envs, h.shape[2]) for h in outputs[1:]
                ]
        for kept, h in zip(self._kept, outputs[1:], strict=True):
            kept[:, step] = h
        return outputs[-1]

    @torch.no_grad()
    def values(self, observations: torch.Tensor) -> torch.Tensor:
        """V(s) ``[M, N]`` for ``observations [M, N, obs_dim]``; the pass is kept for
        :meth:`gradients`."""
        self._critic_pass = _forward(self.critic, observations)
        return self._critic_pass[-1].squeeze(-1)

    def _actor_pass(self, observations: torch.Tensor) -> list[torch.Tensor]:
        members, rows = observations.shape[:2]
        steps = rows // self._kept[0].shape[2] if self._kept else 0
        if steps == 0 or steps != self._acted:
            raise RuntimeError(
                f"gradients() of {steps} rollout steps needs that rollout's act() passes "
                f"({self._acted} kept since the last update)"
            )
        self._acted = 0  # one update per rollout
        kept = [k[:, :steps].reshape(members, rows, -1) for k in self._kept]
        return [observations, *kept]

    @torch.no_grad()
    def gradients(
        self,
        observations: torch.Tensor,
        actions: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        mask: torch.Tensor,
        value_coef: torch.Tensor,
        entropy_coef: torch.Tensor,
    ) -> LossTerms:
        """Write every member's loss gradient into :attr:`grad`; return the loss terms.

        All ``[M, R, ...]``, member-major and time-major within, the rows of the last rollout:
        ``observations`` (the actor's inputs), ``actions``, ``advantages`` (as the policy loss
        uses them), the critic's targets ``returns``, ``mask`` (1 on valid rows);
        ``value_coef`` and ``entropy_coef`` ``[M]``. Needs the rollout's :meth:`act` calls and
        a :meth:`values` pass whose first R rows are these observations'.
        """
        if not self._critic_pass:
            raise RuntimeError("gradients() needs a values() pass over this rollout first")
        actor_pass = self._actor_pass(observations)  # (checks this rollout's act() passes)
        self.flat.grad = self.grad  # the buffer the views below write, whatever reset .grad
        rows = advantages.shape[1]
        weight = mask / mask.sum(1, keepdim=True).clamp(min=1.0)  # w_b / B_m
        critic_pass = [h[:, :rows] for h in self._critic_pass]
        self._critic_pass = []  # one update per pass
        values = critic_pass[-1].squeeze(-1)
        errors = returns - values
        grad_values = (-2.0 * value_coef[:, None]) * weight * errors
        _backward(self.critic, self._critic_grads, critic_pass, grad_values[..., None])
        out = actor_pass[-1]
        log_probs, entropy = log_probs_and_entropy(out, actions, self.log_std)
        if self.discrete:
            log_p = F.log_softmax(out, dim=-1)
            p = log_p.exp()
            grad_out = p * (log_p + entropy[..., None]) * entropy_coef[:, None, None]
            grad_out += p * advantages[..., None]
            grad_out.scatter_add_(2, actions.long()[..., None], -advantages[..., None])
            grad_out *= weight[..., None]
        else:
            inv_std = torch.exp(-self.log_std[:, None, :])  # [M, 1, A]
            u = (actions - out) * inv_std
            weighted = (weight * advantages)[..., None]
            grad_out = -weighted * u * inv_std
            grad_log_std = -(weighted * (u.square() - 1.0)).sum(1)
            grad_log_std -= (entropy_coef * weight.sum(1))[:, None]  # Σ_b w_b/B_m: 1, 0 if B_m = 0
            self._grad_log_std.copy_(grad_log_std)
        _backward(self.actor, self._actor_grads, actor_pass, grad_out)
        return LossTerms(
            policy=-(weight * advantages * log_probs).sum(1),
            value=(weight * errors.square()).sum(1),
            entropy=(weight * entropy).sum(1),
        )

    @torch.no_grad()
    def clip(self, max_norm: torch.Tensor, learning: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Clip each member's gradient norm to its ``max_norm [M]`` (inf: no clipping) by
        ``clip_grad_norm_``'s rule, and zero the rows of members not ``learning`` or whose norm
        is not finite (the optimizer leaves them out of its step,
        :meth:`~gae_core.agent.optim.Optimizer.step`). Returns (the norms before clipping,
        whether each is finite)."""
        norms = torch.linalg.vector_norm(self.grad, dim=1)
        finite = torch.isfinite(norms)
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        self.grad.mul_(coef[:, None])
        idle = ~(finite & learning)
        if bool(idle.any()):
            self.grad[idle] = 0.0
        return norms, finite
