r"""Advantage estimators from Schulman et al., *High-Dimensional Continuous Control Using
Generalized Advantage Estimation* (arXiv:1506.02438, ICLR 2016), as pure functions of arrays.

Conventions shared by every function (the design contract: ``docs/DESIGN.md``):

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
  (mixed inputs give the wider type). Python lists are converted like ``np.asarray``. Inputs
  are never modified. Bad input raises ``ValueError`` naming the argument, what was expected
  and the offending value.
* Backends: numpy arrays and large CPU tensors run compiled numba kernels (float64
  accumulation, imported on first use); tensors on an accelerator and CPU tensors of at most
  :data:`TORCH_CPU_MAX_ELEMENTS` elements (a training rollout) run a log-depth doubling scan
  in torch, in the tensors' dtype, except that :func:`gae` on CPU tensors of at most
  ``LOOP_MAX_STEPS`` rows (a trainer's short rollout) runs a plain loop over t in NumPy
  (float64 accumulation). All are tested against the same references.

Where our indexing differs from the paper: the paper writes sums to infinity over one
episode; here every sum stops at the end of the segment that contains t (the first done step at
or after t, or row T−1), which is what makes the finite identities in the tests exact.
"""

from __future__ import annotations

import numpy as np

from gae_core.estimators import _numpy_loop
from gae_core.estimators._numpy_loop import LOOP_MAX_STEPS
from gae_core.estimators._validate import (
    TORCH_CPU_MAX_ELEMENTS,
    check_horizon,
    check_horizons,
    check_unit_columns,
    check_unit_interval,
    column_parameter,
    is_tensor,
    kernels,
    on_device,
    prepare,
    raise_non_finite,
    torch_module,
)

__all__ = [
    "TORCH_CPU_MAX_ELEMENTS",
    "discounted_returns",
    "estimator_weights",
    "gae",
    "gae_lambda_sweep",
    "k_step_advantages",
    "lambda_returns",
    "td_residuals",
]


# --------------------------------------------------------------------------- estimators


def td_residuals(rewards, values, next_values, terminated, *, gamma):
    r"""TD residuals δ_t (paper eq. 9, with the termination mask):

    .. math:: δ_t = r_t + γ (1 − \mathrm{terminated}_t) V(s_{t+1}) − V(s_t)

    Truncation does not enter: a truncated step still bootstraps from ``next_values[t]``.

    Args:
        rewards: ``[T]`` or ``[T, N]`` float, r_t.
        values: same shape, V(s_t).
        next_values: same shape, V(s_{t+1}) of the true next observation.
        terminated: same shape, bool or 0/1.
        gamma: discount γ in [0, 1], or one per column (a sequence of N numbers: column n
            uses ``gamma[n]``).

    Returns:
        δ with the shape of ``rewards``.
    """
    gamma = check_unit_columns("gamma", gamma)
    batch = prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated},
    )
    gamma = column_parameter("gamma", gamma, batch)
    if batch.in_torch:
        return batch.wrap(on_device(batch, "td_residuals", gamma=gamma))
    out = np.empty(batch.shape, dtype=batch.dtype)
    a = batch.arrays
    gammas = _per_column(gamma, batch)
    kernels().td_residuals(
        a["rewards"], a["values"], a["next_values"], a["terminated"], gammas, out
    )
    return batch.wrap(out)


def _per_column(value: float | np.ndarray, batch) -> np.ndarray:
    """A kernel's per-column parameter: float64 ``[N]``."""
    if isinstance(value, float):
        return np.full(batch.shape[1], value)
    return value


