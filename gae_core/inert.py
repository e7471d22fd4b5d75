"""Text that users type (a run or sweep name) made inert wherever it is shown or exported.

* CSV: a cell that starts with ``=``, ``+``, ``-``, ``@``, tab or carriage return is read as a
  formula by spreadsheets (CSV injection); OWASP's advice is to prefix such text cells with a
  single quote. Only text cells are touched: numbers stay numbers (``-200.5`` is a return). A
  carriage return inside a text cell is written as a line feed, which the CSV writer quotes: a
  bare carriage return (``abc<CR>=1+1``, in a name written by an older version or straight
  into the database) would be left unquoted and start a new row whose first cell is a formula.
* Markdown: Streamlit renders names in headers, captions and dialogs as markdown, where
  ``[x](javascript:…)``, ``![img](…)``, ``:red[…]`` directives and ``$…$`` maths would act.
  Every ASCII punctuation character is backslash-escaped (CommonMark allows that for all of
  them), so the name shows exactly as typed.
* Plotly: trace names accept a subset of HTML (``<a href>``, ``<b>``); ``&``, ``<`` and ``>``
  become entities.
* Terminal: control characters (ANSI escapes included) are dropped from CLI output (names,
  paths, messages), and undecodable bytes (the lone surrogates Python makes of them in a path
  or an argument) show as the replacement character.

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


def clean_name(name: str | bytes, *, field: str = "name") -> str:
    """A name fit to store: control characters dropped, whitespace runs collapsed to one
    space, at most :data:`MAX_NAME_LENGTH` characters; ``ValueError`` naming ``field`` if
    nothing is left or if it is not valid UTF-8 (bytes that do not decode, or the lone
    surrogates Python makes of such bytes on the command line)."""
    if isinstance(name, bytes):
        try:
            name = name.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(_not_utf8(field, name[exc.start], exc.start)) from None
    if not isinstance(name, str):
        raise ValueError(f"{field} must be text, got {type(name).__name__}")
    for position, char in enumerate(name):
        if _is_surrogate(char):  # U+DC80..U+DCFF: an undecodable byte from the command line
            byte = ord(char) - 0xDC00 if "\udc80" <= char <= "\udcff" else None
            raise ValueError(_not_utf8(field, byte, position))
    text = "".join(" " if c in "\t\n" else c for c in name if not _is_control(c))
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        raise ValueError(f"{field} cannot be empty (1 to {MAX_NAME_LENGTH} characters)")
    if len(text) > MAX_NAME_LENGTH:
        raise ValueError(f"{field} must be at most {MAX_NAME_LENGTH} characters, got {len(text)}")
    return text


def _is_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udfff"


def _not_utf8(field: str, byte: int | None, position: int) -> str:
    what = f"byte 0x{byte:02x}" if byte is not None else "a lone surrogate"
    return f"{field} is not valid UTF-8 text ({what} at position {position})"


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
    if not isinstance(value, str):
        return value
    if value.startswith(CSV_FORMULA_PREFIXES):
        value = "'" + value
    if "\r" in value:  # the writer quotes a cell holding "\n", never one with a bare "\r"
        value = value.replace("\r\n", "\n").replace("\r", "\n")
    return value


def to_csv(frame: pd.DataFrame, path_or_buffer: str | IO[str] | None = None) -> str | None:
    """The one way the product writes CSV: :func:`csv_safe`, no index, rows ended by a line
    feed (a cell holding a line break is quoted)."""
    return csv_safe(frame).to_csv(path_or_buffer, index=False, lineterminator="\n")


def markdown_text(text: str) -> str:
    """``text`` escaped so that Streamlit's markdown shows it literally, on one line: every
    ASCII punctuation mark backslash-escaped, and a word joiner (U+2060, invisible) where GFM
    would link a bare URL or e-mail address (``://``, ``www.``, ``@``), which it finds in the
    text after escapes are read."""
    text = terminal_text(str(text))
    escaped = "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text)
    escaped = escaped.replace("\\:\\/\\/", "\\:" + _JOINER + "\\/\\/")
    escaped = _WWW.sub("\\g<1>" + _JOINER + "\\g<2>", escaped)
    return escaped.replace("\\@", _JOINER + "\\@")


_JOINER = "\u2060"
_WWW = re.compile(r"(?i)(www)(\\\.)")  # "www." as escaped: www\.


def plotly_text(text: str) -> str:
    """``text`` for a Plotly trace name or title: its HTML subset becomes plain text."""
    text = terminal_text(str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def terminal_text(text: object) -> str:
    """``text`` (a path too) without control characters (ANSI escapes, bells, newlines) for one
    line of output; undecodable bytes (lone surrogates) become the replacement character."""
    return "".join(
        " " if c in "\t\n\r" else "\ufffd" if _is_surrogate(c) else c
        for c in str(text)
        if not _is_control(c)
    )
