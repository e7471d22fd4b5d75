r"""Advantage estimators from Schulman et al., *High-Dimensional Continuous Control Using
Generalized Advantage Estimation* (arXiv:1506.02438, ICLR 2016), as pure functions of arrays.

Conventions shared by every function (see also ``shared/GUIDE.md``):

* Layout is time-major ``[T, N]``: T steps of N parallel environments; a 1-D ``[T]`` input is one
  environment. Row ``t`` describes the transition s_t → s_{t+1}.
* ``rewards[t]`` is r_t, ``values[t]`` is V(s_t), ``next_values[t]`` is V(s_{t+1}) of the *true*
  next observation: for a truncated step that is the final observation before the reset, never
  the reset observation.
* ``terminated[t]``: s_{t+1} is terminal, so nothing is bootstrapped at t.
  ``truncated[t]``: the episode was cut at t (time limit); the value of s_{t+1} is bootstrapped,
  but no recursion crosses into the next episode. ``done_t = terminated_t or truncated_t``.
  A step that is both counts as terminated.
* The end of the rollout is an implicit cut after row T−1: ``next_values[T-1]`` is bootstrapped
  there unless ``terminated[T-1]``.
* numpy arrays in → numpy arrays out; torch tensors in → torch tensors out on the same device
  (detached: these are targets, not part of a graph). float32 and float64 are kept as given
  (mixed inputs give the wider type). Inputs are never modified. Bad input raises
  ``ValueError`` naming the argument and what was expected.
* Backends: numpy arrays and large CPU tensors run compiled numba kernels (float64
  accumulation, imported on first use); tensors on an accelerator and CPU tensors of at most
  :data:`TORCH_CPU_MAX_ELEMENTS` elements (a training rollout) run a log-depth doubling scan
  in torch, in the tensors' dtype. Both are tested against the same references.

Where our indexing differs from the paper: the paper writes sums to infinity over one
episode; here every sum stops at the end of the segment that contains t (the first done step at
or after t, or row T−1), which is what makes the finite identities in the tests exact.
"""

from __future__ import annotations

