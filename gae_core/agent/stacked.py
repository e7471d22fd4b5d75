"""M copies of one network shape as stacked tensors, and the per-member operations on them that
the trainer (:mod:`gae_core.agent.trainer`) needs: the forward pass (one batched product per
layer for all members, fast for narrow layers too), tanh fast on large activations, each
member's gradient-norm clipping and each member's explained variance over its own valid
rows. The trainer (:mod:`gae_core.agent.trainer`) runs its passes on these stacks, M ≥ 1, and
the stacked evaluations and recordings (:mod:`gae_core.agent.played_together`) too."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = [
    "NARROW_FORWARD_ON_CPU",
    "NARROW_MAX",
    "TANH_VIA_SIGMOID_MIN",
    "TANH_VIA_SIGMOID_MIN_NO_GRAD",
    "TANH_VIA_SIGMOID_ON_CPU",
    "StackedMLP",
    "clip_per_member",
    "explained_variance",
    "host",
    "masked_moments",
    "one_buffer",
    "stacked_linear",
    "stacked_tanh",
    "tanh_via_sigmoid",
]

#: Tensors of at least this many elements take :func:`stacked_tanh`'s sigmoid form when they
#: need a gradient (the custom autograd node has its own cost), and of at least
#: :data:`TANH_VIA_SIGMOID_MIN_NO_GRAD` when they do not (a rollout's forward pass).
TANH_VIA_SIGMOID_MIN = 32_768
TANH_VIA_SIGMOID_MIN_NO_GRAD = 8_192

#: Whether torch runs its AVX-512 kernels on this machine's CPU. There ``torch.tanh`` and
#: ``torch.baddbmm`` into a narrow layer are the cheaper forms; on the AVX2 CPU where this
#: module's forms were written, they were the slower (``benchmarks/bench_population.py``;
#: figures in docs/PERFORMANCE.md). Fixed per machine, so a seed's run repeats itself there.
_AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")

#: Whether CPU tensors take the sigmoid form at all (not with AVX-512 kernels); CUDA tensors keep
#: the thresholds.
TANH_VIA_SIGMOID_ON_CPU = not _AVX512


def tanh_via_sigmoid(elements: int, device: torch.device, threshold: int) -> bool:
    """Whether activations of ``elements`` on ``device`` take tanh's sigmoid form
    (:func:`stacked_tanh`): from ``threshold`` elements, on a CPU where it is the cheaper
    (:data:`TANH_VIA_SIGMOID_ON_CPU`) or off the CPU."""
    return elements >= threshold and (TANH_VIA_SIGMOID_ON_CPU or device.type != "cpu")


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

    Computes tanh(x) = 2·σ(2x) − 1 in one buffer where ``torch.sigmoid`` is much cheaper per
    element than ``torch.tanh`` (an AVX2 CPU: measured in docs/PERFORMANCE.md, section
    "Hand-written forms and the measurements behind them"; not where torch runs AVX-512
    kernels, :data:`TANH_VIA_SIGMOID_ON_CPU`). The two agree to within 4e-7 (a few float32
    ulps of 1; ``tests/test_population.py``). Tensors under :data:`TANH_VIA_SIGMOID_MIN`
    elements keep ``torch.tanh``: there the custom autograd node's overhead outweighs the gain.
    Without a gradient (a rollout's forward pass) there is no node to pay for, so the threshold
    is the lower :data:`TANH_VIA_SIGMOID_MIN_NO_GRAD`."""
    if x.requires_grad and torch.is_grad_enabled():
        if not tanh_via_sigmoid(x.numel(), x.device, TANH_VIA_SIGMOID_MIN):
            return torch.tanh(x)
        return _TanhViaSigmoid.apply(x)
    if not tanh_via_sigmoid(x.numel(), x.device, TANH_VIA_SIGMOID_MIN_NO_GRAD):
        return torch.tanh(x)
    return _tanh_via_sigmoid(x)


#: Layers with at most this many outputs (a policy's logits or mean, the critic's value) take
#: :func:`stacked_linear`'s narrow forms.
NARROW_MAX = 8

