"""Command line: ``python -m gae_core [--data-dir DIR] {train,runs,export,sweep,...}``.

Every ``TrainConfig`` field is a flag of ``train`` and ``sweep``, generated from
``dataclasses.fields(TrainConfig)`` with its help text (``lambda_`` is ``--lambda``, ``env_id`` is
``--env``). Exit codes: 0 success, 1 the run or sweep failed (or something was not found),
2 bad usage or a bad config value (the message names the field and its range), 130 stopped with
Ctrl-C or SIGTERM (the data so far is kept; a second Ctrl-C aborts at once). With ``--json``
the last line on stdout is one JSON object (``runs --json``: one JSON array); progress bars and
messages go to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gae_core.config import ConfigError, TrainConfig
from gae_core.store import DATA_ENV_VAR, RunRecord, RunStore, StoreError

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Flag spellings that differ from the field name.
_FLAG_NAMES = {"env_id": ["--env", "--env-id"], "lambda_": ["--lambda"]}


class UsageError(Exception):
    """Bad command-line input; reported on stderr with exit code 2."""


# -- parser ---------------------------------------------------------------------------------


def _parse_int(text: str) -> int:
    """Integers, also written ``100_000`` or ``1e6``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
    return int(value)


def _field_kind(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _field_help(f: dataclasses.Field) -> str:
    meta = f.metadata
    text = meta.get("help", "")
    if meta.get("choices"):
        text += f"; one of {', '.join(map(str, meta['choices']))}"
    elif meta.get("min") is not None and meta.get("max") is not None:
        text += f"; in [{meta['min']}, {meta['max']}]"
    default = f.default
    if isinstance(default, tuple):
        default = " ".join(map(str, default))
    return f"{text} (default: {default})".replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One flag per ``TrainConfig`` field; unset flags are absent from the namespace."""
    group = parser.add_argument_group("training config (TrainConfig fields)")
    for f in dataclasses.fields(TrainConfig):
        if f.name in skip:
            continue
        flags = _FLAG_NAMES.get(f.name, [f"--{f.name.rstrip('_').replace('_', '-')}"])
        kind = _field_kind(f)
        common: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "help": _field_help(f),
        }
        if kind == "bool":
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
        elif kind.startswith("tuple"):
            group.add_argument(*flags, type=_parse_int, nargs="+", metavar="N", **common)
        elif kind == "int":
            group.add_argument(*flags, type=_parse_int, metavar="N", **common)
        elif kind == "float":
            group.add_argument(*flags, type=float, metavar="X", **common)
        else:
            group.add_argument(*flags, type=str, metavar="VALUE", **common)


def _config_from_args(args: argparse.Namespace, **overrides: Any) -> TrainConfig:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    values.update(overrides)
    if "hidden_sizes" in values:
        values["hidden_sizes"] = tuple(values["hidden_sizes"])
    return TrainConfig(**values)


def build_parser() -> argparse.ArgumentParser:
    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        help=f"folder of the run store (default: ${DATA_ENV_VAR}, else ./runs)",
    )
    parser = argparse.ArgumentParser(
        prog="python -m gae_core",
        description="Train A2C+GAE agents, list and export runs, run λ × seed sweeps.",
        parents=[data_dir],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser(
        "train",
        parents=[data_dir],
        help="train one run in the foreground",
        description="Train one A2C+GAE run headless; Ctrl-C stops it and keeps its data.",
    )
    train.add_argument("--name", help="run name (default: env, λ, γ and seed)")
    train.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_config_flags(train)
    train.set_defaults(handler=cmd_train)

    runs = sub.add_parser("runs", parents=[data_dir], help="list runs with their status")
    runs.add_argument("--status", nargs="+", help="only runs with these statuses")
    runs.add_argument("--sweep", help="only the trials of this sweep id")
    runs.add_argument("--json", action="store_true", help="print one JSON array")
    runs.set_defaults(handler=cmd_runs)

    export = sub.add_parser("export", parents=[data_dir], help="export a run's metrics as CSV")
    export.add_argument("run_id")
    export.add_argument("--csv", required=True, metavar="PATH", help="output file ('-' for stdout)")
    export.add_argument(
        "--long", action="store_true", help="long rows (env_step, wall_time, key, value)"
    )
    export.set_defaults(handler=cmd_export)

    sweep = sub.add_parser(
        "sweep",
        parents=[data_dir],
        help="run a λ × seed grid in worker processes",
        description="Run every combination of the grid as its own run, in worker processes. "
        "Ctrl-C cancels: pending trials are skipped, running ones stop; data is kept.",
    )
    sweep.add_argument("--lambdas", type=float, nargs="+", metavar="L", help="λ values")
    sweep.add_argument("--seeds", type=_parse_int, nargs="+", metavar="S", help="seeds")
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="more grid axes over any config field (repeatable); tuple values as 64x64",
    )
    sweep.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: CPU count)"
    )
    sweep.add_argument("--name", help="sweep name")
    sweep.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_config_flags(sweep)
    sweep.set_defaults(handler=cmd_sweep)

    stop = sub.add_parser("stop", parents=[data_dir], help="ask a running run to stop")
    stop.add_argument("run_id")
    stop.set_defaults(handler=cmd_stop)

    rename = sub.add_parser("rename", parents=[data_dir], help="rename a run")
    rename.add_argument("run_id")
    rename.add_argument("name")
    rename.set_defaults(handler=cmd_rename)

    delete = sub.add_parser("delete", parents=[data_dir], help="delete a run and its data")
    delete.add_argument("run_id")
    delete.add_argument("--force", action="store_true", help="even if it is still active")
    delete.set_defaults(handler=cmd_delete)
    return parser


# -- helpers --------------------------------------------------------------------------------


def _open_store(args: argparse.Namespace) -> RunStore:
    return RunStore(getattr(args, "data_dir", None))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _run_json(run: RunRecord) -> dict[str, Any]:
    summary = run.summary
    wall = run.wall_seconds
    return {
        "run_id": run.id,
        "name": run.name,
        "status": run.status,
        "env_id": run.config.get("env_id"),
        "seed": run.config.get("seed"),
        "lambda": run.config.get("lambda_"),
        "gamma": run.config.get("gamma"),
        "env_steps": run.env_steps,
        "total_steps": run.config.get("total_steps"),
        "wall_seconds": wall,
        "steps_per_second": (run.env_steps / wall) if wall else None,
        "episodes": summary.episodes,
        "best_return": _json_safe(summary.best_return),
        "final_return": _json_safe(summary.final_return),
        "reward_threshold": summary.reward_threshold,
        "solved": summary.solved,
        "solved_at_step": summary.solved_at_step,
        "sweep_id": run.sweep_id,
        "error": run.error,
        "created_at": run.created_at,
    }


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec)


class _StopOnSignal:
    """First Ctrl-C (or SIGTERM) sets ``event``: a clean stop that keeps the data. A second
    Ctrl-C interrupts at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, event: threading.Event, message: str) -> None:
        self.event, self.message = event, message
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.event.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.event.set()
        print(f"\n{self.message}", file=sys.stderr, flush=True)

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _progress_bar(total: int, disable: bool, unit: str = "step") -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        file=sys.stderr,
        unit=unit,
        unit_scale=True,
        dynamic_ncols=True,
        disable=disable,
        mininterval=0.5,
    )


