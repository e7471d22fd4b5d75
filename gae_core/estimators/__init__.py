"""Advantage estimators as pure functions of arrays: δ_t, Â^(k), GAE(γ, λ), λ-returns and
discounted returns (see :mod:`gae_core.estimators.advantages` for the shared contract)."""

from gae_core.estimators._validate import TORCH_CPU_MAX_ELEMENTS
from gae_core.estimators.advantages import (
    discounted_returns,
    estimator_weights,
    gae,
    gae_lambda_sweep,
    k_step_advantages,
    lambda_returns,
    td_residuals,
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
