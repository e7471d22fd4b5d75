"""The training config's flags (every ``TrainConfig`` field is a flag of ``train`` and ``sweep``,
generated from its :class:`~gae_core.agent.config.FieldSpec`) and the config they make: a
flag's text is read by the field's own parser, and every bad flag is named at once, one a line
(:func:`config_from_args`), as the Train form lists every bad field."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gae_core.agent.config import (
    FIELD_SPECS,
    SPANNING_FIELDS,
    FieldSpec,
    TrainConfig,
    field_problems,
    field_spec,
)
from gae_core.agent.presets import preset_of, preset_values
from gae_core.errors import ConfigError
from gae_core.inert import terminal_text
from gae_core.labels import label, value_text
from gae_core.storage.store import SHORT_ID

__all__ = [
    "RUN_ID_WORDS", "Unread", "add_config_flags", "command_line", "config_from_args",
    "env_modules_named", "field_named", "flag_notes", "flag_type", "flag_warnings", "flag_words",
    "idle_flag_notes", "like_notes", "name_flag", "resolved", "resolved_lines",
]  # fmt: skip


RUN_ID_WORDS = f"its id, or its first {SHORT_ID} or more characters"  # a run or sweep id's help


@dataclasses.dataclass(frozen=True)
class Unread:
    """A config flag's text that its field's parser refused, kept (not an argparse error,
    which stops at the first) for :func:`config_from_args` to name with every other problem."""

    text: str
    message: str


def flag_type(spec: FieldSpec) -> Callable[[str], object]:
    def parse(text: str) -> object:
        try:
            return spec.parse(text)
        except ConfigError as exc:  # named with the other flags' problems, all at once
            return Unread(text, str(exc))

    parse.__name__ = spec.kind  # argparse names the type in its message
    return parse


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``TrainConfig`` field, and ``--like RUN_ID`` (a stored run's config in the
    preset's place); unset flags are absent from the namespace."""
    group = parser.add_argument_group(
        "training config (TrainConfig fields; unset ones come from the env's preset, or with "
        "--like from that run)"
    )
    group.add_argument(
        "--like",
        metavar="RUN_ID",
        help=f"start from that stored run's config ({RUN_ID_WORDS}) instead of the env's "
        "preset (the flags "
        f"given still win, and a {label('lambda_')} sweep still holds the critic's target, "
        "saying so; train --dry-run prints it)",
    )
    for spec in FIELD_SPECS.values():
        default = spec.default
        if isinstance(default, tuple):
            default = " ".join(map(str, default))
        common = {
            "dest": spec.name,
            "default": argparse.SUPPRESS,
            "help": f"{spec.help}; {spec.allowed} (field default: {default})".replace("%", "%%"),
        }
        if spec.kind == "bool":
            group.add_argument(*spec.flags, action=argparse.BooleanOptionalAction, **common)
        elif spec.kind == "int_list":  # --hidden-sizes 64 64, or --hidden-sizes 64x64
            group.add_argument(*spec.flags, type=flag_type(spec), nargs="+", metavar="N", **common)
        else:
            metavar = {"int": "N", "float": "X"}.get(spec.kind, "VALUE")
            group.add_argument(*spec.flags, type=flag_type(spec), metavar=metavar, **common)


def _flag(name: str) -> str:
    """Field ``name``'s flag, as the CLI's messages name it (``--n-epochs``)."""
    return FIELD_SPECS[name].flags[0]


def name_flag(message: str) -> str:
    """Prefix a ConfigError message that starts with a field name with that field's flag."""
    field = message.split(" ", 1)[0].rstrip(":")
    spec = FIELD_SPECS.get(field)
    return f"{spec.flags[0]}: {message}" if spec else message


def flag_words(name: str, value: Any) -> str:
    """Field ``name`` set to ``value`` as its flag reads it on a command line
    (``--hidden-sizes 64x64``, ``--no-normalize-rewards``; text shell-quoted)."""
    flag = FIELD_SPECS[name].flags[0]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    if isinstance(value, (tuple, list)):
        return f"{flag} {'x'.join(map(str, value))}"
    return f"{flag} {shlex.quote(str(value))}"


