"""The one training configuration: a frozen, validated dataclass, and the field specs built from it.

``TrainConfig`` validates every value on construction (``ConfigError`` names the field and its
range). :func:`field_specs` turns its fields' metadata into :class:`FieldSpec` objects, the one
description that the dashboard form, the CLI flags and ``sweep --grid`` parsing all read: kind,
range, choices, help, label, flag names and how a value is typed as text."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gae_core.agent.envs import SUPPORTED_ENVS, discrete_actions, env_id_problem
from gae_core.agent.field_spec import FieldSpec, echo, int_problem, parse_int
from gae_core.errors import ConfigError, UnsupportedEnvError

__all__ = [
    "BOOKKEEPING_FIELDS",
    "FIELD_SPECS",
    "PPO_FIELDS",
    "STORED_BEFORE",
    "ConfigError",
    "FieldSpec",
    "TrainConfig",
    "field_problems",
    "field_spec",
    "parse_int",
    "scheduled",
    "stored_values",
    "with_stored_defaults",
]


def _field(default: Any, help: str, *, min=None, max=None, choices=None) -> Any:
    """A dataclass field whose metadata :func:`field_specs` reads."""
    meta = {"help": help, "min": min, "max": max, "choices": choices}
    return field(default=default, metadata=meta)


# Field defaults are plain A2C choices (advantages standardised, unlike SB3's A2C default;
# Adam); every supported env starts from its preset in
# gae_core/agent/presets.py (one table, measured in benchmarks/bench_presets.py), which is what
# the form, the CLI and the comparison use.
@dataclass(frozen=True)
class TrainConfig:
    algo: str = _field(
        "a2c",
        "Algorithm: A2C (one gradient step per rollout) or PPO (clipped surrogate, n_epochs "
        "passes over the rollout in minibatches of minibatch_size rows)",
        choices=("a2c", "ppo"),
    )
    env_id: str = _field(
        "CartPole-v1",
        "Gymnasium id (classic control or MuJoCo); other plain ids registered in this process "
        "also work",
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
    lr_schedule: str = _field(
        "constant",
        "Learning-rate schedule: constant, or linear decay to 0 at total_steps, at the env "
        "steps spent before each rollout (CleanRL's annealing; SB3's lin_ is a rollout lower)",
        choices=("constant", "linear"),
    )
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
        True,
        "Standardise advantages per update (A2C) or per minibatch (PPO, as SB3 and CleanRL); "
        "not in the paper",
    )
    normalize_observations: bool = _field(
        False,
        "Running mean/std normalisation of observations (SB3's VecNormalize: an episode's "
        "final observation is not counted); saved with each checkpoint and frozen on replay",
    )
    normalize_rewards: bool = _field(
        False,
        "Scale rewards by a running std of the discounted return (SB3's VecNormalize; "
        "reward_norm_reset picks where that return restarts) for learning; curves and "
        "recordings keep the env's own rewards",
    )
    reward_norm_reset: str = _field(
        "episode_end",
        "Where the discounted return that reward normalisation scales by restarts: at every "
        "episode end (SB3's VecNormalize, baselines) or only at termination (gymnasium's "
        "NormalizeReward: a truncated episode's return carries into the next)",
        choices=("episode_end", "termination"),
    )
    normalize_clip: float = _field(
        10.0,
        "Clip normalised observations and rewards to ±this, as SB3's VecNormalize (10); "
        "0 disables (runs stored before this field existed did not clip)",
        min=0.0,
        max=1e6,
    )
    critic_target: str = _field(
        "advantage_lambda",
        "The critic's regression target: λ-returns with the advantage's λ (SB3, CleanRL), or "
        "with critic_lambda of its own (fixed_lambda; 1.0 is the paper's discounted returns)",
        choices=("advantage_lambda", "fixed_lambda"),
    )
    critic_lambda: float = _field(
        1.0,
        "λ of the critic's target when critic_target is fixed_lambda (1.0: discounted returns "
        "bootstrapped at truncation and at the rollout end, paper eq. 28)",
        min=0.0,
        max=1.0,
    )
    n_epochs: int = _field(
        10,
        "PPO: passes over each rollout (SB3's n_epochs, CleanRL's update_epochs)",
        min=1,
        max=1000,
    )
    minibatch_size: int = _field(
        64,
        "PPO: rows per gradient step (SB3's batch_size), at most: an epoch splits a rollout's "
        "valid rows into minibatches as even as can be (agent/update.py); at most num_envs × "
        "rollout_steps",
        min=1,
        max=10**7,
    )
    clip_range: float = _field(
        0.2, "PPO: the surrogate's clip ε (ratio kept in [1 − ε, 1 + ε])", min=1e-6, max=10.0
    )
    clip_range_schedule: str = _field(
        "constant",
        "PPO: the clip range's schedule: constant, or linear decay to 0 at total_steps, at the "
        "env steps spent before each rollout (as lr_schedule)",
        choices=("constant", "linear"),
    )
    clip_range_vf: float = _field(
        0.0,
        "PPO: clip the critic's new values to ±this around the rollout's (SB3's "
        "clip_range_vf); 0 disables",
        min=0.0,
        max=1e6,
    )
    target_kl: float = _field(
        0.0,
        "PPO: stop a member's epochs once a minibatch's approximate KL exceeds 1.5 × this "
        "(SB3's target_kl); 0 disables",
        min=0.0,
        max=1e6,
    )
    log_std_init: float = _field(
        0.0, "Initial log-std of the Gaussian policy (continuous actions)", min=-5.0, max=2.0
    )
    ortho_init: bool = _field(
        True,
        "Orthogonal initialisation (gain √2 hidden layers, 0.01 policy head, 1 value head; "
        "zero biases); off: PyTorch's default Linear init, as SB3's ortho_init=False",
    )
    use_sde: bool = _field(
        False,
        "gSDE: state-dependent exploration for continuous actions (SB3's use_sde): noise is the "
        "actor's last hidden features times a random matrix drawn once per rollout and env; "
        "log_std_init is then that matrix's initial log-std",
    )
    sde_sample_freq: int = _field(
        -1,
        "gSDE: draw new exploration matrices every this many steps of a rollout; -1 (or 0) "
        "once per rollout (SB3's sde_sample_freq)",
        min=-1,
        max=10**6,
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
    eval_every: int = _field(
        0,
        "Run deterministic evaluation episodes (argmax / mean action) every this many env "
        "steps; 0 never",
        min=0,
        max=10**10,
    )
    eval_episodes: int = _field(5, "Episodes per deterministic evaluation", min=1, max=100)
    log_every: int = _field(
        1_000,
        "Store the update metrics (losses, gradient norm, learning rate, steps/s) once every "
        "this many env steps, each row the mean over the updates since the last; 0 every update",
        min=0,
        max=10**10,
    )
    torch_threads: int = _field(
        1,
        "CPU threads for the run's torch and NumPy BLAS kernels (process-wide); 1 is fastest "
        "for small nets",
        min=1,
        max=256,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = _check(f, getattr(self, f.name))
            object.__setattr__(self, f.name, value)  # normalised: int → float, list → tuple
        problem = _minibatch_problem(self.algo, self.minibatch_size, self.batch_size)
        if problem:
            raise ConfigError(problem)

    @property
    def batch_size(self) -> int:
        """Rows per update: ``num_envs * rollout_steps``."""
        return self.num_envs * self.rollout_steps

    @property
    def target_lambda(self) -> float:
        """λ of the critic's λ-return target (see ``critic_target``)."""
        return self.lambda_ if self.critic_target == "advantage_lambda" else self.critic_lambda

    def idle_fields(self, name: Callable[[str], str] = str) -> dict[str, str]:
        """The fields whose value changes nothing given the others, each with why (naming fields
        under ``name``: the form's label, the CLI's flag): two runs that differ only in these
        train alike (a comparison counts them neither as a confound nor as different runs)."""
        idle = {}
        if self.critic_target == "advantage_lambda":
            why = f"{name('critic_target')} is advantage_lambda (the critic follows λ)"
            idle["critic_lambda"] = why
        if not (self.normalize_observations or self.normalize_rewards):
            both = f"{name('normalize_observations')} nor {name('normalize_rewards')}"
            idle["normalize_clip"] = f"neither {both} is on"
        if not self.normalize_rewards:
            idle["reward_norm_reset"] = f"{name('normalize_rewards')} is off"
        if self.algo == "a2c":
            why = f"{name('algo')} is a2c (one gradient step per rollout, no clipping)"
            for field in PPO_FIELDS:
                idle[field] = why
        if discrete_actions(self.env_id):  # a categorical policy: no Gaussian to set up
            why = f"{self.env_id}'s actions are discrete"
            idle["log_std_init"] = idle["use_sde"] = idle["sde_sample_freq"] = why
        elif not self.use_sde:
            idle["sde_sample_freq"] = f"{name('use_sde')} is off"
        return idle

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples become lists); ``from_dict`` inverts it."""
        out = dataclasses.asdict(self)
        out["hidden_sizes"] = list(self.hidden_sizes)
        return out

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> TrainConfig:
        """:meth:`from_dict` for a config read back from the store: a field missing from it
        takes the value that gives the behaviour the run had (:data:`STORED_BEFORE`), not
        today's default; a run trained on ``cuda`` reads as ``cpu`` where there is no GPU."""
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a dict, got {type(data).__name__}")
        return cls.from_dict(stored_values(data))

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


