"""What the estimator lab measures: :class:`LabSettings` (the per-state view) and
:class:`GradientSettings` (the gradient lens), every field validated, and the defaults of the
estimator grid (λ from 0 to 1 by 0.01, k by powers of two up to the segment). Light to import
(the CLI reads the defaults for its flags' help)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gae_core.agent.field_spec import int_problem

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_LAMBDAS",
    "HORIZON_TOLERANCE",
    "MAX_HORIZON",
    "GradientSettings",
    "LabSettings",
    "default_ks",
    "reference_problem",
]

#: The truth runs until γ^H is at most this, for at most MAX_HORIZON steps.
HORIZON_TOLERANCE = 1e-3
MAX_HORIZON = 5_000
DEFAULT_LAMBDAS = tuple(float(x) for x in np.round(np.linspace(0.0, 1.0, 101), 2))
DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def default_ks(segment: int) -> tuple[int, ...]:
    """:data:`DEFAULT_KS` below the segment length L, then L: a k past L reads the segment to
    its end, the same estimator as k = L (a given ``ks`` may still name such k)."""
    return tuple(sorted({min(k, segment) for k in DEFAULT_KS}))


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int, or ``ValueError`` naming ``name`` and its range (a bool, a float, a
    text a page could not read as a number are refused alike), worded as the config's fields
    are (:func:`~gae_core.agent.field_spec.int_problem`, the one owner)."""
    problem = int_problem(name, value, low, high)
    if problem:
        raise ValueError(problem)
    return int(value)


@dataclass(frozen=True)
class LabSettings:
    """What to measure; every field is validated (``ValueError`` naming it and its range)."""

    gamma: float = 0.99
    states: int = 64
    rollouts: int = 32
    continuations: int = 32
    segment: int = 500
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    ks: tuple[int, ...] | None = None  # None: default_ks(segment)
    horizon: int | None = None
    seed: int = 0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        # every problem of the numbers at once, one a line, each named as the lab's boxes name
        # it (N, M, K, L are the lab's notation; the CLI's flags are the first words)
        problems = []
        if isinstance(self.gamma, bool) or not 0.0 <= float(self.gamma) < 1.0:
            problems.append(
                f"γ (gamma) must be in [0, 1) (the truth is a discounted sum), got {self.gamma!r}"
            )
        for name, value, low, high in (
            ("states N", self.states, 1, 4096),
            ("truth rollouts M (rollouts)", self.rollouts, 2, 4096),
            ("continuations K", self.continuations, 2, 4096),
            ("segment L", self.segment, 1, 10_000),
            ("seed", self.seed, 0, 2**31 - 1),
            ("horizon", 1 if self.horizon is None else self.horizon, 1, 100_000),
        ):
            problems.append(int_problem(name, value, low, high))
        if any(problems):
            raise ValueError("\n".join(p for p in problems if p))
        lambdas = tuple(float(x) for x in self.lambdas)
        if not lambdas or any(not 0.0 <= x <= 1.0 for x in lambdas):
            raise ValueError(f"lambdas must be 1 or more values in [0, 1], got {self.lambdas!r}")
        given = default_ks(self.segment) if self.ks is None else self.ks
        ks = tuple(check_int("ks", k, 1, 10**6) for k in given)
        for name, values in (("lambdas", lambdas), ("ks", ks)):
            if repeated := sorted({v for v in values if values.count(v) > 1}):
                shown = ", ".join(f"{v:g}" for v in repeated)
                raise ValueError(f"{name} may not repeat a value, got {shown} more than once")
        if not 0.5 <= float(self.confidence) < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        object.__setattr__(self, "lambdas", lambdas)
        object.__setattr__(self, "ks", ks)
        object.__setattr__(self, "gamma", float(self.gamma))

    @property
    def truth_horizon(self) -> int:
        """H: the given horizon, else the smallest with γ^H ≤ 10⁻³ (at most 5,000)."""
        if self.horizon is not None:
            return self.horizon
        if self.gamma == 0.0:
            return 1
        return min(
            MAX_HORIZON, max(1, math.ceil(math.log(HORIZON_TOLERANCE) / math.log(self.gamma)))
        )

    def env_steps(self, states: int | None = None) -> int:
        """Env steps the measurement takes at most (sampling the states not counted)."""
        n = self.states if states is None else states
        return n * (2 * self.rollouts * self.truth_horizon + self.continuations * self.segment)


@dataclass(frozen=True)
class GradientSettings:
    """What the gradient lens measures: ``batches`` (K ≥ 2) batches of ``batch_size`` samples
    (a multiple of the run's env count; None: the run's envs × steps, the batch it trains on),
    a reference of at least ``reference`` samples (≥ the batch size), every λ of ``lambdas``
    and every k of ``ks``, discount ``gamma``; deterministic for a ``seed``."""

    gamma: float = 0.99
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    batches: int = 32
    batch_size: int | None = None
    reference: int = 500_000
    seed: int = 0
    confidence: float = 0.95
    resamples: int = 2000

    def __post_init__(self) -> None:
        # every problem at once, one a line, each named as the lab's boxes name it (the CLI's
        # flags are the first words: --batches, --batch-size, --reference, --seed)
        problems = []
        if isinstance(self.gamma, bool) or not 0.0 <= float(self.gamma) <= 1.0:
            problems.append(f"γ (gamma) must be in [0, 1], got {self.gamma!r}")
        if not self.lambdas or any(not 0.0 <= float(x) <= 1.0 for x in self.lambdas):
            problems.append(f"lambdas must be values in [0, 1], got {list(self.lambdas)}")
        if not self.ks or any(int(k) != k or k < 1 for k in self.ks):
            problems.append(f"ks must be integers ≥ 1, got {list(self.ks)}")
        size = 1 if self.batch_size is None else self.batch_size
        sizes = [int_problem("batch size", size, 1, 1_000_000),
                 int_problem("reference samples", self.reference, 1, 100_000_000)]  # fmt: skip
        problems += [int_problem("batches K", self.batches, 2, 10_000), *sizes,
                     int_problem("seed", self.seed, 0, 2**31 - 1)]  # fmt: skip
        if not any(sizes) and self.batch_size is not None:
            problems.append(reference_problem(self.reference, self.batch_size))
        if not 0.0 < self.confidence < 1.0:
            problems.append(f"confidence must be in (0, 1), got {self.confidence}")
        if self.resamples < 1:
            problems.append(f"resamples must be ≥ 1, got {self.resamples}")
        if any(problems):
            raise ValueError("\n".join(p for p in problems if p))

    @property
    def horizon(self) -> int:
        """H past the time limit for the reference's returns: γ^H ≤ 10⁻³ (≤ 5,000 steps)."""
        if self.gamma <= 0.0:
            return 1
        if self.gamma < 1.0:
            steps = math.ceil(math.log(HORIZON_TOLERANCE) / math.log(self.gamma))
            return min(MAX_HORIZON, max(1, steps))
        return MAX_HORIZON

    def estimators(self) -> list[tuple[str, float]]:
        """``(kind, parameter)`` of every estimator measured: GAE per λ, then Â^(k) per k."""
        return [("gae", float(x)) for x in self.lambdas] + [("k_step", float(k)) for k in self.ks]


def reference_problem(reference: int, size: int) -> str | None:
    """Why ``reference`` samples cannot be the reference for batches of ``size``, or None: the
    truth has at least as many samples as the batches measured against it."""
    if reference < size:
        return f"reference samples must be at least the batch size ({size:,}), got {reference:,}"
    return None