def _sources(args: argparse.Namespace, config: TrainConfig) -> dict[str, str]:
    """Where each field of ``config`` (made by :func:`config_from_args`) came from: ``flag``,
    ``run`` (``--like``'s), ``preset`` (its env's and algorithm's,
    :mod:`gae_core.agent.presets`) or ``default``."""
    preset = preset_of(config.env_id, config.algo)
    tuned = preset.values if preset is not None else {}
    like = getattr(args, "like", None) is not None
    return {name: "flag" if hasattr(args, name) else "run" if like
            else "preset" if name in tuned else "default" for name in FIELD_SPECS}  # fmt: skip


def resolved(args: argparse.Namespace, config: TrainConfig) -> dict[str, Any]:
    """``train --dry-run --json``: the config, each field's source (the flag, ``--like``'s run,
    the env's preset, the default), the fields idle here with why, the preset's reason (None
    with ``--like``: the run's config stands in its place), the ``warnings`` the Train form
    would give (:func:`flag_warnings`) and the whole config as one ``command``
    (:func:`command_line`)."""
    preset = None if getattr(args, "like", None) else preset_of(config.env_id, config.algo)
    return {"config": config.to_dict(), "sources": _sources(args, config),
            "idle": config.idle_fields(), "preset": preset.why if preset else None,
            "warnings": flag_warnings(config),
            "command": command_line(config, env_modules_named(args))}  # fmt: skip


def resolved_lines(args: argparse.Namespace, config: TrainConfig) -> list[str]:
    """``train --dry-run``: :func:`resolved` as lines, each field as its flag (a command line
    can take them back) beside its source; the idle fields apart, grouped by why."""
    found = resolved(args, config)
    idle = config.idle_fields(_flag)
    rows = [(flag_words(name, getattr(config, name)), found["sources"][name])
            for name in found["config"] if name not in idle]  # fmt: skip
    wide = max(len(words) for words, _ in rows)
    like = getattr(args, "like", None)
    start = f", like run {terminal_text(like)}" if like else ""
    lines = [f"{terminal_text(config.env_id)} with {value_text('algo', config.algo)}{start}, "
             "as `train` would run it (nothing trained or stored):"]  # fmt: skip
    lines += [f"  {terminal_text(words):<{wide}}  {source}" for words, source in rows]
    by_reason: dict[str, list[str]] = {}
    for name, reason in idle.items():
        by_reason.setdefault(reason, []).append(_flag(name))
    if by_reason:
        lines.append("no effect here:")
        lines += [f"  {', '.join(flags)}: {terminal_text(reason)}"
                  for reason, flags in by_reason.items()]  # fmt: skip
    if found["preset"] is not None:
        lines.append(f"preset: {found['preset']}")
    lines.append(f"as one command (every field, those without effect too): "
                 f"{terminal_text(found['command'])}")  # fmt: skip
    return lines


def like_notes(
    args: argparse.Namespace, base: Mapping[str, Any] | None, config: TrainConfig
) -> list[str]:
    """A line when ``--like``'s run (its stored values ``base``) trained another env or
    algorithm than ``config`` (made from it by :func:`config_from_args`): its settings are
    kept, not the other's preset."""
    if base is None:
        return []
    algo = base.get("algo", FIELD_SPECS["algo"].default)  # a run from before PPO: A2C
    if (base["env_id"], algo) == (config.env_id, config.algo):
        return []
    return [f"note: run {terminal_text(args.like)} trained {value_text('algo', algo)} "
            f"on {terminal_text(base['env_id'])}: its settings are kept, not "
            f"{terminal_text(config.env_id)}'s {value_text('algo', config.algo)} preset (train "
            "--dry-run lists them)"]  # fmt: skip


def env_modules_named(args: argparse.Namespace) -> list[str]:
    """The ``--env-module`` packages given, before the command and after it (two lists: a
    subcommand's namespace would overwrite one)."""
    return [*getattr(args, "env_module_first", []), *getattr(args, "env_module", [])]


