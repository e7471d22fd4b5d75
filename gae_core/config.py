"""The one training configuration: a frozen, validated dataclass whose field metadata drives the
dashboard form, the CLI help and the saved run config."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from gae_core.envs import SUPPORTED_ENVS, env_id_problem

__all__ = ["ConfigError", "TrainConfig"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what it allows."""


def _field(default: Any, help: str, *, min=None, max=None, choices=None) -> Any:
    """A dataclass field whose metadata the dashboard reads (ENGINE.md, "Config")."""
    meta = {"help": help, "min": min, "max": max, "choices": choices}
    return field(default=default, metadata=meta)


# Defaults are tuned for wall time to solve CartPole-v1 (mean of the last 100 returns >= 475):
# seeds 0-19 all solved, median about 1.4 s on one core (benchmarks/bench_train.py). A larger
# batch than A2C's usual 8 x 5 with Adam and standardised advantages is what makes it robust;
# rollout_steps 32 with learning_rate 3e-3 solved 19 of 20 seeds.
@dataclass(frozen=True)
class TrainConfig:
    env_id: str = _field(
        "CartPole-v1",
        "Gymnasium id (classic control); other plain ids registered in this process also work",
        choices=tuple(SUPPORTED_ENVS),
    )
    num_envs: int = _field(16, "Parallel environments in the vector env", min=1, max=1024)
    rollout_steps: int = _field(
        64, "Steps per environment in each rollout; one update per rollout", min=1, max=4096
    )
    total_steps: int = _field(
        500_000, "Training budget in env steps (all envs together)", min=1, max=10**10
    )
    gamma: float = _field(0.99, "Discount γ", min=0.0, max=1.0)
    lambda_: float = _field(
        0.95, "GAE λ: 0 is the TD residual, 1 the Monte Carlo return", min=0.0, max=1.0
    )
    learning_rate: float = _field(5e-3, "Optimizer step size", min=1e-8, max=1.0)
    optimizer: str = _field("adam", "Optimizer", choices=("adam", "rmsprop"))
    value_coef: float = _field(0.5, "Weight of the value (critic) loss", min=0.0, max=100.0)
    entropy_coef: float = _field(0.0, "Weight of the entropy bonus", min=0.0, max=10.0)
    max_grad_norm: float = _field(
        0.5, "Clip the global gradient norm to this; 0 disables clipping", min=0.0, max=1e6
    )
    hidden_sizes: tuple[int, ...] = _field(
        (64, 64), "Hidden layer widths of the actor and of the critic (tanh)", min=1, max=4096
    )
    normalize_advantages: bool = _field(
        True, "Standardise advantages per update (not in the paper)"
    )
    seed: int = _field(0, "Seed for weights, env resets and action sampling", min=0, max=2**31 - 1)
    device: str = _field(
        "cpu", "Torch device ('cuda' only where available)", choices=("cpu", "cuda")
    )
    checkpoint_every: int = _field(
        50_000, "Save a checkpoint every this many env steps; 0 never", min=0, max=10**10
    )
    record_episodes: int = _field(
        2, "Evaluation episodes recorded at each checkpoint", min=0, max=100
    )
    torch_threads: int = _field(
        1,
        "torch.set_num_threads for the run (process-wide); 1 is fastest for small nets",
        min=1,
        max=256,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _check(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)  # normalised: int → float, list → tuple

    @property
    def batch_size(self) -> int:
        """Rows per update: ``num_envs * rollout_steps``."""
        return self.num_envs * self.rollout_steps

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples become lists); ``from_dict`` inverts it."""
        out = dataclasses.asdict(self)
        out["hidden_sizes"] = list(self.hidden_sizes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys raise ``ConfigError``, missing keys take defaults."""
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a dict, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(known)}")
        return cls(**data)


def _range_text(meta: dict[str, Any]) -> str:
    return f"[{meta['min']}, {meta['max']}]"


def _check(f: dataclasses.Field, value: Any) -> Any:
    """Validate one field's value; return it normalised or raise ``ConfigError``."""
    name, meta, kind = f.name, f.metadata, f.type
    if name == "env_id":
        problem = env_id_problem(value)
        if problem:
            raise ConfigError(f"env_id {problem}")
        return value
    if name == "hidden_sizes":
        return _check_hidden_sizes(value, meta)
    if name == "device":
        return _check_device(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if meta["choices"] is not None:
        if value not in meta["choices"]:
            raise ConfigError(f"{name} must be one of {list(meta['choices'])}, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"{name} must be an integer in {_range_text(meta)}, got {value!r}")
        value = int(value)
    else:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{name} must be a number in {_range_text(meta)}, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number in {_range_text(meta)}, got {value}")
    if not meta["min"] <= value <= meta["max"]:
        raise ConfigError(f"{name} must be in {_range_text(meta)}, got {value!r}")
    return value


def _check_hidden_sizes(value: Any, meta: dict[str, Any]) -> tuple[int, ...]:
    allowed = f"1 to 8 integers, each in {_range_text(meta)}"
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        raise ConfigError(f"hidden_sizes must be a tuple of {allowed}, got {value!r}")
    if not 1 <= len(value) <= 8 or not all(
        isinstance(v, numbers.Integral)
        and not isinstance(v, bool)
        and meta["min"] <= v <= meta["max"]
        for v in value
    ):
        raise ConfigError(f"hidden_sizes must be {allowed}, got {value!r}")
    return tuple(int(v) for v in value)


def _check_device(value: Any) -> str:
    if value == "cpu":
        return value
    if value == "cuda":
        import torch  # only when asked: the form can validate without loading CUDA

        if torch.cuda.is_available():
            return value
        raise ConfigError("device 'cuda' is not available on this machine; use 'cpu'")
    raise ConfigError(f"device must be one of ['cpu', 'cuda'], got {value!r}")


# The help strings double as the docstring: one line per field, no second copy to drift.
TrainConfig.__doc__ = "A2C+GAE training configuration (frozen; validated on construction).\n\n" + (
    "\n".join(f"{f.name}: {f.metadata['help']}" for f in dataclasses.fields(TrainConfig))
)
