"""Text that users type (a run or sweep name) made inert wherever it is shown or exported.

* CSV: a cell that starts with ``=``, ``+``, ``-``, ``@``, tab or carriage return is read as a
  formula by spreadsheets (CSV injection); OWASP's advice is to prefix such text cells with a
  single quote. Only text cells are touched: numbers stay numbers (``-200.5`` is a return).
* Markdown: Streamlit renders names in headers, captions and dialogs as markdown, where
  ``[x](javascript:…)``, ``![img](…)``, ``:red[…]`` directives and ``$…$`` maths would act.
  Every ASCII punctuation character is backslash-escaped (CommonMark allows that for all of
  them), so the name shows exactly as typed.
* Plotly: trace names accept a subset of HTML (``<a href>``, ``<b>``); ``&``, ``<`` and ``>``
  become entities.
* Terminal: control characters (ANSI escapes included) are dropped from CLI output.

:func:`clean_name` is applied when a name is stored, the rest when it is shown, so names written
by an older version are safe too.
"""

from __future__ import annotations

import re
import string
import unicodedata
from typing import IO, Any

import pandas as pd

__all__ = [
    "CSV_FORMULA_PREFIXES",
    "MAX_NAME_LENGTH",
    "clean_name",
    "csv_safe",
    "markdown_text",
    "plotly_text",
    "terminal_text",
    "to_csv",
]

CSV_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
MAX_NAME_LENGTH = 200
_MARKDOWN_SPECIAL = frozenset(string.punctuation)


def _is_control(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cf") and char not in "\t\n"


def clean_name(name: str, *, field: str = "name") -> str:
    """A name fit to store: control characters dropped, whitespace runs collapsed to one
    space, at most :data:`MAX_NAME_LENGTH` characters; ``ValueError`` naming ``field`` if
    nothing is left."""
    if not isinstance(name, str):
        raise ValueError(f"{field} must be text, got {type(name).__name__}")
    text = "".join(" " if c in "\t\n" else c for c in name if not _is_control(c))
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        raise ValueError(f"{field} cannot be empty (1 to {MAX_NAME_LENGTH} characters)")
    if len(text) > MAX_NAME_LENGTH:
        raise ValueError(f"{field} must be at most {MAX_NAME_LENGTH} characters, got {len(text)}")
    return text


def csv_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells cannot start a spreadsheet formula."""
    out = frame.copy()
    for column in out.columns:
        series = out[column]
        if series.dtype.kind not in "OSU" and not pd.api.types.is_string_dtype(series):
            continue
        out[column] = series.map(_csv_cell)
    return out


def _csv_cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(CSV_FORMULA_PREFIXES):
        return "'" + value
    return value


def to_csv(frame: pd.DataFrame, path_or_buffer: str | IO[str] | None = None) -> str | None:
    """The one way the product writes CSV: :func:`csv_safe`, no index."""
    return csv_safe(frame).to_csv(path_or_buffer, index=False)


def markdown_text(text: str) -> str:
    """``text`` escaped so that Streamlit's markdown shows it literally, on one line."""
    text = terminal_text(str(text))
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text)


def plotly_text(text: str) -> str:
    """``text`` for a Plotly trace name or title: its HTML subset becomes plain text."""
    text = terminal_text(str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def terminal_text(text: str) -> str:
    """``text`` without control characters (ANSI escapes, bells, newlines) for one line of
    output."""
    return "".join(" " if c in "\t\n\r" else c for c in str(text) if not _is_control(c))