import functools
import numbers
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Torch tensors with at most this many elements stay in torch on the CPU too (the doubling
#: scan of :mod:`gae_core._torch_scan`): a training rollout then never loads the numba
#: runtime, which costs a process about 125 MB of memory. Larger CPU tensors take the
#: compiled kernels (zero-copy), which win from a few hundred thousand elements on.
TORCH_CPU_MAX_ELEMENTS = 1 << 16


def _kernels():
    """The compiled kernels, imported on first use (numba is heavy to import)."""
    from gae_core import _kernels as kernels

    return kernels


__all__ = [
    "discounted_returns",
    "estimator_weights",
    "gae",
    "gae_lambda_sweep",
    "k_step_advantages",
    "lambda_returns",
    "td_residuals",
]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------- validation


def _torch():
    """The torch module if it has been imported by the caller, else None (never imports it)."""
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _check_unit_interval(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a real number in [0, 1], got {x!r}")
    x = float(x)
    if not (0.0 <= x <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {x!r}")
    return x


@dataclass
class _Batch:
    """Validated inputs as C-contiguous 2-D numpy arrays, and how to give results back."""

    arrays: dict[str, Any]  # numpy for the compiled kernels; torch tensors for the torch path
    dtype: Any
    one_dim: bool
    device: Any = None  # torch.device for tensor inputs, None for numpy
    in_torch: bool = False  # arrays are tensors: run the estimator in torch on their device

    @property
    def shape(self) -> tuple[int, int]:
        return next(iter(self.arrays.values())).shape

    def wrap(self, out: Any) -> Any:
        """Undo the 2-D view (``[..., T, 1]`` → ``[..., T]``) and return the caller's type."""
        if self.one_dim:
            out = out.reshape(out.shape[:-1])
        if self.device is None or self.in_torch:
            return out
        return _torch().from_numpy(out)


def _validate(
    floats: dict[str, Any], flags: dict[str, Any], *, allow_device: bool = False
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Common checks; returns the inputs (as numpy arrays or tensors) and the torch device."""
    named = {**floats, **flags}
    tensor_names = [k for k, v in named.items() if _is_tensor(v)]
    device = None
    if tensor_names:
        if len(tensor_names) != len(named):
            others = [k for k in named if k not in tensor_names]
            raise ValueError(
                f"{', '.join(tensor_names)} are torch tensors but {', '.join(others)} are not: "
                "pass all numpy arrays or all torch tensors"
            )
        devices = {v.device for v in named.values()}
        if len(devices) != 1:
            raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
        device = devices.pop()
    else:
        floats = {k: np.asarray(v) for k, v in floats.items()}
        flags = {k: np.asarray(v) for k, v in flags.items()}

    first_name, first = next(iter(floats.items()))
    shape = tuple(first.shape)
    if len(shape) not in (1, 2):
        raise ValueError(
            f"{first_name} must be 1-D [T] or 2-D time-major [T, N], got shape {shape}"
        )
    for name, value in named.items():
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{name} must have the same shape as {first_name} {shape}, got {tuple(value.shape)}"
            )

    torch = _torch()
    for name, value in floats.items():
        is_float = (
            value.dtype in (torch.float32, torch.float64)
            if device is not None
            else (value.dtype in _FLOAT_DTYPES)
        )
        if not is_float:
            raise ValueError(f"{name} must be float32 or float64, got dtype {value.dtype}")
    for name, value in flags.items():
        if device is not None:
            ok = value.dtype == torch.bool or (
                not value.is_complex() and bool(((value == 0) | (value == 1)).all())
            )
        else:
            ok = value.dtype == np.bool_ or (
                value.dtype.kind in "iuf" and bool(((value == 0) | (value == 1)).all())
            )
        if not ok:
            raise ValueError(f"{name} must be boolean or 0/1, got dtype {value.dtype}")
    return floats, flags, device


def _prepare(floats: dict[str, Any], flags: dict[str, Any], *, check_finite: bool = True) -> _Batch:
    """Validate and convert to C-contiguous 2-D numpy arrays for the compiled kernels.

    ``check_finite=False`` is for kernels that check finiteness in their own pass and then call
    :func:`_raise_non_finite`.
    """
    floats, flags, device = _validate(floats, flags)
    one_dim = next(iter(floats.values())).ndim == 1
    if device is not None and (
        device.type != "cpu" or _first_numel(floats) <= TORCH_CPU_MAX_ELEMENTS
    ):
        return _prepare_in_torch(floats, flags, device, one_dim)
    if device is not None:
        floats = {k: v.detach().cpu().numpy() for k, v in floats.items()}
        flags = {k: v.detach().cpu().numpy() for k, v in flags.items()}
    dtype = np.result_type(*floats.values())
    arrays: dict[str, np.ndarray] = {}
    for name, value in floats.items():
        value = np.ascontiguousarray(value, dtype=dtype)
        value = value.reshape(-1, 1) if one_dim else value
        arrays[name] = value
    if check_finite:
        _raise_non_finite(arrays, list(floats))
    for name, value in flags.items():
        value = value.view(np.uint8) if value.dtype == np.bool_ else (value != 0).view(np.uint8)
        value = np.ascontiguousarray(value)
        arrays[name] = value.reshape(-1, 1) if one_dim else value
    return _Batch(arrays, dtype, one_dim, device)


def _first_numel(arrays: dict[str, Any]) -> int:
    return next(iter(arrays.values())).numel()


def _prepare_in_torch(floats: dict, flags: dict, device: Any, one_dim: bool) -> _Batch:
    """Tensors that stay in torch: 2-D views, one float dtype, bool flags."""
    torch = _torch()
    dtype = functools.reduce(torch.promote_types, (v.dtype for v in floats.values()))
    arrays = {}
    for name, value in floats.items():
        value = value.detach().to(dtype)
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} must be finite, found NaN or infinite values")
        arrays[name] = value
    for name, value in flags.items():
        arrays[name] = value.detach() != 0
    if one_dim:
        arrays = {k: v.unsqueeze(-1) for k, v in arrays.items()}
    return _Batch(arrays, dtype, one_dim, device, in_torch=True)


def _on_device(batch: _Batch, estimator: str, **params: Any) -> Any:
    """Run ``estimator`` from :mod:`gae_core._torch_scan` on the tensors' own device."""
    from gae_core import _torch_scan  # imports torch, which the caller already has

    return getattr(_torch_scan, estimator)(**batch.arrays, **params)


def _raise_non_finite(arrays: dict[str, np.ndarray], names: list[str]) -> None:
    for name in names:
        if not _kernels().all_finite(arrays[name]):
            raise ValueError(f"{name} must be finite, found NaN or infinite values")


# --------------------------------------------------------------------------- estimators


def td_residuals(rewards, values, next_values, terminated, *, gamma: float):
    r"""TD residuals δ_t (paper eq. 9, with the termination mask):

    .. math:: δ_t = r_t + γ (1 − \mathrm{terminated}_t) V(s_{t+1}) − V(s_t)

    Truncation does not enter: a truncated step still bootstraps from ``next_values[t]``.

    Args:
        rewards: ``[T]`` or ``[T, N]`` float, r_t.
        values: same shape, V(s_t).
        next_values: same shape, V(s_{t+1}) of the true next observation.
        terminated: same shape, bool or 0/1.
        gamma: discount γ in [0, 1].

    Returns:
        δ with the shape of ``rewards``.
    """
    gamma = _check_unit_interval("gamma", gamma)
    batch = _prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated},
    )
    if batch.in_torch:
        return batch.wrap(_on_device(batch, "td_residuals", gamma=gamma))
    out = np.empty(batch.shape, dtype=batch.dtype)
    a = batch.arrays
    _kernels().td_residuals(
        a["rewards"], a["values"], a["next_values"], a["terminated"], gamma, out
    )
    return batch.wrap(out)


def gae(rewards, values, next_values, terminated, truncated, *, gamma: float, lambda_: float):
    r"""Generalized advantage estimates GAE(γ, λ) (paper eq. 16), by the backward recursion

    .. math::
        Â_t = δ_t + γλ (1 − \mathrm{done}_t) Â_{t+1}, \qquad Â_T = 0,

    with δ_t from :func:`td_residuals` and done_t = terminated_t or truncated_t. Unrolled, with
    L_t the number of steps left in t's segment (up to and including its first done step, or
    row T−1), it is the finite form of eq. 16:

    .. math::
        Â_t = \sum_{l=0}^{L_t−1} (γλ)^l δ_{t+l}
            = (1−λ) \sum_{k=1}^{L_t−1} λ^{k−1} Â^{(k)}_t + λ^{L_t−1} Â^{(L_t)}_t .

    λ = 0 gives δ_t; λ = 1 gives the bootstrapped discounted return minus V(s_t).

    Args:
        rewards, values, next_values: ``[T]`` or ``[T, N]`` float (see module docstring).
        terminated, truncated: same shape, bool or 0/1.
        gamma: discount γ in [0, 1].
        lambda_: λ in [0, 1].

    Returns:
        Advantages with the shape of ``rewards``.
    """
    gamma = _check_unit_interval("gamma", gamma)
    lambda_ = _check_unit_interval("lambda_", lambda_)
    batch = _prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
        check_finite=False,
    )
    if batch.in_torch:
        return batch.wrap(_on_device(batch, "gae", gamma=gamma, lambda_=lambda_))
    out = np.empty(batch.shape, dtype=batch.dtype)
    a = batch.arrays
    finite = _kernels().gae(
        a["rewards"], a["values"], a["next_values"], a["terminated"], a["truncated"],
        gamma, lambda_, out,
    )  # fmt: skip
    if not finite:
        _raise_non_finite(a, ["rewards", "values", "next_values"])
    return batch.wrap(out)


def lambda_returns(
    rewards, values, next_values, terminated, truncated, *, gamma: float, lambda_: float
):
    r"""λ-returns, the critic's regression target: :math:`G^λ_t = Â^{GAE(γ,λ)}_t + V(s_t)`.

    Same arguments as :func:`gae`; returns an array with the shape of ``rewards``.
    """
    advantages = gae(
        rewards, values, next_values, terminated, truncated, gamma=gamma, lambda_=lambda_
    )
    values = values if _is_tensor(values) else np.asarray(values)
    return advantages + values.detach() if _is_tensor(values) else advantages + values


def discounted_returns(rewards, next_values, terminated, truncated, *, gamma: float):
    r"""Reward-to-go, bootstrapped where an episode is cut:

    .. math::
        R_t = r_t + γ \begin{cases}
            0 & \text{terminated}_t \\
            V(s_{t+1}) & \text{truncated}_t \text{ or } t = T−1 \\
            R_{t+1} & \text{otherwise}
        \end{cases}

    so :math:`R_t = \sum_{l=0}^{L_t−1} γ^l r_{t+l} + γ^{L_t} (1 − \mathrm{terminated}_{t+L_t−1})
    V(s_{t+L_t})` with L_t the steps left in t's segment. Equals GAE(γ, λ=1) + V(s_t) when
    ``next_values[t] == values[t+1]`` inside every segment.

    Args:
        rewards: ``[T]`` or ``[T, N]`` float.
        next_values: same shape, V(s_{t+1}) (only read at cuts).
        terminated, truncated: same shape, bool or 0/1.
        gamma: discount γ in [0, 1].
    """
    gamma = _check_unit_interval("gamma", gamma)
    batch = _prepare(
        {"rewards": rewards, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    if batch.in_torch:
        return batch.wrap(_on_device(batch, "discounted_returns", gamma=gamma))
    out = np.empty(batch.shape, dtype=batch.dtype)
    a = batch.arrays
    _kernels().discounted_returns(
        a["rewards"], a["next_values"], a["terminated"], a["truncated"], gamma, out
    )
    return batch.wrap(out)


def _check_horizons(k: Any) -> tuple[list[int], bool]:
    def one(x: Any) -> int:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise ValueError(f"k must be an integer >= 1 (or a sequence of them), got {x!r}")
        if x < 1:
            raise ValueError(f"k must be >= 1, got {x}")
        return int(x)

    if isinstance(k, Sequence | np.ndarray) and not isinstance(k, str):
        ks = [one(x) for x in k]
        if not ks:
            raise ValueError("k must be a non-empty sequence of integers >= 1, got an empty one")
        return ks, True
    return [one(k)], False


def k_step_advantages(rewards, values, next_values, terminated, truncated, *, gamma: float, k):
    r"""k-step advantage estimators Â^(k) (paper eqs. 11–14):

    .. math::
        Â^{(k)}_t = \sum_{l=0}^{k−1} γ^l δ_{t+l},

    the sum stopping after the first done step at or after t (or row T−1). Inside a segment it
    telescopes to :math:`−V(s_t) + r_t + … + γ^{k−1} r_{t+k−1} + γ^k V(s_{t+k})`. Â^(1) = δ, and
    for k ≥ the segment length Â^(k) = GAE(γ, λ=1).

    Args:
        rewards, values, next_values, terminated, truncated: as :func:`gae`.
        gamma: γ in [0, 1].
        k: an integer ≥ 1, or a sequence of them.

    Returns:
        For an integer k, an array with the shape of ``rewards``; for a sequence of K horizons,
        ``[K, T, N]`` (or ``[K, T]``) in the order given.
    """
    gamma = _check_unit_interval("gamma", gamma)
    ks, stacked = _check_horizons(k)
    batch = _prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    if batch.in_torch:
        out = _on_device(batch, "k_step_advantages", gamma=gamma, ks=ks)
        return batch.wrap(out if stacked else out[0])
    a = batch.arrays
    deltas = np.empty(batch.shape, dtype=np.float64)
    _kernels().td_residuals(
        a["rewards"], a["values"], a["next_values"], a["terminated"], gamma, deltas
    )
    done = a["terminated"] | a["truncated"]
    unique = np.unique(np.asarray(ks, dtype=np.int64))
    table = np.empty((len(unique), *batch.shape), dtype=batch.dtype)
    _kernels().k_step(deltas, done, gamma, unique, table)
    out = table[np.searchsorted(unique, ks)]
    return batch.wrap(out if stacked else out[0])


def gae_lambda_sweep(rewards, values, next_values, terminated, truncated, *, gamma: float, lambdas):
    r"""GAE for many λ in one pass: ``out[i] = gae(..., lambda_=lambdas[i])``.

    δ_t is computed once per step and the L recursions of
    :math:`Â_t = δ_t + γλ_i (1 − \mathrm{done}_t) Â_{t+1}` advance together.

    Args:
        rewards, values, next_values, terminated, truncated: as :func:`gae`.
        gamma: γ in [0, 1].
        lambdas: a non-empty sequence of λ values, each in [0, 1].

    Returns:
        ``[L, T, N]`` (or ``[L, T]`` for 1-D inputs).
    """
    gamma = _check_unit_interval("gamma", gamma)
    if _is_tensor(lambdas):
        lambdas = lambdas.detach().cpu().tolist()
    lambda_list = list(np.asarray(lambdas, dtype=object).reshape(-1)) if np.ndim(lambdas) else None
    if lambda_list is None:
        raise ValueError(f"lambdas must be a sequence of numbers in [0, 1], got {lambdas!r}")
    if not lambda_list:
        raise ValueError("lambdas must be a non-empty sequence of numbers in [0, 1]")
    grid = np.array([_check_unit_interval("lambdas", x) for x in lambda_list], dtype=np.float64)
    batch = _prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    if batch.in_torch:
        return batch.wrap(_on_device(batch, "gae_lambda_sweep", gamma=gamma, lambdas=grid))
    out = np.empty((len(grid), *batch.shape), dtype=batch.dtype)
    a = batch.arrays
    _kernels().gae_sweep(
        a["rewards"], a["values"], a["next_values"], a["terminated"], a["truncated"],
        gamma, grid, out,
    )  # fmt: skip
    return batch.wrap(out)


def estimator_weights(lambda_: float, horizon: int) -> np.ndarray:
    r"""Weight of each k-step estimator Â^(k), k = 1..H, in GAE(γ, λ) at a step with H steps left
    in its segment (the finite form of paper eq. 16):

    .. math::
        w_k = (1−λ) λ^{k−1} \quad (k < H), \qquad w_H = λ^{H−1},

    so :math:`\sum_k w_k = 1` and :math:`Â^{GAE}_t = \sum_k w_k Â^{(k)}_t`. The last weight is the
    tail mass λ^{H−1} that piles up on the longest estimator near an episode's end (the paper's
    infinite sum puts it on Â^(k) for k ≥ H, which all equal Â^(H)). Uses 0^0 = 1.

    Args:
        lambda_: λ in [0, 1].
        horizon: H, an integer ≥ 1.

    Returns:
        float64 array of shape ``[H]``.
    """
    lambda_ = _check_unit_interval("lambda_", lambda_)
    if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    powers = lambda_ ** np.arange(int(horizon), dtype=np.float64)  # λ^(k−1), numpy gives 0**0 = 1
    weights = (1.0 - lambda_) * powers
    weights[-1] = powers[-1]
    return weights
