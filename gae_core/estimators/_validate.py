"""Input checks and backend choice for :mod:`gae_core.estimators.advantages`.

Every public estimator validates its inputs here first: shapes, dtypes, flags, finiteness and
the scalar parameters; a bad input raises ``ValueError`` naming the argument, what it allows and
the offending value. The result is a :class:`Batch`: 2-D time-major arrays for one backend —
C-contiguous numpy for the compiled kernels, or tensors that stay on their device for the torch
scan — and how to hand results back in the caller's type.
"""

from __future__ import annotations

import functools
import numbers
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Torch tensors with at most this many elements stay in torch on the CPU too (the doubling
#: scan of :mod:`gae_core.estimators._torch_scan`): a training rollout then never loads the
#: numba runtime, which costs a process about 125 MB of memory. Larger CPU tensors take the
#: compiled kernels (zero-copy), which win from a few hundred thousand elements on. (``gae`` on
#: CPU tensors of at most ``_numpy_loop.LOOP_MAX_STEPS`` rows runs a NumPy loop instead.)
TORCH_CPU_MAX_ELEMENTS = 1 << 16

#: Largest horizon :func:`~gae_core.estimators.estimator_weights` builds (8 bytes each: 80 MB).
MAX_WEIGHTS_HORIZON = 10_000_000
#: Largest k-step horizon accepted (the int64 range the kernels index with); any k at or past a
#: segment's length gives the same value, GAE(λ = 1), so nothing larger is ever needed.
MAX_K = np.iinfo(np.int64).max

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def kernels():
    """The compiled kernels, imported on first use (numba is heavy to import)."""
    from gae_core.estimators import _kernels

    return _kernels


def torch_module():
    """The torch module if the caller has imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def check_unit_interval(name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name} must be a real number in [0, 1], got {x!r}")
    x = float(x)
    if not (0.0 <= x <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {x!r}")
    return x


def check_unit_columns(name: str, x: Any) -> float | np.ndarray:
    """A number in [0, 1], or one per column: a 1-D sequence (list, numpy array or tensor) of
    them, returned as float64 numpy (its length is checked against the data by
    :func:`column_parameter`)."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return check_unit_interval(name, x)
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    if not isinstance(x, list | tuple | np.ndarray):
        raise ValueError(
            f"{name} must be a real number in [0, 1] or one per column (a 1-D sequence), got {x!r}"
        )
    array = np.asarray(x)
    if array.ndim != 1 or array.dtype.kind not in "iuf" or array.size == 0:
        raise ValueError(
            f"{name} must be a real number in [0, 1] or a non-empty 1-D sequence of them (one "
            f"per column), got {x!r}"
        )
    array = array.astype(np.float64)
    bad = ~((array >= 0.0) & (array <= 1.0))  # NaN is bad too
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} must be in [0, 1], got {float(array[index])!r} at index {index}")
    return array


def column_parameter(name: str, value: float | np.ndarray, batch: Batch) -> Any:
    """A :func:`check_unit_columns` value for ``batch``'s backend: a float stays a float; one
    per column must match the N columns (1 for ``[T]`` data) and becomes a float64 array for
    the kernels, or a tensor of the data's dtype on its device for the torch scan."""
    if isinstance(value, float):
        return value
    columns = batch.shape[1]
    if value.shape[0] != columns:
        raise ValueError(
            f"{name} has {value.shape[0]} values but the data has {columns} column(s): give one "
            "per column, or a single number"
        )
    if batch.in_torch:
        return torch_module().as_tensor(value, dtype=batch.dtype, device=batch.device)
    return np.ascontiguousarray(value)


def check_horizons(k: Any) -> tuple[list[int], bool]:
    """``k`` as a list of horizons in [1, 2**63 − 1], and whether a sequence was given."""

    def one(x: Any) -> int:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise ValueError(f"k must be an integer >= 1 (or a sequence of them), got {x!r}")
        if not 1 <= x <= MAX_K:
            raise ValueError(f"k must be in [1, {MAX_K}] (int64), got {x}")
        return int(x)

    if isinstance(k, str | bytes):
        raise ValueError(f"k must be an integer >= 1 (or a sequence of them), got {k!r}")
    if isinstance(k, list | tuple | range | np.ndarray) or is_tensor(k):
        ks = [one(x) for x in (k.tolist() if hasattr(k, "tolist") else k)]
        if not ks:
            raise ValueError("k must be a non-empty sequence of integers >= 1, got an empty one")
        return ks, True
    return [one(k)], False


def check_horizon(horizon: Any) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral):
        raise ValueError(
            f"horizon must be an integer in [1, {MAX_WEIGHTS_HORIZON}], got {horizon!r}"
        )
    if not 1 <= horizon <= MAX_WEIGHTS_HORIZON:
        raise ValueError(f"horizon must be in [1, {MAX_WEIGHTS_HORIZON}], got {horizon}")
    return int(horizon)


@dataclass
class Batch:
    """Validated inputs as 2-D ``[T, N]`` arrays, and how to give results back."""

    arrays: dict[str, Any]  # numpy for the compiled kernels; torch tensors for the torch path
    dtype: Any
    one_dim: bool
    device: Any = None  # torch.device for tensor inputs, None for numpy
    in_torch: bool = False  # arrays are tensors: run the estimator in torch on their device

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(next(iter(self.arrays.values())).shape)

    def wrap(self, out: Any) -> Any:
        """Undo the 2-D view (``[..., T, 1]`` → ``[..., T]``) and return the caller's type."""
        if self.one_dim:
            out = out.reshape(out.shape[:-1])
        if self.device is None or self.in_torch:
            return out
        return torch_module().from_numpy(out)


