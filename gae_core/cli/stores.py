"""The CLI's run store: the one a command opens (made by ``train`` and ``sweep`` only) and
``--like RUN_ID``'s stored config."""

from __future__ import annotations

import argparse
from typing import Any

from gae_core.agent.config import stored_values
from gae_core.errors import NoStore, StoreError
from gae_core.inert import terminal_text
from gae_core.storage.database import DEFAULT_DATA_DIR
from gae_core.storage.store import DATA_ENV_VAR, RunStore, open_for_reading, require_store

__all__ = ["like_base", "open_existing_store", "open_store"]


def open_store(args: argparse.Namespace) -> RunStore:
    """The store of ``train`` and ``sweep``, made where there is none."""
    return RunStore(getattr(args, "data_dir", None))


def open_existing_store(args: argparse.Namespace, *, writes: bool = False) -> RunStore:
    """The store of a command that acts on what it holds (every command but ``train`` and
    ``sweep``). One that only reads (``writes`` False) opens it recovered where it can be
    written, read-only where the folder is read-only or the disk is full
    (:func:`~gae_core.storage.store.open_for_reading`); one that changes it (``stop``,
    ``rename``, ``delete``) as ``train`` does, whose errors say why it cannot write. A folder
    with no store is an error naming it (exit 1), so a mistyped ``--data-dir`` creates
    nothing. The run or sweep id the command takes, where it has one, becomes the full id it
    names (a short one will do: :meth:`~gae_core.storage.store.RunStore.resolve_run_id`,
    ``resolve_sweep_id``)."""
    data_dir = getattr(args, "data_dir", None)
    try:
        require_store(data_dir)
    except NoStore as exc:
        raise NoStore(f"{exc}: name its folder with --data-dir (default: ${DATA_ENV_VAR}, "
                      f"else ./{DEFAULT_DATA_DIR})") from None  # fmt: skip
    store = RunStore(data_dir) if writes else open_for_reading(data_dir)
    named = (("run_id", store.resolve_run_id), ("sweep_id", store.resolve_sweep_id),
             ("sweep", store.resolve_sweep_id))  # (`runs --sweep`)  # fmt: skip
    try:  # the run or sweep the command names, by its id or a short one (StoreError, exit 1,
        for attribute, resolve in named:  # where it names none or several)
            if getattr(args, attribute, None) is not None:
                setattr(args, attribute, resolve(getattr(args, attribute)))
    except StoreError:
        store.close()
        raise
    return store


def like_base(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--like RUN_ID``'s run's config values as stored (:func:`stored_values`: fields it
    predates take the behaviour it had), checked once the flags are on top
    (:func:`~gae_core.cli.flags.config_from_args`); None without the flag; an unknown id or an
    unreadable config is a StoreError (exit 1)."""
    if getattr(args, "like", None) is None:
        return None
    with open_existing_store(args) as store:
        args.like = store.resolve_run_id(args.like)  # a short id will do
        run = store.get_run(args.like)
    if run.damaged or not isinstance(run.config, dict):
        raise StoreError(f"run {terminal_text(args.like)}'s config cannot be read: "
                         f"{run.damaged or 'not a dict'}")  # fmt: skip
    return stored_values(run.config)
