"""The CLI's run store: the one a command opens (made by ``train`` and ``sweep`` only) and
``--like RUN_ID``'s stored config."""

from __future__ import annotations

import argparse

from gae_core.agent.config import TrainConfig
from gae_core.errors import NoStore, StoreError
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
    nothing."""
    data_dir = getattr(args, "data_dir", None)
    try:
        require_store(data_dir)
    except NoStore as exc:
        raise NoStore(f"{exc}: name its folder with --data-dir (default: ${DATA_ENV_VAR}, "
                      f"else ./{DEFAULT_DATA_DIR})") from None  # fmt: skip
    return RunStore(data_dir) if writes else open_for_reading(data_dir)


def like_base(args: argparse.Namespace) -> TrainConfig | None:
    """``--like RUN_ID``'s run's config as stored (:meth:`TrainConfig.from_stored`: fields it
    predates take the behaviour it had), None without the flag; an unknown id is a
    StoreError (exit 1)."""
    if getattr(args, "like", None) is None:
        return None
    with open_existing_store(args) as store:
        run = store.get_run(args.like)
    if run.damaged:
        raise StoreError(f"run {args.like}'s config cannot be read: {run.damaged}")
    return TrainConfig.from_stored(run.config)
