"""How one config field is seen by the form, the CLI and ``sweep --grid``: its kind, range,
choices, help, label, flag names, and how a value typed as text is read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gae_core.errors import ConfigError
from gae_core.labels import label

__all__ = ["FieldSpec", "parse_int"]


#: Thousands written with commas: 1,000 or 12,345,678 (never 1,0 or 1,0000, a typo to refuse).
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+")
# 1e6, 2.5E+3: a whole number in scientific notation (a negative exponent could round a
# fraction to 0: 1e-400 is refused, not read as 0)
_SCIENTIFIC = re.compile(r"[+-]?\d+(\.\d*)?[eE]\+?\d+")


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
    value = float(text)
    if not value.is_integer():
        raise ValueError(f"invalid integer {text!r}")
    return int(value)


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
        if self.kind == "int":  # every digit: 2147483647, not 2.14748e+09
            return f"an integer in [{self.min}, {self.max}]"
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
                parts = [p for p in item.lower().replace(",", " ").replace("x", " ").split()]
                if not parts:
                    raise ValueError(item)
                return tuple(parse_int(p) for p in parts)
            if self.kind == "int" or (self.kind == "choice" and isinstance(self.default, int)):
                return parse_int(item)
            if self.kind == "float":
                return float(item)
            return item
        except ValueError:
            raise ConfigError(
                f"{self.name}: cannot read {text!r}; expected {self.allowed}"
            ) from None
