"""M copies of one network shape as stacked tensors, and the per-member operations on them that
a population (:mod:`gae_core.agent.population`) needs: the forward pass (one ``baddbmm`` per
layer for all members), tanh fast on large activations, each member's gradient-norm clipping
and each member's explained variance over its own valid rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "TANH_VIA_SIGMOID_MIN",
    "TANH_VIA_SIGMOID_MIN_NO_GRAD",
    "StackedMLP",
    "clip_per_member",
    "explained_variance",
    "stacked_tanh",
]

#: Tensors of at least this many elements take :func:`stacked_tanh`'s sigmoid form when they
#: need a gradient (the custom autograd node has its own cost), and of at least
#: :data:`TANH_VIA_SIGMOID_MIN_NO_GRAD` when they do not (a rollout's forward pass).
TANH_VIA_SIGMOID_MIN = 32_768
TANH_VIA_SIGMOID_MIN_NO_GRAD = 8_192


class _TanhViaSigmoid(torch.autograd.Function):
    """tanh(x) = 2·σ(2x) − 1, computed in place in one buffer; the backward is tanh's own
    (1 − y²)·g from the saved output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _tanh_via_sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def _tanh_via_sigmoid(x: torch.Tensor) -> torch.Tensor:
    y = torch.mul(x, 2.0)
    torch.sigmoid(y, out=y)
    return y.mul_(2.0).sub_(1.0)


def stacked_tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh`` for a population's stacked activations, faster on large tensors.

    Written because it measured faster: on this project's 2-core AVX2 machine with torch 2.13
    (one thread) ``torch.tanh`` takes 3.3 ns per float32 element and ``torch.sigmoid`` 1.0 ns,
    so 2·σ(2x) − 1 in one buffer takes 0.40–0.59 of ``torch.tanh``'s time on a CartPole
    population's activations, and a whole population update runs 1.08× (the preset's 8 × 5
    rollouts) to 1.13× (16 × 64) faster (``benchmarks/bench_population.py``). The two agree
    to within 4e-7 (a few float32 ulps of 1; ``tests/test_population.py``). Tensors under
    :data:`TANH_VIA_SIGMOID_MIN` elements keep ``torch.tanh``: there the custom autograd node's
    overhead outweighs the gain. Without a gradient (a rollout's forward pass) the threshold
    is :data:`TANH_VIA_SIGMOID_MIN_NO_GRAD`: measured, in inference mode, 17,920 elements (the
    preset population's rollout activations) take 31 µs against ``torch.tanh``'s 58 µs, 8,192
    take 20 against 27, and 4,096 take 16 against 14."""
    if x.requires_grad and torch.is_grad_enabled():
        if x.numel() < TANH_VIA_SIGMOID_MIN:
            return torch.tanh(x)
        return _TanhViaSigmoid.apply(x)
    if x.numel() < TANH_VIA_SIGMOID_MIN_NO_GRAD:
        return torch.tanh(x)
    return _tanh_via_sigmoid(x)


class StackedMLP:
    """M copies of one MLP shape (e.g. the actors of a population's members) as stacked
    tensors: weights ``[M, fan_in, fan_out]``, biases ``[M, 1, fan_out]``, tanh between layers
    as in :class:`ActorCritic`'s networks (:func:`stacked_tanh`); one ``baddbmm`` per layer
    runs all M at once."""

    def __init__(self, nets: Sequence[nn.Sequential]) -> None:
        layers = [[m for m in net if isinstance(m, nn.Linear)] for net in nets]
        self.weights = [
            torch.stack([member[i].weight.detach().T for member in layers]).contiguous()
            for i in range(len(layers[0]))
        ]
        self.biases = [
            torch.stack([member[i].bias.detach()[None] for member in layers]).contiguous()
            for i in range(len(layers[0]))
        ]
        for p in self.parameters():
            p.requires_grad_(True)
        self.activation = stacked_tanh  # (a benchmark swaps in torch.tanh as its baseline)

    def parameters(self) -> list[torch.Tensor]:
        return [*self.weights, *self.biases]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, B, fan_in]`` → ``[M, B, fan_out]``."""
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                x = self.activation(x)
        return x

    def select(self, members: Sequence[int]) -> StackedMLP:
        """A detached copy of the given members' networks, in that order."""
        chosen = object.__new__(StackedMLP)
        chosen.activation = self.activation
        index = torch.as_tensor(list(members))
        with torch.no_grad():
            chosen.weights = [w[index] for w in self.weights]
            chosen.biases = [b[index] for b in self.biases]
        return chosen

    @staticmethod
    def concat(parts: Sequence[StackedMLP]) -> StackedMLP:
        """The members of several stacks (e.g. snapshots taken by :meth:`select` at different
        updates) as one stack, in order; detached."""
        joined = object.__new__(StackedMLP)
        joined.activation = parts[0].activation
        with torch.no_grad():
            layers = zip(*(p.weights for p in parts), strict=True)
            joined.weights = [torch.cat(ws) for ws in layers]
            layers = zip(*(p.biases for p in parts), strict=True)
            joined.biases = [torch.cat(bs) for bs in layers]
        return joined

    def copy_into(self, net: nn.Sequential, member: int) -> None:
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for layer, weight, bias in zip(linears, self.weights, self.biases, strict=True):
                layer.weight.copy_(weight[member].T)
                layer.bias.copy_(bias[member, 0])


def clip_per_member(
    params: Sequence[torch.Tensor], max_norm: torch.Tensor, learning: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip each member's global gradient norm (over every stacked parameter, member on the
    first axis) to its ``max_norm [M]`` (inf: no clipping), as ``torch.nn.utils.clip_grad_norm_``
    does for one network, and zero the gradient slices of members not ``learning [M]`` or whose
    norm is not finite (0 × NaN is NaN), so they take no step. Returns (the norms before
    clipping, whether each is finite)."""
    size = max_norm.shape[0]
    grads = [p.grad.reshape(size, -1) for p in params if p.grad is not None]
    norms = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads], dim=1), dim=1
    )  # [M], in the gradients' dtype, as clip_grad_norm_ computes it
    finite = torch.isfinite(norms)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    idle = ~(finite & learning)
    any_idle = bool(idle.any())
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad.dtype).view(size, *([1] * (p.grad.dim() - 1))))
            if any_idle:
                p.grad[idle] = 0.0
    return norms, finite


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """1 − Var(returns − values) / Var(returns) per member (``[M, R]`` → ``[M]``) over the rows
    where ``mask`` is 1; 0 where the returns do not vary."""
    safe = mask.sum(1).clamp(min=1.0)

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum(1) / safe
        return ((x - mean[:, None]).square() * mask).sum(1) / safe

    spread = variance(returns)
    ev = 1.0 - variance(returns - values) / torch.where(spread > 0, spread, 1.0)
    return torch.where(spread > 0, ev, torch.zeros_like(ev))
