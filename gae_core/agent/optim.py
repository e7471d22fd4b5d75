"""Adam and RMSprop with ``torch.optim``'s update rules, on torch's fused Adam kernel (the one
``torch.optim.Adam(fused=True)`` runs) wherever every stepping member takes one step size (and,
for Adam, is at one step count), otherwise on foreach kernels. RMSprop runs on the Adam kernel
as Adam with β1 = 0 and no bias correction (:meth:`Optimizer._step`): torch has no fused
RMSprop.

Why not ``torch.optim`` itself: it cannot step some members of a stacked parameter and leave the
others as they were (a population's members step as their single runs would, see
:class:`Optimizer`), and its first ``step`` goes through ``torch._disable_dynamo``, which imports
``torch._dynamo`` and sympy: seconds on every Start and on every sweep worker's first trial, and
tens of MB of peak memory (``python benchmarks/bench_optimizer.py`` measures both side by side;
figures in docs/PERFORMANCE.md, section "Hand-written forms and the measurements behind them").
``tests/test_trainer.py`` checks that the parameters match ``torch.optim`` step for step, for
both algorithms.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Optimizer"]

#: A step count at which Adam's bias corrections 1 − β^t round to exactly 1 for β = 0.99 (in
#: float32 and float64 alike: 0.99^(2^24) underflows to 0), so the fused Adam kernel runs
#: RMSprop; a power of two, exact as the kernel's float32 step tensor.
_UNCORRECTED = float(2**24)


class Optimizer:
    """Adam or RMSprop with ``torch.optim``'s update rules (eps 1e-5; RMSprop α = 0.99 as in
    SB3's A2C); see the module docstring for why it is not ``torch.optim``.

    For a population (parameters whose first dimension is its M members), :meth:`step` takes
    ``rows``: the members that step. Adam's bias correction counts each member's own steps,
    and the members in ``keep`` keep their parameters and moments, so every member steps as
    its single run's optimizer would, to float rounding (a run skips the update of a rollout
    without a valid row). Call it with ``rows`` every time or never.

    :attr:`learning_rate` is one step size, or (with ``rows``) each member's ``[M]``: members of
    a population on a linear schedule have spent different shares of their budgets (a reset
    row counts no step), and each decays by its own, as its single run does."""

    def __init__(
        self, params: list[torch.Tensor], kind: str, learning_rate: float | np.ndarray
    ) -> None:
        self.params, self.kind, self.learning_rate = params, kind, learning_rate
        self.eps, self.beta1, self.beta2, self.alpha = 1e-5, 0.9, 0.999, 0.99
        self.steps = 0
        self.row_steps: np.ndarray | None = None  # each member's steps, with ``rows``
        self.first_moments = [torch.zeros_like(p) for p in params]  # RMSprop: scratch
        self.second_moments = [torch.zeros_like(p) for p in params]
        # the fused kernel's step count, filled at each step: cheaper than a new tensor each
        # step (docs/PERFORMANCE.md, "PPO's epoch on an AVX-512 CPU")
        self._count = torch.zeros((), dtype=torch.float32, device=params[0].device)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(
        self,
        rows: np.ndarray | torch.Tensor | None = None,
        keep: np.ndarray | torch.Tensor | None = None,
    ) -> None:
        """One step of every parameter with a gradient. With ``rows`` (CPU bool ``[M]``), the
        members that step: only theirs count, and those in ``keep`` (default: every other
        member) are left as they were. A population passes the members that train on as
        ``keep``; an ended member's rows are not worth the copy (see the class docstring)."""
        self.steps += 1
        index = [i for i, p in enumerate(self.params) if p.grad is not None]
        if rows is None:
            self._step(index, self.steps)
            return
        rows = _numpy(rows)  # the bookkeeping in NumPy: no torch dispatch cost
        if self.row_steps is None:
            self.row_steps = np.zeros(len(rows), np.int64)
        self.row_steps += rows
        spare = ~rows if keep is None else _numpy(keep) & ~rows
        kept = []
        if spare.any():  # rare: a member without a valid row, or stopped by PPO's target_kl
            idle = torch.from_numpy(np.flatnonzero(spare)).to(self.params[0].device)
            moments = [self.second_moments] if self.kind == "rmsprop" else [
                self.first_moments, self.second_moments]  # fmt: skip
            for tensors in (self.params, *moments):
                kept += [(tensors[i], tensors[i].index_select(0, idle)) for i in index]
        counts = self.row_steps[rows]
        if len(counts) and counts.min() == counts.max():
            self._step(index, int(counts[0]))
        else:  # Adam's correction per member: members have taken different numbers of steps
            self._step(index, np.maximum(self.row_steps, 1))
        for tensor, saved in kept:
            tensor.index_copy_(0, idle, saved)

    def _step(self, index: list[int], steps: int | np.ndarray) -> None:
        params = [self.params[i] for i in index]
        grads = [p.grad for p in params]
        second = [self.second_moments[i] for i in index]
        per_row = isinstance(self.learning_rate, np.ndarray)
        if self.kind == "rmsprop" and not per_row:
            # RMSprop is Adam with β1 = 0 (m = g) and β2 = α, without bias correction: at the
            # step count _UNCORRECTED both corrections are exactly 1, so the fused Adam kernel
            # computes v ← αv + (1−α)g²; θ ← θ − lr·g / (√v + ε) in one pass over each tensor
            # instead of five (``python benchmarks/bench_optimizer.py``: about 2× on a
            # population's buffer). ``first_moments`` is its scratch for m (= g, never read).
            count = self._count.fill_(_UNCORRECTED)
            first = [self.first_moments[i] for i in index]
            torch._fused_adam_(
                params, grads, first, second, [], [count] * len(params),
                lr=float(self.learning_rate), beta1=0.0, beta2=self.alpha,
                weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False,
            )  # fmt: skip
            return
        if self.kind == "rmsprop":  # each member its own step size (a linear schedule)
            # v ← αv + (1−α)g²;  θ ← θ − lr·g / (√v + ε)
            torch._foreach_mul_(second, self.alpha)
            torch._foreach_addcmul_(second, grads, grads, value=1.0 - self.alpha)
            denominators = torch._foreach_sqrt(second)
            torch._foreach_add_(denominators, self.eps)
            for param, grad, denominator in zip(params, grads, denominators, strict=True):
                step = _by_row(-self.learning_rate, param)
                param.addcdiv_(grad * step, denominator)
            return
        # Adam: m ← β1·m + (1−β1)g;  v ← β2·v + (1−β2)g²;
        # θ ← θ − lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε)
        first = [self.first_moments[i] for i in index]
        if not isinstance(steps, np.ndarray) and not per_row:
            # every member at one step count and one step size: torch's fused Adam kernel (the
            # one torch.optim.Adam(fused=True) calls), one pass over each tensor instead of
            # seven (python benchmarks/bench_optimizer.py; docs/PERFORMANCE.md)
            count = self._count.fill_(float(steps))  # (the kernel reads it, never writes it)
            torch._fused_adam_(
                params, grads, first, second, [], [count] * len(params),
                lr=float(self.learning_rate), beta1=self.beta1, beta2=self.beta2,
                weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False,
            )  # fmt: skip
            return
        torch._foreach_lerp_(first, grads, 1.0 - self.beta1)
        torch._foreach_mul_(second, self.beta2)
        torch._foreach_addcmul_(second, grads, grads, value=1.0 - self.beta2)
        if isinstance(steps, np.ndarray) or per_row:  # per member: [M], broadcast by row
            t = np.asarray(steps, np.float64)
            correction1 = 1.0 - self.beta1**t
            correction2_sqrt = np.sqrt(1.0 - self.beta2**t)
            step_size = -np.asarray(self.learning_rate, np.float64) / correction1
            for param, m, v in zip(params, first, second, strict=True):
                shape = (-1,) + (1,) * (param.dim() - 1)
                denominator = (v.sqrt() / _by_row(correction2_sqrt, param, shape)).add_(self.eps)
                param.addcdiv_(m * _by_row(step_size, param, shape), denominator)
            return
        correction1 = 1.0 - self.beta1**steps
        correction2_sqrt = (1.0 - self.beta2**steps) ** 0.5
        denominators = torch._foreach_div(torch._foreach_sqrt(second), correction2_sqrt)
        torch._foreach_add_(denominators, self.eps)
        step_size = self.learning_rate / correction1
        torch._foreach_addcdiv_(params, first, denominators, value=-step_size)


def _numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """A CPU bool ``[M]`` as NumPy: an array as it is, a tensor through ``.numpy()``."""
    return x if isinstance(x, np.ndarray) else torch.as_tensor(x).numpy()


def _by_row(values: np.ndarray | float, param: torch.Tensor, shape: tuple | None = None):
    """Per-member ``values`` as a tensor that broadcasts over ``param``'s rows (its first
    dimension is the population's members); a scalar as it is."""
    if np.ndim(values) == 0:
        return float(values)
    shape = shape or (-1,) + (1,) * (param.dim() - 1)
    values = torch.from_numpy(np.ascontiguousarray(values))
    return values.to(param.device, param.dtype).view(shape)
