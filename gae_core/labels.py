"""Display labels: the one map from data names (config fields, table columns) to what people read.

Data keeps one spelling (``lambda_``, ``gamma``, ``env_id``) in the store, the CSV files and
``--json``; only what is drawn on screen goes through :func:`label` (a name alone) or
:func:`assignment` (``λ = 0.95``). Text that mentions λ, prose included, takes the symbol from
here (``tests/test_architecture.py`` looks for any other).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALGORITHMS", "LABELS", "MISSING", "algorithm_name", "assignment", "format_value", "label",
    "run_label", "stored_algo", "value_text",
]  # fmt: skip

#: A value not there (yet), as every table and sentence shows it: a run never solved, a return
#: before the first episode, an estimate with no data (a table's cell shows it, not "None").
MISSING = "–"

#: The algorithms' names as people write them (``TrainConfig.algo`` → name).
ALGORITHMS: dict[str, str] = {"a2c": "A2C", "ppo": "PPO"}


def algorithm_name(algo: Any) -> str:
    """``"ppo"`` → ``PPO``; several or unknown: ``A2C or PPO``."""
    return ALGORITHMS.get(algo, " or ".join(ALGORITHMS.values()))


def stored_algo(config: Mapping[str, Any]) -> str:
    """The algorithm a stored run's config trained with (``TrainConfig.algo``): a run stored
    before PPO joined has no ``algo`` and trained A2C."""
    return config.get("algo", "a2c")


def run_label(run: Any) -> str:
    """A run (a record with ``name``, ``id`` and ``config``) as every picker, legend and CSV
    names it: stable (no status: a label that changes under a selectbox resets it), unique (its
    id), with the algorithm where the name does not start with it (a store holds A2C and PPO
    runs)."""
    algo = algorithm_name(stored_algo(run.config))
    if run.name.startswith(f"{algo} "):
        return f"{run.name} · {run.id}"
    return f"{run.name} · {algo} · {run.id}"


LABELS: dict[str, str] = {
    "lambda_": "λ",
    "gamma": "γ",
    "env_id": "environment",
    "run_id": "run id",
    "env_steps": "env steps",
    "total_steps": "budget (env steps)",
    "best_return": "best return",
    "final_return": "final return",
    "auc": "AUC",
    "reward_threshold": "solved threshold",
    "solved_at_step": "solved at step",
    "fell_below_at_step": "fell below at step",
    "stayed_solved": "stayed solved",
    "wall_seconds": "duration (s)",
    "steps_per_second": "env steps/s",
    "sweep_id": "sweep",
    "created_at": "created",
    "started_at": "started",
    "critic_lambda": "critic target λ",
    "num_envs": "envs",
    "use_sde": "gSDE exploration",
    "ortho_init": "orthogonal init",
    "algo": "algorithm",
    "minibatch_size": "minibatch size (rows)",
    "n_epochs": "epochs per rollout",
}


def label(name: str) -> str:
    """``lambda_`` → ``λ``; unknown names read with spaces (``rollout_steps`` → ``rollout
    steps``)."""
    return LABELS.get(name, name.replace("_", " ").strip())


def format_value(value: Any) -> str:
    """A value as people read it: ``0.95``, ``500,000``, ``-1,234.5``, ``64x64``, ``True``
    (six significant digits, thousands separated)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        value = float(value)
        return f"{value:,.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, tuple | list):
        return "x".join(format_value(v).replace(",", "") for v in value)
    return str(value)


def value_text(field: str, value: Any) -> str:
    """A field's value as people read it (:func:`format_value`); an algorithm as its name
    (``PPO``, not ``ppo``)."""
    return format_value(algorithm_name(value) if field == "algo" and value in ALGORITHMS
                        else value)  # fmt: skip


def assignment(field: str, value: Any) -> str:
    """``λ = 0.95``: a field set to a value, in one format everywhere — a curve or a group of
    seeds in a comparison, a run's default name, a sweep trial's name, a chart's marker
    (:func:`value_text`: ``algorithm = PPO``)."""
    return f"{label(field)} = {value_text(field, value)}"
