"""gae_core: advantage estimators (δ_t, Â^(k), GAE(γ, λ)), an A2C and PPO trainer, a run store, and
the analyses behind the dashboard.

Layers (``docs/DESIGN.md``): :mod:`gae_core.estimators` (the math) ← :mod:`gae_core.agent`
(config, envs, trainer) ← :mod:`gae_core.runs` (store, run manager, sweeps) ←
:mod:`gae_core.insight` and :mod:`gae_core.lab` (what the pages show) ← :mod:`gae_core.cli`. The
top-level modules (:mod:`~gae_core.metrics`, :mod:`~gae_core.outcome`, :mod:`~gae_core.labels`,
:mod:`~gae_core.trajectory`, :mod:`~gae_core.inert`, :mod:`~gae_core.errors`) are the vocabulary
every layer shares. The library never imports Streamlit; ``app.py`` and ``pages/`` do.
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
from gae_core.version import __version__ as __version__

__all__ = [
    "discounted_returns",
    "estimator_weights",
    "gae",
    "gae_lambda_sweep",
    "k_step_advantages",
    "lambda_returns",
    "td_residuals",
]