#: Whether a narrow layer's product on CPU tensors takes the transposed form (not with AVX-512
#: kernels, where ``baddbmm`` is the cheaper; the gradients keep their narrow forms there too).
NARROW_FORWARD_ON_CPU = not _AVX512


class _NarrowLinear(torch.autograd.Function):
    """``bias + x @ weight`` for ``x [M, B, K]``, ``weight [M, K, N]`` with N ≤ NARROW_MAX: the
    gradients in the transposed forms :func:`stacked_linear` explains, the product too where
    :data:`NARROW_FORWARD_ON_CPU` (or off the CPU), else ``baddbmm``'s."""

    @staticmethod
    def forward(ctx, bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        if _transposed_here(x):
            return _narrow_forward(bias, x, weight)
        return torch.baddbmm(bias, x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_bias = grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_bias = grad.sum(1, keepdim=True)
        if ctx.needs_input_grad[1]:  # grad @ weightᵀ; one output: a broadcast product
            transposed = weight.transpose(1, 2)
            grad_x = grad * transposed if weight.shape[2] == 1 else torch.bmm(grad, transposed)
        if ctx.needs_input_grad[2]:  # (gradᵀ @ x)ᵀ
            grad_weight = torch.bmm(grad.transpose(1, 2), x).transpose(1, 2)
        return grad_bias, grad_x, grad_weight


def _transposed_here(x: torch.Tensor) -> bool:
    return NARROW_FORWARD_ON_CPU or x.device.type != "cpu"


def _narrow_forward(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out = torch.baddbmm(bias.transpose(1, 2), weight.transpose(1, 2), x.transpose(1, 2))
    return out.transpose(1, 2).contiguous()


def stacked_linear(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``torch.baddbmm(bias, x, weight)``: one linear layer of every member, ``x [M, B, K]`` →
    ``[M, B, N]``.

    MKL's batched product is slow when the output is narrow, so layers of at most
    :data:`NARROW_MAX` outputs compute the product as ``(weightᵀ @ xᵀ)ᵀ``, the weight gradient
    as ``(gradᵀ @ x)ᵀ`` and, with one output (the critic), the input gradient as a broadcast
    multiply: several times faster for a population's rows (docs/PERFORMANCE.md, section
    "Hand-written forms and the measurements behind them"). Where torch runs AVX-512 kernels,
    the product itself is ``baddbmm``'s, the cheaper there (:data:`NARROW_FORWARD_ON_CPU`).
    Wider layers keep ``baddbmm``, where the transposed forms gain nothing.
    ``tests/test_population.py`` checks values and gradients against ``baddbmm``'s."""
    if weight.shape[2] > NARROW_MAX or bias.dim() != 3 or bias.shape[1] != 1:
        return torch.baddbmm(bias, x, weight)  # (the narrow forms take one bias row each)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _NarrowLinear.apply(bias, x, weight)
    if _transposed_here(x):
        return _narrow_forward(bias, x, weight)
    return torch.baddbmm(bias, x, weight)


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
        # (benchmarks/bench_population.py swaps in torch.tanh and torch.baddbmm as baselines)
        self.activation, self.linear = stacked_tanh, stacked_linear

    def parameters(self) -> list[torch.Tensor]:
        return [*self.weights, *self.biases]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [M, B, fan_in]`` → ``[M, B, fan_out]``."""
        return self.with_features(x)[0]

    def with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the last layer's input (gSDE's features φ(s), detached)."""
        last = len(self.weights) - 1
        features = x
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            if i == last:
                features = x
            x = self.linear(bias, x, weight)
            if i < last:
                x = self.activation(x)
        return x, features.detach()

    def layers(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's input and the output, ``[x, h_1, …, out]``, without a graph: what
        :meth:`backward` needs (a rollout keeps its actor's, the update its critic's)."""
        outputs = [x]
        last = len(self.weights) - 1
        rows, device = x.shape[0] * x.shape[1], x.device
        # (a rollout's passes run in inference mode already: no second context to enter)
        with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
            for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
                wide = tanh_via_sigmoid(
                    rows * weight.shape[2], device, TANH_VIA_SIGMOID_MIN_NO_GRAD
                )
                if i < last and wide and self.activation is stacked_tanh:
                    # tanh(y) = 2σ(2y) − 1 with 2y from the product itself (×2 is exact) and
                    # the rest in place: three passes over one buffer (stacked_tanh's form)
                    x = torch.baddbmm(bias, x, weight, beta=2.0, alpha=2.0).sigmoid_()
                    x = x.mul_(2.0).sub_(1.0)
                else:
                    x = self.linear(bias, x, weight)
                    if i < last:
                        x = self.activation(x)
                outputs.append(x)
        return outputs

    @torch.no_grad()
    def backward(self, outputs: Sequence[torch.Tensor], grad: torch.Tensor) -> None:
        """Write ∂loss/∂W and ∂loss/∂b of every layer into the stacks' ``.grad`` (overwritten,
        not accumulated), from ``grad`` = ∂loss/∂out ``[M, B, N]`` and :meth:`layers`'s
        ``outputs`` on the same rows. For y = x W + b and h = tanh(y): ∂W = xᵀ ∂y,
        ∂b = Σ_rows ∂y, ∂x = ∂y Wᵀ, ∂y = ∂h ⊙ (1 − h²); narrow layers in
        :func:`stacked_linear`'s forms. ``tests/test_losses.py`` checks it against autograd."""
        for i in range(len(self.weights) - 1, -1, -1):
            x, weight, bias = outputs[i], self.weights[i], self.biases[i]
            if weight.grad is None:  # normal tensors, even when written in inference mode
                with torch.inference_mode(False):
                    weight.grad, bias.grad = torch.zeros_like(weight), torch.zeros_like(bias)
            narrow = weight.shape[2] <= NARROW_MAX
            if narrow:
                weight.grad.copy_(torch.bmm(grad.transpose(1, 2), x).transpose(1, 2))
            elif weight.grad.is_contiguous():  # one member: its rows of the buffer, in place
                torch.bmm(x.transpose(1, 2), grad, out=weight.grad)
            else:  # (into the members' strided rows, out= measured slower than a copy)
                weight.grad.copy_(torch.bmm(x.transpose(1, 2), grad))
            torch.sum(grad, 1, keepdim=True, out=bias.grad)
            if i > 0:
                transposed = weight.transpose(1, 2)
                grad = grad * transposed if weight.shape[2] == 1 else torch.bmm(grad, transposed)
                grad = torch.ops.aten.tanh_backward(grad, outputs[i])

    def to(self, device: torch.device) -> StackedMLP:
        """Move the stacks to ``device`` (in place; they stay leaves that need a gradient)."""
        with torch.no_grad():
            self.weights = [w.to(device).requires_grad_(True) for w in self.weights]
            self.biases = [b.to(device).requires_grad_(True) for b in self.biases]
        return self

    def copy_into(self, net: nn.Sequential, member: int) -> None:
        linears = [m for m in net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for layer, weight, bias in zip(linears, self.weights, self.biases, strict=True):
                layer.weight.copy_(weight[member].T.cpu())
                layer.bias.copy_(bias[member, 0].cpu())


def one_buffer(
    nets: Sequence[StackedMLP], log_std: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every member's parameters (the stacks of ``nets``, then ``log_std``) as rows of one
    tensor ``[M, P]`` (member m's P parameters in row m), and their gradients as rows of
    another: the stacks and the log-std become leaves that are views of the first, with
    ``.grad`` views of the second, so autograd (or a gradient written by hand) lands in one
    tensor. Each member's gradient norm is then one reduction over its row, clipping one
    multiply, the optimizer one tensor's step (written because it measured faster: 13 stacked
    tensors spent 0.6 ms of a CartPole population's 4.8 ms step in per-tensor clipping and
    optimizer ops). Returns the parameters, whose ``.grad`` is the gradient buffer, and the
    log-std's view (None without one); the stacks are replaced in place."""
    stacks = [stack for net in nets for stack in (net.weights, net.biases)]
    tensors = [t for stack in stacks for t in stack]
    if log_std is not None:
        tensors.append(log_std)
    members = tensors[0].shape[0]
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(members, -1) for t in tensors], 1)
    flat.grad = torch.zeros_like(flat)
    views, start = [], 0
    for t in tensors:
        size = t[0].numel()
        view = flat[:, start : start + size].view(t.shape).requires_grad_(True)
        view.grad = flat.grad[:, start : start + size].view(t.shape)
        views.append(view)
        start += size
    for stack in stacks:
        stack[:] = [views.pop(0) for _ in stack]
    return flat, (views.pop(0) if log_std is not None else None)


def host(x: torch.Tensor) -> np.ndarray:
    """``x`` as a NumPy array on the host, without a torch call where it is already there
    (a ``.cpu()`` and a ``.detach()`` are calls of a few µs each)."""
    if x.requires_grad:
        x = x.detach()
    return (x if x.device.type == "cpu" else x.cpu()).numpy()


def clip_per_member(
    params: Sequence[torch.Tensor], max_norm: np.ndarray, learning: np.ndarray
) -> tuple[torch.Tensor, np.ndarray]:
    """Clip each member's global gradient norm (over every stacked parameter, member on the
    first axis) to its ``max_norm [M]`` (float32; inf: no clipping), as
    ``torch.nn.utils.clip_grad_norm_`` does for one network, and zero the gradient slices of
    members not ``learning [M]`` (bool) or whose norm is not finite (0 × NaN is NaN; the
    optimizer leaves them out of its step, :meth:`~gae_core.agent.optim.Optimizer.step`).
    Returns (the norms before clipping, whether each is finite (NumPy)). The M numbers between
    the norms and the multiply are NumPy's, where they cost no torch dispatch."""
    size = len(max_norm)
    grads = [p.grad.reshape(size, -1) for p in params if p.grad is not None]
    if len(grads) == 1:  # one buffer (one_buffer): the norm of one norm is itself
        norms = torch.linalg.vector_norm(grads[0], dim=1)
    else:
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads], dim=1), dim=1
        )  # [M], in the gradients' dtype, as clip_grad_norm_ computes it
    values = host(norms)
    finite = np.isfinite(values)
    with np.errstate(all="ignore"):  # a norm of ∞ or NaN: its member is zeroed below
        coef = np.minimum(max_norm / (values + values.dtype.type(1e-6)), 1.0)
    coef = coef.astype(values.dtype, copy=False)
    idle = ~(finite & learning)
    scale = None
    if (coef != 1.0).any():  # one member: a number (no tensor to make), the same product
        scale = float(coef[0]) if size == 1 else torch.from_numpy(coef).to(norms.device)
    zeroed = torch.from_numpy(idle).to(norms.device) if idle.any() else None
    for p in params:
        if p.grad is not None:
            if isinstance(scale, float):
                p.grad.mul_(scale)
            elif scale is not None:
                p.grad.mul_(scale.view(size, *([1] * (p.grad.dim() - 1))))
            if zeroed is not None:
                p.grad[zeroed] = 0.0
    return norms, finite


def masked_moments(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (biased) variance per member (``[M, R]`` → ``[M]`` each) over the rows where
    ``mask`` is 1, in float64; 0 for a member without such a row. In NumPy on the host,
    where an update's few small statistics cost less than in torch (docs/PERFORMANCE.md)."""
    x, mask = np.asarray(x, np.float64), np.asarray(mask, np.float64)
    count = np.maximum(mask.sum(-1), 1.0)  # (x may stack several [M, R] on the left)
    mean = (x * mask).sum(-1) / count
    return mean, (np.square(x - mean[..., None]) * mask).sum(-1) / count


def explained_variance(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """1 − Var(returns − values) / Var(returns) per member (``[M, R]`` → ``[M]``, float64)
    over the rows where ``mask`` is 1 (:func:`masked_moments`); 0 where the returns do not
    vary."""
    returns = np.asarray(returns, np.float64)
    _, (spread, residual) = masked_moments(
        np.stack([returns, returns - np.asarray(values, np.float64)]), mask
    )
    varies = spread > 0
    return np.where(varies, 1.0 - residual / np.where(varies, spread, 1.0), 0.0)