def _as_array(name: str, value: Any) -> np.ndarray:
    """numpy view of an array-like (a list is converted); ValueError naming ``name`` if it is
    not a rectangular array of numbers or booleans."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name} must be a rectangular array of numbers: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"{name} must be an array of numbers or booleans, got dtype {array.dtype}"
            f" (first element {array.reshape(-1)[:1].tolist()!r})"
        )
    return array


def _first_bad_flag(name: str, value: Any, in_torch: bool) -> str | None:
    """Why ``value`` is not a valid 0/1 flag array, quoting the first offending element."""
    if in_torch:
        torch = torch_module()
        if value.dtype == torch.bool:
            return None
        if value.is_complex():
            return f"{name} must be boolean or 0/1, got dtype {value.dtype}"
        bad = ~((value == 0) | (value == 1))
        if not bool(bad.any()):
            return None
        index = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
        offending = value[index].item()
    else:
        if value.dtype == np.bool_:
            return None
        bad = ~((value == 0) | (value == 1))
        if not bad.any():
            return None
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        offending = value[index].item()
    return f"{name} must be boolean or 0/1, got {offending!r} at index {index}"


def _validate(
    floats: dict[str, Any], flags: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Common checks; returns the inputs (as numpy arrays or tensors) and the torch device."""
    named = {**floats, **flags}
    tensor_names = [k for k, v in named.items() if is_tensor(v)]
    device = None
    if tensor_names:
        if len(tensor_names) != len(named):
            others = [k for k in named if k not in tensor_names]
            raise ValueError(
                f"{', '.join(tensor_names)} are torch tensors but {', '.join(others)} are not: "
                "pass all numpy arrays (or lists) or all torch tensors"
            )
        devices = {v.device for v in named.values()}
        if len(devices) != 1:
            raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
        device = devices.pop()
    else:
        floats = {k: _as_array(k, v) for k, v in floats.items()}
        flags = {k: _as_array(k, v) for k, v in flags.items()}
        named = {**floats, **flags}

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

    torch = torch_module()
    for name, value in floats.items():
        is_float = (
            value.dtype in (torch.float32, torch.float64)
            if device is not None
            else (value.dtype in _FLOAT_DTYPES)
        )
        if not is_float:
            raise ValueError(f"{name} must be float32 or float64, got dtype {value.dtype}")
    for name, value in flags.items():
        problem = _first_bad_flag(name, value, device is not None)
        if problem:
            raise ValueError(problem)
    return floats, flags, device


def prepare(floats: dict[str, Any], flags: dict[str, Any], *, check_finite: bool = True) -> Batch:
    """Validate and convert for one backend (see the module docstring).

    ``check_finite=False`` is for kernels that check finiteness in their own pass and then call
    :func:`raise_non_finite`.
    """
    floats, flags, device = _validate(floats, flags)
    one_dim = next(iter(floats.values())).ndim == 1
    if device is not None and (
        device.type != "cpu" or next(iter(floats.values())).numel() <= TORCH_CPU_MAX_ELEMENTS
    ):
        return _prepare_in_torch(floats, flags, device, one_dim)
    if device is not None:
        floats = {k: v.detach().cpu().numpy() for k, v in floats.items()}
        flags = {k: v.detach().cpu().numpy() for k, v in flags.items()}
    dtype = np.result_type(*floats.values())
    arrays: dict[str, np.ndarray] = {}
    for name, value in floats.items():
        value = np.ascontiguousarray(value, dtype=dtype)
        arrays[name] = value.reshape(-1, 1) if one_dim else value
    if check_finite:
        raise_non_finite(arrays, list(floats))
    for name, value in flags.items():
        value = value.view(np.uint8) if value.dtype == np.bool_ else (value != 0).view(np.uint8)
        value = np.ascontiguousarray(value)
        arrays[name] = value.reshape(-1, 1) if one_dim else value
    return Batch(arrays, dtype, one_dim, device)


def _prepare_in_torch(floats: dict, flags: dict, device: Any, one_dim: bool) -> Batch:
    """Tensors that stay in torch: 2-D views, one float dtype, bool flags."""
    torch = torch_module()
    dtype = functools.reduce(torch.promote_types, (v.dtype for v in floats.values()))
    arrays = {}
    on_cpu = device.type == "cpu"
    for name, value in floats.items():
        value = value.detach()
        if value.dtype != dtype:
            value = value.to(dtype)
        # on the CPU numpy's check on a zero-copy view: a tenth of torch's dispatch cost
        finite = np.isfinite(value.numpy()).all() if on_cpu else torch.isfinite(value).all()
        if not bool(finite):
            raise ValueError(f"{name} must be finite, found NaN or infinite values")
        arrays[name] = value
    for name, value in flags.items():
        value = value.detach()
        arrays[name] = value if value.dtype == torch.bool else value != 0
    if one_dim:
        arrays = {k: v.unsqueeze(-1) for k, v in arrays.items()}
    return Batch(arrays, dtype, one_dim, device, in_torch=True)


def on_device(batch: Batch, estimator: str, **params: Any) -> Any:
    """Run ``estimator`` from :mod:`gae_core.estimators._torch_scan` on the tensors' device."""
    from gae_core.estimators import _torch_scan  # imports torch, which the caller already has

    return getattr(_torch_scan, estimator)(**batch.arrays, **params)


def raise_non_finite(arrays: dict[str, np.ndarray], names: list[str]) -> None:
    for name in names:
        if not kernels().all_finite(arrays[name]):
            raise ValueError(f"{name} must be finite, found NaN or infinite values")
