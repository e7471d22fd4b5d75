"""gae_core: advantage estimators (δ_t, Â^(k), GAE(γ, λ)), an A2C+GAE trainer, a run store.

The library never imports Streamlit; the dashboard in ``app.py`` and ``pages/`` imports it.
"""

from gae_core.estimators import (
    discounted_returns,
    estimator_weights,
    gae,
    gae_lambda_sweep,
    k_step_advantages,
    lambda_returns,
    td_residuals,
)

__all__ = [
    "discounted_returns",
    "estimator_weights",
    "gae",
    "gae_lambda_sweep",
    "k_step_advantages",
    "lambda_returns",
    "td_residuals",
]
__version__ = "0.1.0"
