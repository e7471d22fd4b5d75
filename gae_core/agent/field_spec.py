"""How one config field is seen by the form, the CLI and ``sweep --grid``: its kind, range,
choices, help, label, flag names, and how a value typed as text is read; and the one wording
of a whole number that is not in its range (:func:`int_problem`, the config's fields and the
lab's settings alike), quoting what was typed at most :data:`ECHO_LIMIT` characters long."""

from __future__ import annotations

import decimal
import numbers
import re
from dataclasses import dataclass
from typing import Any

from gae_core.errors import ConfigError
from gae_core.labels import label

__all__ = ["ECHO_HEAD", "ECHO_LIMIT", "FieldSpec", "echo", "int_problem", "int_range", "parse_int"]


#: Thousands written with commas: 1,000 or 12,345,678 (never 1,0 or 1,0000, a typo to refuse).
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")
# 1e6, 2.5E+3: a whole number in scientific notation (a negative exponent could round a
# fraction to 0: 1e-400 is refused, not read as 0)
_SCIENTIFIC = re.compile(r"[+-]?\d+(\.\d*)?[eE]\+?\d+")
#: The most digits a number in scientific notation may have (Python's limit for writing an int)
_MAX_DIGITS = 4300


def parse_int(text: str) -> int:
    """An integer typed as text: ``100000``, ``100_000``, ``100,000`` or ``1e6``, with spaces
    around it; ``ValueError`` otherwise. Any size is read (a range check is the caller's), so a
    form can say that a 20-digit seed is out of range rather than unreadable."""
    text = str(text).strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        return int(text)
    except ValueError:
        pass
    if not _SCIENTIFIC.fullmatch(text):
        raise ValueError(f"invalid integer {text!r}")
    # exactly, as a decimal: 1e30 is 10^30, not the float nearest it (…019884624838656)
    try:
        value = decimal.Decimal(text)
        if value.adjusted() >= _MAX_DIGITS or value != value.to_integral_value():
            raise ValueError(f"invalid integer {text!r}")
    except decimal.InvalidOperation:  # an exponent past decimal's own limit (1e10^18)
        raise ValueError(f"invalid integer {text!r}") from None
    return int(value)


#: The most characters of a typed value a message quotes whole; a longer one (a 5,000-digit
#: seed) is quoted by its first :data:`ECHO_HEAD` and its length.
ECHO_LIMIT, ECHO_HEAD = 30, 20


def echo(value: Any) -> str:
    """A value as a message quotes it: text in quotes (``'seven'``), a number as itself; past
    :data:`ECHO_LIMIT` characters, its start and how long it is:
    ``'99999999999999999999…' (5,000 digits)``. Control characters show escaped (``'\\x07'``).
    None (a cleared number box, a JSON null) and an empty or blank text (a cleared text box)
    are "nothing"."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "nothing"
    quote = isinstance(value, str)
    if quote:
        text = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        try:
            text = str(int(value))
        except ValueError:  # past Python's limit for writing an int (4,300 digits)
            return f"an integer of about {int(int(value).bit_length() * 0.30103):,} digits"
    else:
        text = repr(value)
    if len(text) <= ECHO_LIMIT:
        return repr(text) if quote else text
    bare = text.strip().lstrip("+-")
    length = f"{len(bare):,} digits" if bare.isdigit() else f"{len(text):,} characters"
    head = text[:ECHO_HEAD] + "…"
    return f"{head!r} ({length})" if quote else f"{head} ({length})"


def int_range(low: int, high: int) -> str:
    """A whole number's range in words, every digit (2147483647, not 2.14748e+09)."""
    return f"an integer in [{low}, {high}]"


def int_problem(name: str, value: Any, low: int, high: int) -> str | None:
    """None for an int in [low, high]; otherwise the one message for a whole number that is not,
    naming the field, its range and what it got: ``seed must be an integer in [0, 2147483647],
    got 'seven'``. A bool, a float, text a page could not read as a number and an int out of
    range are refused alike (the config's fields, the lab's settings, the dashboard's boxes)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not low <= value <= high
    ):
        return f"{name} must be {int_range(low, high)}, got {echo(value)}"
    return None


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

# CLI flag spellings that differ from ``--field-name``.
_FLAG_NAMES = {"env_id": ("--env", "--env-id"), "lambda_": ("--lambda",)}


@dataclass(frozen=True)
class FieldSpec:
    """One ``TrainConfig`` field as the form, the CLI and ``--grid`` see it.

    ``kind`` is ``choice``, ``bool``, ``int``, ``float`` or ``int_list``; :meth:`parse` reads a
    value typed as text (a CLI flag, a ``--grid`` item, a form text box); ``TrainConfig`` then
    checks its range.
    """

    name: str
    kind: str
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def label(self) -> str:
        return label(self.name)

    @property
    def flags(self) -> tuple[str, ...]:
        return _FLAG_NAMES.get(self.name, (f"--{self.name.rstrip('_').replace('_', '-')}",))

    @property
    def allowed(self) -> str:
        """What the field allows, in words (for help texts and messages)."""
        if self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "int_list":
            return f"1 to 8 integers in [{self.min}, {self.max}], written 64x64 or '64, 64'"
        if self.kind == "int":
            return int_range(self.min, self.max)
        return f"in [{self.min:g}, {self.max:g}]"

    def parse(self, text: str) -> Any:
        """The value typed as ``text``; ``ConfigError`` naming the field if it cannot be read."""
        item = str(text).strip()
        try:
            if self.kind == "bool":
                if item.lower() not in _TRUE + _FALSE:
                    raise ValueError(item)
                return item.lower() in _TRUE
            if self.kind == "int_list":
                # one separator between sizes: "64,,64" or "64," is a typo, not two sizes
                parts = re.split(r"\s*[,x]\s*|\s+", item.lower())
                if "" in parts:
                    raise ValueError(item)
                return tuple(parse_int(p) for p in parts)
            if self.kind == "int" or (self.kind == "choice" and isinstance(self.default, int)):
                return parse_int(item)
            if self.kind == "float":
                return float(item)
            return item
        except ValueError:
            if self.kind == "int":  # the range's one wording, as for a value out of it
                raise ConfigError(int_problem(self.name, text, self.min, self.max)) from None
            raise ConfigError(
                f"{self.name}: cannot read {echo(text)}; expected {self.allowed}"
            ) from None