def gae(rewards, values, next_values, terminated, truncated, *, gamma, lambda_, validate=True):
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
        gamma: discount γ in [0, 1], or one per column (a sequence of N numbers).
        lambda_: λ in [0, 1], or one per column. Per-column values estimate a population of
            agents in one call (column n uses ``gamma[n]`` and ``lambda_[n]``), as if each
            column were estimated alone (equal up to float64 rounding: one column alone takes
            the kernels' four-steps-a-link chain).
        validate: False skips the checks for inputs right by construction, as
            ``validate_args=False`` does in ``torch.distributions``: the trainer's rollout
            (2-D CPU tensors of one float dtype without a graph, bool flags, γ and λ its
            configs checked, one float64 array per column). Only such a rollout of at most
            ``LOOP_MAX_STEPS`` rows skips them; any other input is checked all the same.
            Unchecked, a non-finite reward gives non-finite advantages instead of a
            ``ValueError``.

    Returns:
        Advantages with the shape of ``rewards``.
    """
    inputs = (rewards, values, next_values, terminated, truncated)
    if not validate and _trusted_short_rollout(*inputs):
        views = [x.numpy() for x in inputs]
        return torch_module().from_numpy(_numpy_loop.gae(*views, gamma=gamma, lambda_=lambda_))
    return _gae(
        rewards, values, next_values, terminated, truncated, gamma, lambda_, plus_values=False
    )


def _trusted_short_rollout(rewards, values, next_values, terminated, truncated) -> bool:
    """``gae(validate=False)``'s loop path: 2-D CPU tensors of at most ``LOOP_MAX_STEPS`` rows,
    the floats of one dtype and without a graph, the flags bool (attribute reads only: the
    shapes, values and γ and λ are the caller's promise)."""
    torch = torch_module()
    floats, flags = (values, next_values), (terminated, truncated)
    return (
        is_tensor(rewards)
        and rewards.ndim == 2
        and rewards.device.type == "cpu"
        and rewards.shape[0] <= LOOP_MAX_STEPS
        and all(is_tensor(x) and x.dtype == rewards.dtype and not x.requires_grad for x in floats)
        and all(is_tensor(x) and x.dtype == torch.bool for x in flags)
        and not rewards.requires_grad
    )


def _gae(rewards, values, next_values, terminated, truncated, gamma, lambda_, *, plus_values):
    """:func:`gae`, or with ``plus_values`` :func:`lambda_returns` (added in the kernel's pass)."""
    gamma = check_unit_columns("gamma", gamma)
    lambda_ = check_unit_columns("lambda_", lambda_)
    batch = prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
        check_finite=False,
    )
    if batch.in_torch and batch.device.type == "cpu" and batch.shape[0] <= LOOP_MAX_STEPS:
        column_parameter("gamma", gamma, batch)  # checks only: the loop takes float64 numpy
        column_parameter("lambda_", lambda_, batch)
        views = {name: tensor.numpy() for name, tensor in batch.arrays.items()}
        out = torch_module().from_numpy(_numpy_loop.gae(**views, gamma=gamma, lambda_=lambda_))
    elif batch.in_torch:
        gamma = column_parameter("gamma", gamma, batch)
        lambda_ = column_parameter("lambda_", lambda_, batch)
        out = on_device(batch, "gae", gamma=gamma, lambda_=lambda_)
    else:
        gamma = column_parameter("gamma", gamma, batch)
        lambda_ = column_parameter("lambda_", lambda_, batch)
        out = np.empty(batch.shape, dtype=batch.dtype)
        a = batch.arrays
        finite = kernels().gae(
            a["rewards"], a["values"], a["next_values"], a["terminated"], a["truncated"],
            _per_column(gamma, batch), _per_column(lambda_, batch), plus_values, out,
        )  # fmt: skip
        if not finite:
            raise_non_finite(a, ["rewards", "values", "next_values"])
        return batch.wrap(out)
    if plus_values:
        out = out + batch.arrays["values"]
    return batch.wrap(out)


def lambda_returns(rewards, values, next_values, terminated, truncated, *, gamma, lambda_):
    r"""λ-returns, the critic's regression target: :math:`G^λ_t = Â^{GAE(γ,λ)}_t + V(s_t)`.

    Same arguments as :func:`gae` (γ and λ may be one per column); returns an array with the
    shape of ``rewards``.
    """
    return _gae(
        rewards, values, next_values, terminated, truncated, gamma, lambda_, plus_values=True
    )


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
    gamma = check_unit_interval("gamma", gamma)
    batch = prepare(
        {"rewards": rewards, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    if batch.in_torch:
        return batch.wrap(on_device(batch, "discounted_returns", gamma=gamma))
    out = np.empty(batch.shape, dtype=batch.dtype)
    a = batch.arrays
    kernels().discounted_returns(
        a["rewards"], a["next_values"], a["terminated"], a["truncated"], gamma, out
    )
    return batch.wrap(out)


def k_step_advantages(rewards, values, next_values, terminated, truncated, *, gamma: float, k):
    r"""k-step advantage estimators Â^(k) (paper eqs. 11–14):

    .. math::
        Â^{(k)}_t = \sum_{l=0}^{k−1} γ^l δ_{t+l},

    the sum stopping after the first done step at or after t (or row T−1). Inside a segment it
    telescopes to :math:`−V(s_t) + r_t + … + γ^{k−1} r_{t+k−1} + γ^k V(s_{t+k})`. Â^(1) = δ, and
    for k ≥ the segment length Â^(k) = GAE(γ, λ=1).

    Cost is linear in T for any k: with S_t = GAE(γ, λ=1)_t the full segment sum from t and L_t
    the steps left in t's segment,

    .. math::
        Â^{(k)}_t = S_t − γ^k S_{t+k} \quad (k < L_t), \qquad Â^{(k)}_t = S_t \quad (k ≥ L_t).

    Args:
        rewards, values, next_values, terminated, truncated: as :func:`gae`.
        gamma: γ in [0, 1].
        k: an integer in [1, 2**63 − 1], or a sequence of them.

    Returns:
        For an integer k, an array with the shape of ``rewards``; for a sequence of K horizons,
        ``[K, T, N]`` (or ``[K, T]``) in the order given.
    """
    gamma = check_unit_interval("gamma", gamma)
    ks, stacked = check_horizons(k)
    batch = prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
    )
    if batch.in_torch:
        out = on_device(batch, "k_step_advantages", gamma=gamma, ks=ks)
        return batch.wrap(out if stacked else out[0])
    a = batch.arrays
    deltas = np.empty(batch.shape, dtype=np.float64)
    kernels().td_residuals(
        a["rewards"], a["values"], a["next_values"], a["terminated"], _per_column(gamma, batch),
        deltas,
    )  # fmt: skip
    done = a["terminated"] | a["truncated"]
    # horizons past T all equal S_t: clamp them so the kernel's int64 arithmetic cannot overflow
    clamped = [min(x, max(batch.shape[0], 1)) for x in ks]
    ks = clamped
    unique = np.unique(np.asarray(ks, dtype=np.int64))
    table = np.empty((len(unique), *batch.shape), dtype=batch.dtype)
    kernels().k_step(deltas, done, gamma, unique, table)
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
    gamma = check_unit_interval("gamma", gamma)
    if is_tensor(lambdas):
        lambdas = lambdas.detach().cpu().tolist()
    lambda_list = list(np.asarray(lambdas, dtype=object).reshape(-1)) if np.ndim(lambdas) else None
    if lambda_list is None:
        raise ValueError(f"lambdas must be a sequence of numbers in [0, 1], got {lambdas!r}")
    if not lambda_list:
        raise ValueError("lambdas must be a non-empty sequence of numbers in [0, 1]")
    grid = np.array([check_unit_interval("lambdas", x) for x in lambda_list], dtype=np.float64)
    batch = prepare(
        {"rewards": rewards, "values": values, "next_values": next_values},
        {"terminated": terminated, "truncated": truncated},
        check_finite=False,
    )
    if batch.in_torch:
        return batch.wrap(on_device(batch, "gae_lambda_sweep", gamma=gamma, lambdas=grid))
    out = np.empty((len(grid), *batch.shape), dtype=batch.dtype)
    a = batch.arrays
    finite = kernels().gae_sweep(
        a["rewards"], a["values"], a["next_values"], a["terminated"], a["truncated"],
        gamma, grid, out,
    )  # fmt: skip
    if not finite:
        raise_non_finite(a, ["rewards", "values", "next_values"])
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
        horizon: H, an integer in [1, 10_000_000] (the array is built in memory).

    Returns:
        float64 array of shape ``[H]``.
    """
    lambda_ = check_unit_interval("lambda_", lambda_)
    horizon = check_horizon(horizon)
    powers = lambda_ ** np.arange(horizon, dtype=np.float64)  # λ^(k−1), numpy gives 0**0 = 1
    weights = (1.0 - lambda_) * powers
    weights[-1] = powers[-1]
    return weights