#: Fields that only PPO reads.
PPO_FIELDS = (
    "n_epochs", "minibatch_size", "clip_range", "clip_range_schedule", "clip_range_vf", "target_kl",
)  # fmt: skip

#: Fields that decide where a run ran (device, threads) or what it records beside its training
#: (evaluations, checkpoints and their episodes, metric rows), not what it learns: evaluations
#: and recordings play on envs and generators of their own
#: (``test_deterministic_evaluation_is_repeatable_and_leaves_training_alone``). Runs that
#: differ only in these learn the same.
BOOKKEEPING_FIELDS = (
    "device", "torch_threads", "checkpoint_every", "record_episodes", "eval_every",
    "eval_episodes", "log_every",
)  # fmt: skip

#: Fields whose default is not the behaviour of runs stored before the field existed, with
#: the value that is (a run stored without ``normalize_clip`` never clipped; without
#: ``reward_norm_reset``, its return restarted at termination only).
STORED_BEFORE: dict[str, Any] = {"normalize_clip": 0.0, "reward_norm_reset": "termination"}


def scheduled(value: float, schedule: str, spent: int, total_steps: int) -> float:
    """``value`` (a learning rate, a clip range) once ``spent`` of ``total_steps`` env steps
    are spent: itself under ``"constant"``, or decayed linearly to 0 at ``total_steps`` under
    ``"linear"``: value · (1 − min(1, spent / total_steps)). The trainer passes the steps
    spent before the update's rollout, as CleanRL anneals; SB3's ``lin_`` schedules count
    that rollout too, so theirs sit one rollout's decay lower."""
    if schedule != "linear":
        return value
    return value * (1.0 - min(1.0, spent / total_steps))