# -- commands -------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from gae_core.manager import default_run_name, execute_run, reward_threshold

    config = _config_from_args(args)
    store = _open_store(args)
    run_id = store.create_run(
        config.to_dict(),
        name=args.name or default_run_name(config),
        reward_threshold=reward_threshold(config.env_id),
    )
    print(f"run {run_id} in {store.path}", file=sys.stderr, flush=True)
    stop = threading.Event()
    bar = _progress_bar(config.total_steps, args.no_progress)
    last = [0]

    def on_step(result: Any) -> None:
        steps = min(int(result.env_steps), config.total_steps)
        bar.update(steps - last[0])
        last[0] = steps

    with _StopOnSignal(stop, "stopping after this update (Ctrl-C again to abort)…"):
        try:
            outcome = execute_run(store, run_id, config, stop, on_step=on_step)
        finally:
            bar.close()
    run = store.get_run(run_id)
    store.close()
    if outcome.status == "failed":
        print(f"run {run_id} failed: {outcome.error}", file=sys.stderr)
    summary = run.summary
    wall = outcome.wall_seconds
    result = {
        "run_id": run_id,
        "status": outcome.status,
        "env_steps": outcome.env_steps,
        "wall_seconds": wall,
        "steps_per_second": outcome.steps_per_second,
        "solved": summary.solved,
        "solved_at_step": summary.solved_at_step,
        "final_return": _json_safe(summary.final_return),
        "best_return": _json_safe(summary.best_return),
        "episodes": summary.episodes,
        "reward_threshold": summary.reward_threshold,
        "error": outcome.error,
        "data_dir": str(store.data_dir),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(
            f"run {run_id} {outcome.status}: {outcome.env_steps} env steps in {wall:.1f} s "
            f"({outcome.steps_per_second:,.0f} steps/s), last-100 mean return "
            f"{_fmt(summary.final_return, '.2f')}, solved {_fmt(summary.solved)}"
            + (f" at step {summary.solved_at_step}" if summary.solved_at_step else ""),
            flush=True,
        )
    return {"finished": EXIT_OK, "stopped": EXIT_INTERRUPTED}.get(outcome.status, EXIT_FAILED)


def cmd_runs(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        runs = store.list_runs(status=args.status, sweep_id=args.sweep)
    if args.json:
        print(json.dumps([_run_json(r) for r in runs]), flush=True)
        return EXIT_OK
    if not runs:
        print("no runs", file=sys.stderr)
        return EXIT_OK
    header = (
        f"{'RUN_ID':<12}  {'STATUS':<11}  {'ENV_STEPS':>10}  {'RETURN':>9}  {'SOLVED':<6}  NAME"
    )
    print(header)
    for run in runs:
        print(
            f"{run.id:<12}  {run.status:<11}  {run.env_steps:>10}  "
            f"{_fmt(run.summary.final_return, '9.2f'):>9}  {_fmt(run.summary.solved):<6}  "
            f"{run.name}"
        )
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        store.get_run(args.run_id)  # StoreError if unknown
        frame = store.metrics(args.run_id) if args.long else store.metrics_wide(args.run_id)
    if args.csv == "-":
        frame.to_csv(sys.stdout, index=False)
    else:
        frame.to_csv(args.csv, index=False)
        print(f"wrote {len(frame)} rows to {args.csv}", file=sys.stderr)
    return EXIT_OK


def _parse_grid_axis(text: str) -> tuple[str, list[Any]]:
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if name == "lambda":
        name = "lambda_"
    if name == "env":
        name = "env_id"
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    if not sep or name not in fields or not raw.strip():
        raise UsageError(
            f"--grid expects FIELD=V1,V2 with FIELD one of {sorted(fields)}; got {text!r}"
        )
    kind = _field_kind(fields[name])
    values: list[Any] = []
    for item in raw.split(","):
        item = item.strip()
        try:
            if kind == "bool":
                if item.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(item)
                values.append(item.lower() in ("true", "1", "yes"))
            elif kind.startswith("tuple"):
                values.append(tuple(_parse_int(v) for v in item.lower().split("x")))
            elif kind == "int":
                values.append(_parse_int(item))
            elif kind == "float":
                values.append(float(item))
            else:
                values.append(item)
        except (ValueError, argparse.ArgumentTypeError):
            raise UsageError(f"--grid {name}: cannot read {item!r} as {kind}") from None
    return name, values


def cmd_sweep(args: argparse.Namespace) -> int:
    from gae_core.sweep import SweepProgress, grid_of, start_sweep

    grid = grid_of(lambdas=args.lambdas, seeds=args.seeds)
    for axis in args.grid:
        name, values = _parse_grid_axis(axis)
        grid[name] = values
    if not grid:
        raise UsageError("a sweep needs at least one of --lambdas, --seeds, --grid")
    base = _config_from_args(args)
    store = _open_store(args)
    bar = _progress_bar(100, args.no_progress, unit="%")
    shown = [0]

    def on_progress(progress: SweepProgress) -> None:
        percent = int(progress.fraction * 100)
        bar.update(percent - shown[0])
        shown[0] = percent
        counts = progress.counts
        bar.set_postfix_str(
            f"{progress.done}/{progress.total} done, {counts['running']} running, "
            f"{counts['failed']} failed",
            refresh=False,
        )

    started = time.monotonic()
    sweep = start_sweep(
        store, base, grid, workers=args.workers, name=args.name, on_progress=on_progress
    )
    print(
        f"sweep {sweep.sweep_id}: {len(sweep.run_ids)} trials on {sweep.workers} workers "
        f"in {store.path}",
        file=sys.stderr,
        flush=True,
    )
    cancel = threading.Event()
    with _StopOnSignal(cancel, "cancelling the sweep (Ctrl-C again to abort)…"):
        while not sweep.wait(0.2):
            if cancel.is_set():
                sweep.cancel()
    bar.close()
    wall = time.monotonic() - started
    progress = sweep.progress()
    runs = [store.get_run(r) for r in sweep.run_ids]
    store.close()
    result = {
        "sweep_id": sweep.sweep_id,
        "status": progress.status,
        "workers": sweep.workers,
        "total": progress.total,
        "counts": progress.counts,
        "wall_seconds": wall,
        "grid": grid,
        "runs": [_run_json(r) for r in runs],
    }
    if args.json:
        print(json.dumps(result, default=list), flush=True)
    else:
        for run in runs:
            print(
                f"{run.id}  {run.status:<11}  {run.env_steps:>10}  "
                f"{_fmt(run.summary.final_return, '9.2f'):>9}  {run.name}"
            )
        print(f"sweep {sweep.sweep_id} {progress.status} in {wall:.1f} s: {progress.counts}")
    if progress.status == "cancelled" or cancel.is_set():
        return EXIT_INTERRUPTED
    if progress.counts["finished"] == progress.total:
        return EXIT_OK
    return EXIT_FAILED


def cmd_stop(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        status = store.request_stop(args.run_id)
    print(f"run {args.run_id}: {status} (a running run stops on its next flush)", file=sys.stderr)
    return EXIT_OK


def cmd_rename(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        try:
            store.rename_run(args.run_id, args.name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        store.delete_run(args.run_id, force=args.force)
    print(f"deleted run {args.run_id}", file=sys.stderr)
    return EXIT_OK


def _name_flag(message: str) -> str:
    """Prefix a ConfigError message that starts with a field name with that field's flag."""
    field = message.split(" ", 1)[0].rstrip(":")
    if field in {f.name for f in dataclasses.fields(TrainConfig)}:
        flag = _FLAG_NAMES.get(field, [f"--{field.rstrip('_').replace('_', '-')}"])[0]
        return f"{flag}: {message}"
    return message


# -- entry point ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except (ConfigError, UsageError) as exc:
        print(f"error: {_name_flag(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`
        sys.stderr.close()
        return EXIT_OK
    except (StoreError, sqlite3.Error, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
