"""What trials a sweep makes: every combination of a grid (λ × seed × any config field) applied
to a base config, checked before anything is stored, and the trials' names (the sweep's name and
each trial's grid values)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from gae_core.agent.config import TrainConfig, field_spec
from gae_core.errors import ConfigError
from gae_core.inert import MAX_NAME_LENGTH, clean_name
from gae_core.labels import assignment

__all__ = [
    "check_sweep_name",
    "checked_name",
    "expand_grid",
    "grid_of",
    "hold_critic_target",
    "trial_name",
]


def grid_of(
    lambdas: Sequence[float] | None = None,
    seeds: Sequence[int] | None = None,
    **fields: Sequence[Any],
) -> dict[str, list[Any]]:
    """``{"lambda_": lambdas, "seed": seeds, **fields}`` without the empty entries (the order
    its trials expand in is :func:`expand_grid`'s, whatever the dict's)."""
    named = {"lambda_": lambdas, "seed": seeds}
    grid = {name: list(values) for name, values in named.items() if values is not None}
    return grid | {name: list(values) for name, values in fields.items()}


def axis_order(names: Sequence[str]) -> list[str]:
    """A grid's axes in the order its trials expand and are named in: λ first, the seed last
    (fastest), the others as given. One order however the grid was written (the sweep form,
    ``sweep --gammas`` or ``--grid``), so one study expands into the same trials in the same
    order, named alike and batched into the same populations (members of one population are
    not bit for bit the same trials batched otherwise)."""
    return sorted(names, key=lambda name: (name != "lambda_", name == "seed"))  # stable


def expand_grid(base: TrainConfig, grid: dict[str, Sequence[Any]]) -> list[TrainConfig]:
    """Every combination of the grid's values applied to ``base``, in :func:`axis_order` (the
    seed varies fastest).

    Raises ``ConfigError`` naming the grid field for an unknown field, an empty value list, a bad
    value or a duplicate (``1`` and ``1.0`` are the same λ), every axis's problem at once, one a
    line — before anything is started.
    """
    normalised: dict[str, list[Any]] = {}
    problems = []
    for name, values in grid.items():
        try:
            spec = field_spec(name)
        except ConfigError as exc:
            problems.append(f"sweep grid: {exc}")
            continue
        try:
            normalised[spec.name] = _axis_values(base, spec, list(values))
        except ConfigError as exc:
            problems.append(f"sweep grid {spec.name}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    names = axis_order(list(normalised))
    return [
        dataclasses.replace(base, **dict(zip(names, combo, strict=True)))
        for combo in itertools.product(*(normalised[n] for n in names))
    ] or [base]


def _axis_values(base: TrainConfig, spec: Any, values: list[Any]) -> list[Any]:
    """One axis's values as the config holds them; ConfigError for its first problem."""
    if not values:
        raise ConfigError("needs at least one value")
    checked = []
    for value in values:
        try:
            checked.append(getattr(dataclasses.replace(base, **{spec.name: value}), spec.name))
        except TypeError:
            raise ConfigError(f"cannot use {value!r}; expected {spec.allowed}") from None
    duplicates = [v for i, v in enumerate(checked) if v in checked[:i]]
    if duplicates:
        raise ConfigError(f"duplicate value {duplicates[0]!r} (each value may appear once)")
    return checked


def hold_critic_target(base: TrainConfig, grid: dict[str, Sequence[Any]]) -> TrainConfig:
    """A λ study varies the advantages' λ and nothing else: when λ is a grid axis and the base
    config lets the critic's target follow the advantage's λ, fix it at the base config's λ
    (``critic_target="fixed_lambda"``, ``critic_lambda=base.lambda_``), so the trial at the base
    λ is the preset run itself. Any other base is returned unchanged."""
    names = {field_spec(n).name for n in grid}
    if "lambda_" not in names or base.critic_target != "advantage_lambda":
        return base
    return dataclasses.replace(base, critic_target="fixed_lambda", critic_lambda=base.lambda_)


def check_sweep_name(name: str, base: TrainConfig, grid: dict[str, Sequence[Any]]) -> str:
    """``name`` as :func:`start_sweep` would store it (:func:`~gae_core.inert.clean_name`), or
    ``ValueError`` naming the field and its allowed length: a trial's name is the sweep's plus
    its grid values (``λ = 0.95 seed = 3``), and it must fit as well. Bad grid values raise
    ``ConfigError``."""
    return checked_name(name, expand_grid(base, grid), grid)


def checked_name(name: str, configs: Sequence[TrainConfig], grid: dict) -> str:
    """:func:`check_sweep_name` for the grid's expanded ``configs``."""
    name = clean_name(name, field="sweep name")
    longest = max(len(trial_name(name, c, grid)) - len(name) for c in configs)
    if len(name) + longest > MAX_NAME_LENGTH:
        raise ValueError(
            f"sweep name must be at most {MAX_NAME_LENGTH - longest} characters for this grid "
            f"(its trials' names add up to {longest} for their values), got {len(name)}"
        )
    return name


def trial_name(prefix: str, config: TrainConfig, grid: dict[str, Sequence[Any]]) -> str:
    """``prefix λ = 0.95 seed = 3``: the sweep's name and the trial's grid values."""
    names = axis_order([field_spec(n).name for n in grid])
    return " ".join([prefix, *(assignment(n, getattr(config, n)) for n in names)])
