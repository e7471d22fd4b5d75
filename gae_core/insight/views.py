"""What the dashboard pages show that is not a chart, without Streamlit: the config form's
validation, a run's status line, progress and ETA, and filtering of the runs table.

Pages stay thin: they draw widgets from :data:`gae_core.agent.config.FIELD_SPECS`, call
:func:`build_config` and show what it returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gae_core import metrics as M
from gae_core.agent.config import FIELD_SPECS, FieldSpec, TrainConfig, field_problems, parse_int
from gae_core.agent.field_spec import echo, int_problem
from gae_core.agent.presets import preset_values
from gae_core.errors import ConfigError
from gae_core.labels import MISSING, format_value, label
from gae_core.outcome import SOLVED_WINDOW
from gae_core.runs.sweep import MOST_WORKERS
from gae_core.storage.records import RunRecord
from gae_core.storage.store import RunStore

__all__ = [
    "DEFAULT_SEEDS_PER_LAMBDA",
    "MAIN_FIELDS",
    "MOST_WORKERS",
    "SEEDS_PER_LAMBDA",
    "build_config",
    "config_warnings",
    "field_message",
    "filter_runs",
    "form_name",
    "form_specs",
    "format_duration",
    "parse_float_list",
    "progress",
    "spacing",
    "status_text",
    "sweep_seeds",
    "typed_count",
    "whole_number",
    "workers_after_switch",
    "workers_range",
]

#: Fields shown first in the form; the rest go under "Advanced".
MAIN_FIELDS = (
    "algo", "env_id", "total_steps", "gamma", "lambda_", "seed", "num_envs", "rollout_steps",
)  # fmt: skip


def form_specs(exclude: tuple[str, ...] = ()) -> tuple[list[FieldSpec], list[FieldSpec]]:
    """``(main, advanced)`` field specs for the form, main ones in :data:`MAIN_FIELDS` order."""
    specs = [s for s in FIELD_SPECS.values() if s.name not in exclude]
    order = {name: i for i, name in enumerate(MAIN_FIELDS)}
    main = sorted((s for s in specs if s.name in order), key=lambda s: order[s.name])
    return main, [s for s in specs if s.name not in order]


def build_config(values: dict[str, Any]) -> tuple[TrainConfig | None, list[str], list[str]]:
    """Validate form values: ``(config or None, errors, warnings)``.

    Fields the form leaves out (the λ comparison's λ and seed) come from the preset of the env
    and algorithm. Text values (an integer or a list typed into a text box: ``"1,000"``,
    ``"64, 64"``) are read with the field's own parser. Errors make the
    config unusable (the Start button stays disabled); there is one per invalid field, all at
    once, each naming the field as the form labels it (:func:`field_message`). Warnings explain
    combinations that are valid but probably not what the user wants.
    """
    env_id = values.get("env_id", FIELD_SPECS["env_id"].default)
    algo = values.get("algo", FIELD_SPECS["algo"].default)
    values = {**preset_values(env_id, algo), **values}
    unread = {}
    for name, value in values.items():
        values[name], problem = read_field(name, value)
        if problem is not None:
            unread[name] = problem
    problems = {**field_problems({k: v for k, v in values.items() if k not in unread}), **unread}
    if problems:
        main, advanced = form_specs()
        order = [s.name for s in main + advanced]  # the form's order, unknown keys last
        named = sorted(problems, key=lambda n: order.index(n) if n in order else len(order))
        return None, [field_message(n, problems[n]) for n in named], []
    try:
        config = TrainConfig(**values)
    except ConfigError as error:  # (field_problems checks what this does; kept as a guard)
        return None, [str(error)], []
    return config, [], config_warnings(config)


def read_field(name: str, value: Any) -> tuple[Any, str | None]:
    """A form value as its field takes it: text in an integer field read with the field's own
    parser (``"1,000"``, ``"64, 64"``), and why it cannot be read (None where it can)."""
    spec = FIELD_SPECS.get(name)
    if spec is not None and spec.kind in ("int", "int_list") and isinstance(value, str):
        try:
            return spec.parse(value), None
        except ConfigError as error:
            return value, str(error)
    return value, None


def whole_number(text: str) -> int | str:
    """An integer a page read as text (a browser's number box refuses a value past 2^53 with a
    red mark and never sends it): any size, ``1,000`` or ``1_000`` too; the text itself when it
    is no integer, for the settings it goes to to refuse with the field's name and range."""
    try:
        return parse_int(text)
    except ValueError:
        return str(text)


def typed_count(name: str, text: str, low: int, high: int) -> tuple[int | None, list[str]]:
    """A whole number typed into a box with a range (the sweep launcher's seeds per λ and
    workers): ``(value, [])``, or ``(None, [message])`` naming the box ``name`` and its range in
    the words of every whole number (:func:`~gae_core.agent.field_spec.int_problem`)."""
    value = whole_number(text)
    problem = int_problem(name, value, low, high)
    return (None, [problem]) if problem else (value, [])


#: The sweep launcher's seeds per λ, the fewest and the most, and a new study's (bootstrap
#: intervals need about 10 seeds per group to rank the groups).
SEEDS_PER_LAMBDA, DEFAULT_SEEDS_PER_LAMBDA = (1, 100), 10


def workers_range(backend: str, cores: int) -> tuple[int, int]:
    """The fewest and most workers a sweep on ``backend`` may have: on this machine (``local``)
    one per core at most; with Ray, up to :data:`MOST_WORKERS` tasks at once."""
    return 1, min(cores, MOST_WORKERS) if backend == "local" else MOST_WORKERS


def workers_after_switch(text: str, backend: str | None, cores: int) -> str:
    """The workers box's text after a switch to ``backend`` (None: ``local``): a number past
    the most it allows (back from Ray, more than this machine's cores) becomes that most;
    other text stays, for the box to name if it is wrong."""
    _, most = workers_range(backend or "local", cores)
    value = whole_number(text)
    return str(most) if isinstance(value, int) and value > most else text


def sweep_seeds(first: str, count: int) -> tuple[range, list[str]]:
    """The seeds of a sweep's ``count`` replicates from the first seed typed as text
    (``"1,000"``: 1000 to 1000 + count − 1), and the errors that block its launch, each naming
    the first seed and the range it allows (empty seeds with one)."""
    spec, lambda_ = FIELD_SPECS["seed"], label("lambda_")
    start = whole_number(first)
    if problem := int_problem("first seed", start, spec.min, spec.max):
        return range(0), [problem]
    seeds = range(start, start + count)
    if seeds[-1] > spec.max:
        return range(0), [
            f"first seed + seeds per {lambda_} − 1 must be at most {spec.max:,} (the largest "
            f"seed), got {seeds[-1]:,}"
        ]
    return seeds, []


def form_name(name: str) -> str:
    """A field as the form's messages name it: its label, with the field's name (what the CLI
    and the CSVs use) where the label is another word: ``envs (num_envs)``, ``budget (env
    steps, total_steps)``, ``rollout steps``."""
    shown = label(name)
    if shown.replace(" ", "_") == name:
        return shown
    if shown.endswith(")"):
        return f"{shown[:-1]}, {name})"
    return f"{shown} ({name})"


def field_message(name: str, message: str) -> str:
    """A field's error as the form shows it, under :func:`form_name` (``envs (num_envs) must
    be …``); a message that does not start with the field's name is left as it is."""
    if not message.startswith(name):
        return message
    return f"{form_name(name)}{message[len(name) :]}"


def config_warnings(
    config: TrainConfig, name: Callable[[str], str] = form_name, idle: bool = True
) -> list[str]:
    """What ``config`` will do that its user may not expect (a budget under one update,
    checkpoints or evaluations past it, no recordings, …), each field under ``name`` (the
    form's :func:`form_name`; the CLI's flag); with ``idle``, also each field set away from
    its default to no effect (:meth:`TrainConfig.idle_fields`; the CLI says those of the
    flags given)."""
    warnings = []
    budget = name("total_steps")
    if config.batch_size > config.total_steps:
        warnings.append(
            f"{budget} ({config.total_steps:,}) is smaller than one update "
            f"({name('num_envs')} × {name('rollout_steps')} = "
            f"{config.batch_size:,}): the run will do one update."
        )
    if config.checkpoint_every and config.checkpoint_every > config.total_steps:
        warnings.append(
            f"{name('checkpoint_every')} ({config.checkpoint_every:,}) exceeds "
            f"{budget} ({config.total_steps:,}): only the final checkpoint will be saved, so "
            "the explorer will have one checkpoint to compare."
        )
    if config.eval_every and config.eval_every >= config.total_steps:
        warnings.append(
            f"{name('eval_every')} ({config.eval_every:,}) is not below "
            f"{budget} ({config.total_steps:,}): "
            "the policy is evaluated once, at the end of the budget (one point on the "
            "evaluation chart)."
        )
    if config.record_episodes == 0:
        warnings.append(
            f"{name('record_episodes')} is 0: no trajectories for the advantage explorer."
        )
    default = TrainConfig()
    for field, why in config.idle_fields(name).items() if idle else ():
        value = getattr(config, field)
        if value != getattr(default, field):  # set on purpose, to no effect
            warnings.append(f"{name(field)} = {format_value(value)} has no effect: {why}.")
    if config.gamma == 1.0 and config.lambda_ == 1.0:
        warnings.append(
            f"{name('gamma')} and {name('lambda_')} both 1: undiscounted Monte Carlo "
            "advantages, the highest-variance setting."
        )
    return warnings


# ----------------------------------------------------------------------------- run state


#: How many checkpoints and evaluations :func:`spacing` spreads over a short budget.
SPACED_CHECKPOINTS, SPACED_EVALUATIONS = 4, 10


def spacing(config: TrainConfig) -> dict[str, int]:
    """``checkpoint_every`` and ``eval_every`` spread over a budget too short for them (the
    cases :func:`config_warnings` names): :data:`SPACED_CHECKPOINTS` checkpoints (the explorer
    and the lab compare an early one with a late one) and :data:`SPACED_EVALUATIONS`
    evaluations, each at least one update apart; empty where nothing is short. A field set to
    0 (off on purpose) is left alone."""
    total, update = config.total_steps, config.batch_size
    spaced = {}
    if config.checkpoint_every and config.checkpoint_every > total:
        spaced["checkpoint_every"] = max(update, total // SPACED_CHECKPOINTS)
    if config.eval_every and config.eval_every >= total:
        spaced["eval_every"] = max(update, total // SPACED_EVALUATIONS)
    return spaced


def _steps(value: int | None) -> str:
    return MISSING if value is None else format_value(int(value))


def status_text(run: RunRecord, window_from: int | None = None) -> str:
    """One line a user reads: the state and, where it applies, how it ended (solved at which
    step and whether it stayed there), the error, or why it stopped. ``window_from``: the env
    step where the final return's window of episodes starts (:func:`final_window_start`), said
    with it: on a short budget the last 100 episodes reach far back."""
    if run.damaged:
        return f"damaged: {run.damaged}"
    summary = run.summary
    if run.status == "failed":
        reason = (run.error or "unknown error").strip().splitlines()
        return f"failed: {reason[-1] if reason else 'unknown error'}"
    if run.status in ("queued", "running"):
        return run.status
    if run.never_started:  # a sweep cancelled before its turn
        return "stopped before it started"
    head = {
        "finished": "finished",
        "stopped": f"stopped at step {run.env_steps:,}",
        # what it had reached is kept and said, as a stopped run's is
        "interrupted": f"interrupted at step {run.env_steps:,} (its process ended before the "
        "run did; the data up to then is kept)",
    }.get(run.status, run.status)
    final = summary.final_return
    # the mean of the last episodes, not the last one the chart ends on: say so
    last = min(summary.episodes, SOLVED_WINDOW)
    since = "" if window_from is None else f", from step {window_from:,}"
    tail = (
        ""
        if final is None
        else f"; final return {final:.1f} (mean of the last {last} episodes{since})"
    )
    state = summary.solved_state
    if state is None:
        return head + tail
    if state == "no":
        return f"{head}: not solved{tail}"
    solved = f"solved at {_steps(summary.solved_at_step)}"
    if state == "stayed":
        return f"{head}: {solved}, stayed solved{tail}"
    if state == "dipped":
        return (
            f"{head}: {solved}, dipped below at {_steps(summary.fell_below_at_step)} and "
            f"recovered{tail}"
        )
    return f"{head}: {solved}, fell below at {_steps(summary.fell_below_at_step)}{tail}"


def final_window_start(store: RunStore, run: RunRecord) -> int | None:
    """The env step of the first episode in the window the final return averages (the last
    ``SOLVED_WINDOW`` episodes, :mod:`gae_core.outcome`), or None without episodes."""
    returns = store.metrics(run.id, [M.EPISODIC_RETURN.key])
    if returns.empty:
        return None
    return int(returns["env_step"].iloc[-min(len(returns), SOLVED_WINDOW)])


def progress(run: RunRecord, rate: float | None = None) -> tuple[float, float | None]:
    """``(fraction done in [0, 1], seconds left or None)``: the one rule for a run's progress
    (the sidebar, the Train and Runs pages). A queued run is at 0 with no ETA. The ETA divides
    the steps left by ``rate``, the run's measured env steps/s (:func:`measured_rate`); a run
    that has measured none yet (its first rows are not logged) has no ETA: its average since
    it started would count the worker's start-up and read far too long."""
    total = run.total_steps or 1
    fraction = min(1.0, max(0.0, run.env_steps / total)) if run.status != "queued" else 0.0
    if run.status != "running" or run.env_steps <= 0 or rate is None or not rate > 0:
        return fraction, None
    return fraction, max(0.0, total - run.env_steps) / rate


def steps_text(run: RunRecord) -> str:
    """A run's env steps against its budget, "12,000 / 30,000 env steps"; past the budget, which
    a run ends within ``num_envs`` − 1 steps of (its last vector step finishes every env, and
    reset rows do not count), it says so instead of a count over its total."""
    if run.env_steps > run.total_steps:
        return (
            f"{run.env_steps:,} env steps (budget {run.total_steps:,}: the last vector step "
            "finishes every env)"
        )
    return f"{run.env_steps:,} / {run.total_steps:,} env steps"


#: The live charts that redraw at the page's live pace; the others (losses, entropy, explained
#: variance, speed, length) change once per :data:`DIAGNOSTICS_EVERY_S` of the run's clock.
WATCHED = frozenset({M.EPISODIC_RETURN.key})
#: Seconds of a live run's clock between changes of its diagnostic charts.
DIAGNOSTICS_EVERY_S = 5.0


def live_snapshot(metrics: pd.DataFrame, every_s: float = DIAGNOSTICS_EVERY_S) -> pd.DataFrame:
    """A live run's metric rows as its charts draw them: the :data:`WATCHED` keys whole, the
    others up to the last multiple of ``every_s`` in the run's clock (``wall_time``), so their
    figures stay identical between those instants and a live page sends them as references
    that the browser does not redraw. A key none of whose rows are that old yet keeps them all
    (a young run's charts appear at once); a row whose time is not finite is kept. The CSVs
    read the store, not this."""
    clock = metrics["wall_time"]
    finite = np.isfinite(clock)
    if not finite.any():
        return metrics
    cutoff = math.floor(float(clock[finite].max()) / every_s) * every_s
    young = clock.where(finite).groupby(metrics["key"]).transform("min") > cutoff
    # a row without a finite time cannot be placed: drawn as it is, not dropped
    keep = metrics["key"].isin(WATCHED) | (clock <= cutoff) | young | ~finite
    return metrics[keep]


#: How far back :func:`measured_rate` looks for the run's last logged rate (env steps).
RATE_LOOKBACK_STEPS = 20_000


def measured_rate(store: RunStore, run: RunRecord) -> float | None:
    """A running run's recent env steps/s, or None: over its last ``RATE_LOOKBACK_STEPS``
    of logged rows, env steps gained over wall time passed (flushes and evaluations included,
    a worker's start-up not); with one row only, the rate it logged (``perf/steps_per_second``,
    the updates' own, which leaves flushes and evaluations out; a population member's own)."""
    if run.status != "running":
        return None
    since = max(0, run.env_steps - RATE_LOOKBACK_STEPS)
    rows = store.metrics(run.id, [M.STEPS_PER_SECOND.key], since_step=since)
    if len(rows) >= 2:
        steps = float(rows["env_step"].iloc[-1] - rows["env_step"].iloc[0])
        wall = float(rows["wall_time"].iloc[-1] - rows["wall_time"].iloc[0])
        if steps > 0 and wall > 0:
            return steps / wall
    return float(rows["value"].iloc[-1]) if len(rows) else None


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def filter_runs(
    table: pd.DataFrame,
    *,
    statuses: list[str] | None = None,
    envs: list[str] | None = None,
    text: str = "",
) -> pd.DataFrame:
    """Rows of a :func:`~gae_core.storage.table.runs_frame` whose status and env are among those
    given (all when None) and whose name or id contains ``text`` (case-insensitive)."""
    keep = pd.Series(True, index=table.index)
    if statuses:
        keep &= table["status"].isin(statuses)
    if envs:
        keep &= table["env_id"].isin(envs)
    if text.strip():
        needle = text.strip().lower()
        keep &= table["name"].str.lower().str.contains(needle, regex=False) | table[
            "run_id"
        ].str.lower().str.contains(needle, regex=False)
    return table[keep]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_float_list(text: str, name: str, low: float = 0.0, high: float = 1.0) -> list[float]:
    """``"0.9, 0.95, 1"`` (commas, semicolons or spaces between) → ``[0.9, 0.95, 1.0]``; a
    ConfigError naming ``name`` and the range for a bad or duplicated value: what is not a
    number and what is out of range in one message."""
    parts = [p for p in re.split(r"[,;\s]+", str(text)) if p]

    def few(items: list[str]) -> str:  # the first few, and how many in all (a pasted column)
        return ", ".join(items[:5]) + (f", … ({len(items):,} in all)" if len(items) > 5 else "")

    unread = [p for p in parts if not _is_number(p)]
    bad = [f"{float(p):g}" for p in parts if _is_number(p) and not low <= float(p) <= high]
    if unread:  # each named, quoted as typed, with any value out of range
        outside = f"; out of range: {few(bad)}" if bad else ""
        raise ConfigError(
            f"{name} must be numbers in [{low:g}, {high:g}], separated by commas or spaces; "
            f"not a number: {few([echo(p) for p in unread])}{outside}"
        )
    values = [float(p) for p in parts]
    if not values:
        raise ConfigError(f"{name} needs at least one value in [{low:g}, {high:g}]")
    if bad:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {few(bad)}")
    duplicates = sorted({v for i, v in enumerate(values) if v in values[:i]})
    if duplicates:
        raise ConfigError(f"{name}: {', '.join(f'{v:g}' for v in duplicates)} given twice")
    return values