def command_line(config: TrainConfig, modules: Sequence[str] = ()) -> str:
    """``python -m gae_core train`` with every field of ``config`` as its flag: the config,
    whole, as one command (:func:`flag_words`), importing the env ``modules`` named."""
    words = [*(f"--env-module {shlex.quote(m)}" for m in modules), "train"]
    words += (flag_words(name, value) for name, value in dataclasses.asdict(config).items())
    return "python -m gae_core " + " ".join(words)


def field_named(flag: str, text: str) -> str:
    """The config field ``text`` names for option ``flag`` (``--group``), as ``sweep --grid``
    reads one (:func:`~gae_core.agent.config.field_spec`: ``lambda`` and ``env`` too); a
    :class:`ConfigError` naming the flag and listing the fields otherwise."""
    try:
        return field_spec(text).name
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def flag_warnings(*configs: TrainConfig) -> list[str]:
    """What the configs (a run's, or a sweep's trials') will do that their user may not expect,
    as the Train form warns of it (:func:`~gae_core.insight.views.config_warnings`: a budget
    under one update, checkpoints or evaluations past it, …), each field as its flag; each
    once (``train`` and ``sweep`` print them as notes, ``--dry-run --json`` as ``warnings``)."""
    from gae_core.insight.views import config_warnings

    return list(dict.fromkeys(w for c in configs for w in config_warnings(c, _flag, idle=False)))


def flag_notes(*configs: TrainConfig) -> list[str]:
    """:func:`flag_warnings` as the lines ``train`` and ``sweep`` print on stderr."""
    return [f"note: {warning}" for warning in flag_warnings(*configs)]


def idle_flag_notes(args: argparse.Namespace, *configs: TrainConfig) -> list[str]:
    """A line for each flag given whose field changes nothing given the others in every one of
    ``configs`` (a run's, or a sweep's trials': :meth:`TrainConfig.idle_fields`, ``--n-epochs``
    under A2C, ``--use-sde`` on discrete actions), as the Train form says of odd combinations;
    nothing for a field left alone."""
    idle = [config.idle_fields(_flag) for config in configs]
    return [f"note: {_flag(name)} has no effect: {idle[0][name]}"
            for name in FIELD_SPECS
            if hasattr(args, name) and all(name in each for each in idle)]  # fmt: skip


def config_from_args(
    args: argparse.Namespace, base: Mapping[str, Any] | None = None, **overrides: Any
) -> TrainConfig:
    """The preset of the env and algorithm (:mod:`gae_core.agent.presets`, CartPole-v1 and A2C
    when no ``--env`` or ``--algo``), or ``base`` (``--like``'s run's stored values, not yet
    checked: a flag can mend one), with the flags given on top; ``ConfigError`` naming every
    bad field, one a line in the flags' order (the Train form lists them all at once too), a
    field the flags left to ``base`` as ``run …'s stored config``'s."""
    values = {name: getattr(args, name) for name in FIELD_SPECS if hasattr(args, name)}
    unread = {}  # flags whose text the field's parser refused (Unread): said with the rest
    for name, value in list(values.items()):
        parts = value if FIELD_SPECS[name].kind == "int_list" else [value]
        refused = [part for part in parts if isinstance(part, Unread)]
        if refused:
            unread[name] = refused[0].message
            del values[name]
        elif FIELD_SPECS[name].kind == "int_list":  # nargs="+" of parsed parts: flatten
            values[name] = tuple(int(x) for part in value for x in part)
    values.update(overrides)
    given = set(values) | set(unread)
    if base is not None:
        values = {**base, **values}
    env_id = values.get("env_id", FIELD_SPECS["env_id"].default)
    algo = values.get("algo", FIELD_SPECS["algo"].default)
    values = {**preset_values(env_id, algo), **values}
    problems = field_problems(values)
    if unread.keys() & SPANNING_FIELDS:  # a field of the check was not read: no check
        problems.pop("minibatch_size", None)
    problems |= unread
    if problems:
        order = list(FIELD_SPECS)
        named = sorted(problems, key=lambda n: order.index(n) if n in order else len(order))
        whose = f"run {terminal_text(getattr(args, 'like', ''))}'s stored config: "
        raise ConfigError("\n".join((whose if base is not None and name not in given else "")
                                     + problems[name] for name in named))  # fmt: skip
    return TrainConfig(**values)
