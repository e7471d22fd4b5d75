"""The CLI's commands that change a stored run: ``stop``, ``rename`` and ``delete``."""

from __future__ import annotations

import argparse
import sys
import time

from gae_core.cli.commands import EXIT_OK, UsageError
from gae_core.cli.stores import open_existing_store

__all__ = ["DELETE_STOP_WAIT_S", "delete", "rename", "stop"]

#: How long ``delete --force`` waits for an active run to stop before deleting it anyway.
DELETE_STOP_WAIT_S = 30.0


def stop(args: argparse.Namespace) -> int:
    with open_existing_store(args, writes=True) as store:
        before = store.get_run(args.run_id).status
        status = store.request_stop(args.run_id)
    if status == "running":
        what = "asked to stop: it stops on its next flush, its data kept"
    elif before == "queued" and status == "stopped":  # (not one that ran meanwhile)
        what = "stopped before it started"
    else:
        what = f"already {status}: nothing to stop"
    print(f"run {args.run_id}: {what}", file=sys.stderr)
    return EXIT_OK


def rename(args: argparse.Namespace) -> int:
    with open_existing_store(args, writes=True) as store:
        try:
            store.rename_run(args.run_id, args.name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return EXIT_OK


def delete(args: argparse.Namespace) -> int:
    with open_existing_store(args, writes=True) as store:
        run = store.get_run(args.run_id)
        if run.active and args.force:
            # Stop it cleanly first, so its process ends and reports instead of failing on a
            # vanished run; delete anyway if it does not stop in time.
            store.request_stop(run.id)
            deadline = time.monotonic() + DELETE_STOP_WAIT_S
            while store.get_run(run.id).active and time.monotonic() < deadline:
                time.sleep(0.1)
                store.recover()
            if store.get_run(run.id).active:
                print(
                    f"run {run.id} did not stop within {DELETE_STOP_WAIT_S:.0f} s; deleting it "
                    "anyway (its process ends as 'deleted' at its next flush)",
                    file=sys.stderr,
                )
        store.delete_run(run.id, force=args.force)
    print(f"deleted run {args.run_id}", file=sys.stderr)
    return EXIT_OK
