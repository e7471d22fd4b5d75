"""The library's error types, in one place so that no layer imports another just to raise.

Every message names the field, path or id at fault and what is allowed instead: the CLI prints it
as one line and the dashboard shows it as is.
"""

from __future__ import annotations

__all__ = ["ConfigError", "NoStore", "StoreError", "StoreFull", "UnknownId", "UnsupportedEnvError"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what it allows."""


class UnsupportedEnvError(ConfigError):
    """An env id that cannot be trained here: unknown, a missing package, or spaces the trainer
    does not handle. The message names the id and what to install or why it is unsupported."""


class StoreError(RuntimeError):
    """The run store cannot do what was asked: unknown run, damaged or unreadable database
    (the message names the path), newer schema, run still active."""


class NoStore(StoreError):
    """A store was to be opened, not made, and its folder holds none (the message names the
    file it looked for)."""


class StoreFull(StoreError):
    """The disk holding the run store is full: the write was rolled back, what was stored
    before is intact and still readable (the message names the path)."""


class UnknownId(StoreError):
    """An id, or the start of one, names no stored run or sweep, or begins several:
    ``candidates`` holds those ids (empty where it names none)."""

    def __init__(self, message: str, candidates: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.candidates = candidates