def stored_values(data: dict[str, Any]) -> dict[str, Any]:
    """A stored config dict as :meth:`TrainConfig.from_stored` reads it, not yet checked:
    :func:`with_stored_defaults`, and a run trained on ``cuda`` as ``cpu`` where there is no
    GPU (where it ran, not what it learnt: it still opens and replays)."""
    data = with_stored_defaults(data)
    if data.get("device") == "cuda" and not _cuda_available():
        data = {**data, "device": "cpu"}
    return data


def with_stored_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A stored config dict with :data:`STORED_BEFORE`'s values for the fields it lacks (for
    readers that group or label runs by a field without building the config)."""
    return {**STORED_BEFORE, **data}


#: The fields of the one check that spans fields (a PPO minibatch within a rollout).
SPANNING_FIELDS = frozenset({"algo", "minibatch_size", "num_envs", "rollout_steps"})


def field_problems(values: dict[str, Any]) -> dict[str, str]:
    """Every field of ``values`` that :class:`TrainConfig` would refuse, each with the message
    it would raise (naming the field and what it allows), unknown keys included: a form shows
    them all at once, where building the config stops at the first. Empty when every field is
    valid. The one check that spans fields (a PPO minibatch within a rollout) is reported under
    ``minibatch_size``, where none of :data:`SPANNING_FIELDS` has a problem of its own."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    problems = {}
    for name, value in values.items():
        if name not in fields:
            problems[name] = _unknown_field(name)
            continue
        try:
            _check(fields[name], value)
        except ConfigError as error:
            problems[name] = str(error)
    merged = {f.name: f.default for f in dataclasses.fields(TrainConfig)} | values
    if not problems.keys() & SPANNING_FIELDS:
        rows = merged["num_envs"] * merged["rollout_steps"]
        problem = _minibatch_problem(merged["algo"], merged["minibatch_size"], rows)
        if problem:
            problems["minibatch_size"] = problem
    return problems


def _minibatch_problem(algo: object, minibatch_size: object, batch_size: object) -> str | None:
    """The one check that spans fields: a PPO minibatch cannot hold more rows than a rollout."""
    if algo == "ppo" and isinstance(minibatch_size, int) and isinstance(batch_size, int):
        if minibatch_size > batch_size:
            return (
                f"minibatch_size must be at most num_envs × rollout_steps = {batch_size} "
                f"for PPO, got {minibatch_size}"
            )
    return None


def _unknown_field(name: str) -> str:
    fields = ", ".join(f.name for f in dataclasses.fields(TrainConfig))
    return f"unknown config field {name!r}; fields: {fields}"


def _range_text(meta: dict[str, Any]) -> str:
    return f"[{meta['min']}, {meta['max']}]"


def _check(f: dataclasses.Field, value: Any) -> Any:
    """Validate one field's value; return it normalised or raise ``ConfigError``."""
    name, meta, kind = f.name, f.metadata, f.type
    if name == "env_id":
        problem = env_id_problem(value)
        if problem:
            raise UnsupportedEnvError(f"env_id {problem}")
        return value
    if name == "hidden_sizes":
        return _check_hidden_sizes(value, meta)
    if name == "device":
        return _check_device(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {echo(value)}")
        return value
    if meta["choices"] is not None:
        if value not in meta["choices"]:
            choices = ", ".join(map(str, meta["choices"]))
            raise ConfigError(f"{name} must be one of {choices}, got {echo(value)}")
        return value
    if kind == "int":  # the one wording of a whole number out of its range (field_spec's)
        problem = int_problem(name, value, meta["min"], meta["max"])
        if problem:
            raise ConfigError(problem)
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number in {_range_text(meta)}, got {echo(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number in {_range_text(meta)}, got {value}")
    if not meta["min"] <= value <= meta["max"]:
        raise ConfigError(f"{name} must be in {_range_text(meta)}, got {value!r}")
    return value


def _check_hidden_sizes(value: Any, meta: dict[str, Any]) -> tuple[int, ...]:
    allowed = f"1 to 8 integers, each in {_range_text(meta)}"
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list):
        raise ConfigError(f"hidden_sizes must be a tuple of {allowed}, got {echo(value)}")
    if not 1 <= len(value) <= 8 or not all(
        isinstance(v, numbers.Integral)
        and not isinstance(v, bool)
        and meta["min"] <= v <= meta["max"]
        for v in value
    ):
        raise ConfigError(f"hidden_sizes must be {allowed}, got {echo(value)}")
    return tuple(int(v) for v in value)


def _cuda_available() -> bool:
    import torch  # only when asked: the form can validate without loading CUDA

    return torch.cuda.is_available()


def _check_device(value: Any) -> str:
    if value == "cpu":
        return value
    if value == "cuda":
        if _cuda_available():
            return value
        raise ConfigError("device 'cuda' is not available on this machine; use 'cpu'")
    raise ConfigError(f"device must be one of ['cpu', 'cuda'], got {value!r}")


# The help strings double as the docstring: one line per field, no second copy to drift.
TrainConfig.__doc__ = "A2C or PPO with GAE (frozen; validated on construction).\n\n" + (
    "\n".join(f"{f.name}: {f.metadata['help']}" for f in dataclasses.fields(TrainConfig))
)


# ----------------------------------------------------------------------------- field specs


def _spec(f: dataclasses.Field) -> FieldSpec:
    default, meta = f.default, f.metadata
    if meta.get("choices"):
        kind = "choice"
    elif isinstance(default, bool):
        kind = "bool"
    elif isinstance(default, int):
        kind = "int"
    elif isinstance(default, float):
        kind = "float"
    elif isinstance(default, tuple):
        kind = "int_list"
    else:  # pragma: no cover - a new field type needs a widget and a parser
        raise TypeError(f"no field spec for {f.name} ({type(default).__name__})")
    return FieldSpec(
        name=f.name,
        kind=kind,
        default=default,
        help=meta.get("help", ""),
        min=meta.get("min"),
        max=meta.get("max"),
        choices=tuple(meta["choices"]) if meta.get("choices") else None,
    )


#: Every ``TrainConfig`` field's spec, in declaration order.
FIELD_SPECS: dict[str, FieldSpec] = {f.name: _spec(f) for f in dataclasses.fields(TrainConfig)}


def field_spec(name: str) -> FieldSpec:
    """The spec of field ``name`` (``lambda`` and ``env`` are accepted for ``lambda_`` and
    ``env_id``); ``ConfigError`` listing the fields otherwise."""
    key = name.strip().replace("-", "_")
    key = {"lambda": "lambda_", "env": "env_id"}.get(key, key)
    if key not in FIELD_SPECS:
        raise ConfigError(_unknown_field(name))
    return FIELD_SPECS[key]
