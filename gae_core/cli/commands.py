"""The CLI's commands: one function per subcommand, returning the exit code (see
:mod:`gae_core.cli` for the codes and the ``--json`` contract)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import threading
import time
from typing import Any

from gae_core.agent.config import field_spec
from gae_core.agent.envs import reward_threshold
from gae_core.agent.field_spec import int_problem
from gae_core.cli.flags import (
    Unread,
    config_from_args,
    flag_notes,
    idle_flag_notes,
    like_notes,
    resolved,
    resolved_lines,
)
from gae_core.cli.stores import like_base, open_existing_store, open_store
from gae_core.errors import ConfigError, StoreError
from gae_core.inert import clean_name, terminal_text, to_csv
from gae_core.labels import assignment, label, stored_algo, value_text
from gae_core.storage.records import NOT_STARTED, RunRecord
from gae_core.storage.store import RunStore
from gae_core.storage.table import RUN_COLUMNS, run_row, runs_frame

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: How often `train`'s run reports to the store (and its progress bar moves).
TRAIN_FLUSH_S = 1.0


def _summary(store: RunStore, sweep_id: str, grid: dict) -> list[dict]:
    # scipy.stats (0.9 s to import) only for the commands that print statistics
    from gae_core.insight.compare import summary_records, sweep_summary
    from gae_core.insight.grid import study_axes

    group, _ = study_axes(grid)
    return summary_records(sweep_summary(store, sweep_id, group), group)


class UsageError(Exception):
    """Bad command-line input; reported on stderr with exit code 2."""


def print_json(value: Any) -> None:
    print(json.dumps(value, default=list), flush=True)


class StopOnSignal:
    """First Ctrl-C (or SIGTERM) sets ``event``: a clean stop that keeps the data. A second
    Ctrl-C interrupts at once. ``received`` tells a signal stop from one asked through the
    store."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, event: threading.Event, message: str) -> None:
        self.event, self.message = event, message
        self.previous: dict[int, Any] = {}
        self.received = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.event.is_set() and signum == signal.SIGINT and self.received:
            raise KeyboardInterrupt
        self.received = True
        self.event.set()
        print(f"\n{self.message}", file=sys.stderr, flush=True)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def progress_bar(total: int, disable: bool, unit: str = "step") -> Any:
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


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _solved_words(row: dict[str, Any]) -> str:
    """ "solved at step 180,000, fell below at 240,000" from a :func:`run_row`."""
    if row.get("solved") is None:
        return "no solved threshold"
    if not row["solved"]:
        return "not solved"
    words = f"solved at step {row['solved_at_step']:,}"
    if row.get("fell_below_at_step") is None:
        return words + ", stayed solved"
    fell = f"{row['fell_below_at_step']:,}"
    return words + (f", dipped below at {fell} and recovered" if row["stayed_solved"] else
                    f", fell below at {fell}")  # fmt: skip


# -- train ----------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> int:
    """One run, handed to the same backend interface and coordinator as a dashboard Start or
    a sweep (a sweep of one on :class:`~gae_core.runs.backends.ThreadBackend`: the run trains
    in a thread of this process, its reports applied to the store by the coordinator)."""
    from gae_core.runs.backends import ThreadBackend
    from gae_core.runs.execute import default_run_name
    from gae_core.runs.sweep import Sweep

    base = like_base(args)
    config = config_from_args(args, base)  # ConfigError (exit 2) before any run exists
    if args.name is not None:  # as create_run checks it, before the notes and a store
        try:
            clean_name(args.name, field="run name")
        except ValueError as exc:  # a name with nothing printable in it, not UTF-8
            raise UsageError(f"--name: {exc}") from None
    notes = [*like_notes(args, base, config), *idle_flag_notes(args, config),
             *flag_notes(config)]  # fmt: skip
    if args.dry_run:
        for note in notes:
            print(note, file=sys.stderr)
        if args.json:
            print_json(resolved(args, config))
        else:
            print("\n".join(resolved_lines(args, config)))
        return EXIT_OK
    store = open_store(args)  # (its errors alone: the notes once it is open)
    for note in notes:
        print(note, file=sys.stderr)
    try:
        run_id = store.create_run(
            config.to_dict(),
            name=args.name if args.name is not None else default_run_name(config),
            reward_threshold=reward_threshold(config.env_id),
        )
    except ValueError as exc:  # a name with nothing printable in it
        raise UsageError(f"--name: {exc}") from None
    print(f"run {run_id} in {terminal_text(store.path)}", file=sys.stderr, flush=True)
    stop = threading.Event()
    bar = progress_bar(config.total_steps, args.no_progress)
    run = Sweep(store, None, [(run_id, config)], 1, None, TRAIN_FLUSH_S, retries=0,
                backend=ThreadBackend)  # fmt: skip
    started, env_steps = time.monotonic(), 0
    # First Ctrl-C: stop after this update, keep the data. A second exits (130) once the run
    # has stopped, waiting at most the exit's bound (sweep.EXIT_JOIN_S) for its update to end.
    with StopOnSignal(stop, "stopping after this update (Ctrl-C again to abort)…") as signals:
        try:
            run.start()
            while not run.wait(TRAIN_FLUSH_S / 2):
                if stop.is_set():
                    run.cancel()
                with contextlib.suppress(StoreError):  # deleted meanwhile: the last count holds
                    env_steps = min(store.get_run(run_id).env_steps, config.total_steps)
                bar.update(env_steps - bar.n)
            with contextlib.suppress(StoreError):  # the last steps, after the last poll
                bar.update(min(store.get_run(run_id).env_steps, config.total_steps) - bar.n)
        finally:
            bar.close()
    wall = time.monotonic() - started
    status, error = run.outcomes()[run_id]
    try:  # (`delete --force` stops a run, then deletes it: maybe before this read)
        record = None if status == "deleted" else store.get_run(run_id)
    except StoreError:
        if store.run_exists(run_id):
            raise
        record, status = None, "deleted"
    if record is None:
        # the row is gone: every column of a run row, only the id and the status known
        result: dict[str, Any] = {**dict.fromkeys(RUN_COLUMNS), "run_id": run_id,
                                  "status": "deleted", "env_steps": env_steps}  # fmt: skip
    else:
        result = run_row(record)
    if status == "failed" and result["status"] in ("queued", "running"):
        # its end could not be written (the disk is still full): say how it ended
        result.update(status=status, error=error)
    store.close()
    env_steps = result["env_steps"]
    if result["wall_seconds"] is None:  # deleted, or never started: this command's own time
        result.update(wall_seconds=wall, steps_per_second=env_steps / wall if wall > 0 else 0.0)
    result["data_dir"] = str(store.data_dir)  # (the rest as `runs --json` reads the run)
    if status == "failed":  # the reason, its last line; the traceback is stored with it
        reason = (result.get("error") or error or "").strip().splitlines() or ["unknown error"]
        print(f"run {run_id} failed: {terminal_text(reason[-1])} (the whole traceback: `runs "
              "--json`, its error)", file=sys.stderr)  # fmt: skip
    if args.json:
        print_json(result)
    else:
        print(
            f"run {run_id} {status}: {env_steps:,} env steps in {result['wall_seconds']:.1f} s "
            f"({result['steps_per_second'] or 0:,.0f} steps/s), "
            f"final return {_fmt(result.get('final_return'), '.2f')}, " + _solved_words(result),
            flush=True,
        )
    if status == "stopped":
        # Ctrl-C/SIGTERM: 130; a stop asked through the store (UI, `stop`, `delete --force`)
        # is a normal end.
        return EXIT_INTERRUPTED if signals.received else EXIT_OK
    return EXIT_OK if status in ("finished", "deleted") else EXIT_FAILED


# -- runs, export ---------------------------------------------------------------------------


def runs(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        found = store.list_runs(status=args.status, sweep_id=args.sweep)
        where = terminal_text(store.path)
    if args.csv:
        frame = runs_frame(found)
        if args.csv == "-":
            to_csv(frame, sys.stdout)
            return EXIT_OK
        to_csv(frame, args.csv)
        print(f"wrote {len(frame)} runs to {terminal_text(args.csv)}", file=sys.stderr)
        return EXIT_OK  # the file was asked for, not the table as well
    if args.json:
        print_json([run_row(r) for r in found])
        return EXIT_OK
    if not found:
        print(f"no runs in {where}", file=sys.stderr)
        return EXIT_OK
    print_runs(found)
    return EXIT_OK


def print_runs(found: list[RunRecord]) -> None:
    """The runs as a table (``runs``, and the trials at a sweep's end): a trial cancelled
    before its turn reads "not started"."""
    envs = [terminal_text(r.config.get("env_id", "")) for r in found]
    wide = max(len("ENV"), *map(len, envs))
    print(f"{'RUN_ID':<12}  {'STATUS':<11}  ALGO  {'ENV':<{wide}}  {'ENV_STEPS':>11}  "
          f"{'RETURN':>9}  {'SOLVED':<6}  NAME")  # fmt: skip
    for run, env in zip(found, envs, strict=True):
        status = run.shown_status
        print(
            f"{run.id:<12}  {status:<11}  {value_text('algo', stored_algo(run.config)):<4}  "
            f"{env:<{wide}}  {run.env_steps:>11,}  {_fmt(run.summary.final_return, '9.2f'):>9}  "
            f"{_fmt(run.summary.solved_state):<6}  {terminal_text(run.name)}"
        )


def export(args: argparse.Namespace) -> int:
    with open_existing_store(args) as store:
        store.get_run(args.run_id)  # StoreError if unknown
        frame = store.metrics(args.run_id) if args.long else store.metrics_wide(args.run_id)
    if args.csv == "-":
        to_csv(frame, sys.stdout)
    else:
        to_csv(frame, args.csv)
        print(f"wrote {len(frame)} rows to {terminal_text(args.csv)}", file=sys.stderr)
    return EXIT_OK


# -- sweep ----------------------------------------------------------------------------------


def _grid(args: argparse.Namespace) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}

    def add(name: str, values: list[Any], source: str) -> None:
        spec = field_spec(name)
        if spec.name in grid:
            raise UsageError(f"{source}: {spec.label} is already a grid axis (given twice)")
        if hasattr(args, spec.name):
            raise UsageError(
                f"{source} conflicts with {spec.flags[0]}: give {spec.label} either as one value "
                "or as a grid axis"
            )
        grid[spec.name] = values

    if args.lambdas is not None:
        add("lambda_", list(args.lambdas), "--lambdas")
    if args.gammas is not None:
        add("gamma", list(args.gammas), "--gammas")
    if args.seeds is not None:
        if refused := [s for s in args.seeds if isinstance(s, Unread)]:  # (the seed's parser)
            raise UsageError(f"--seeds: {refused[0].message}")
        add("seed", list(args.seeds), "--seeds")
    for axis in args.grid:
        name, sep, raw = axis.partition("=")
        if not sep or not raw.strip():
            raise UsageError(f"--grid expects FIELD=V1,V2; got {axis!r}")
        try:
            spec = field_spec(name)
        except ConfigError as exc:
            raise UsageError(f"--grid: {exc}") from None
        try:
            values = [spec.parse(item) for item in raw.split(",")]
        except ConfigError as exc:
            raise UsageError(f"--grid {spec.name}: {exc}") from None
        add(spec.name, values, f"--grid {spec.name}")
    if not grid:
        raise UsageError("a sweep needs at least one of --lambdas, --gammas, --seeds, --grid")
    return grid


def sweep(args: argparse.Namespace) -> int:
    from gae_core.runs.backends import DEFAULT_MEMBERS, backend_factory
    from gae_core.runs.gather import population_capacity
    from gae_core.runs.sweep import (
        MOST_WORKERS,
        SweepProgress,
        check_sweep_name,
        expand_grid,
        hold_critic_target,
        start_sweep,
    )

    grid = _grid(args)
    # as start_sweep checks them, with the config flags' problems, before a line, a bar, a
    # store or a sweep exists
    problems = [f"--{name}: {problem}" for name, value, low, high in (
        ("workers", args.workers, 1, MOST_WORKERS), ("retries", args.retries, 0, 10))
        if value is not None and (problem := int_problem(name, value, low, high))]  # fmt: skip
    try:
        like = like_base(args)
        base = config_from_args(args, like)
    except ConfigError as exc:
        problems = [*str(exc).splitlines(), *problems]
    if problems:
        raise UsageError("\n".join(problems))
    members = DEFAULT_MEMBERS if args.population is None else args.population
    try:
        backend = backend_factory(args.backend, args.address, members=members)
    except ConfigError as exc:
        text = f"--{exc}".replace("--members", "--population")
        flag, _, rest = text.partition(" ")  # as every flag's message: "--population: …"
        raise UsageError(f"{flag.rstrip(':')}: {rest}") from None
    held = base if hasattr(args, "critic_target") else hold_critic_target(base, grid)
    trials = expand_grid(held, grid)  # ConfigError (exit 2) before a store, a bar or a sweep
    if args.name:  # as start_sweep checks it, before a store, a bar or a sweep exists
        try:
            check_sweep_name(args.name, held, grid)
        except ValueError as exc:  # empty, too long for the grid, not UTF-8
            raise UsageError(f"--name: {exc}") from None
    if held != base:
        lam = label("lambda_")
        print(
            f"{lam} study: every trial's critic regresses on {lam}-returns with "
            f"{assignment('lambda_', held.critic_lambda)} (--critic-target advantage_lambda to "
            f"let it follow {lam})",
            file=sys.stderr,
        )
    base = held
    notes = [*like_notes(args, like, base), *idle_flag_notes(args, *trials),  # idle in all
             *flag_notes(*trials)]  # fmt: skip
    if args.backend == "ray":  # in this thread, not the sweep's (ray_pool.connect: a faster
        from gae_core.runs.ray_pool import connect  # exit), before a store or a bar

        try:
            connect(args.address)
        except Exception as exc:  # before a sweep exists: one line, exit 1
            where = "a local Ray" if args.address is None else f"Ray at {args.address}"
            why = " ".join(str(exc).split()) or "no message"
            print(f"error: could not start or join {terminal_text(where)}: "
                  f"{type(exc).__name__}: {terminal_text(why)}", file=sys.stderr)  # fmt: skip
            return EXIT_FAILED
    store = open_store(args)  # (its errors alone: the notes once it is open)
    for note in notes:
        print(note, file=sys.stderr)
    bar = progress_bar(100, args.no_progress, unit="%")
    shown = [0]

    def on_progress(progress: SweepProgress) -> None:
        percent = int(progress.fraction * 100)
        bar.update(percent - shown[0])
        shown[0] = percent
        counts = progress.counts
        bar.set_postfix_str(
            f"{progress.done}/{progress.total} ended, {counts['running']} running, "
            f"{counts['failed']} failed",
            refresh=False,
        )

    started = time.monotonic()
    handle = start_sweep(
        store,
        base,
        grid,
        workers=args.workers,
        name=args.name,
        on_progress=on_progress,
        retries=args.retries,
        backend=backend,
    )
    print(
        f"sweep {handle.sweep_id}: {len(handle.run_ids)} trial"
        f"{'' if len(handle.run_ids) == 1 else 's'} on {handle.workers} {args.backend} worker"
        f"{'' if handle.workers == 1 else 's'} "
        f"in {terminal_text(store.path)}",
        file=sys.stderr,
        flush=True,
    )
    cancel = threading.Event()
    with StopOnSignal(cancel, "cancelling the sweep (Ctrl-C again to abort)…"):
        while not handle.wait(0.2):
            if cancel.is_set():
                handle.cancel()
    bar.close()
    wall = time.monotonic() - started
    progress = handle.progress()
    record = store.get_sweep(handle.sweep_id)
    if progress.status == "running":  # the store could not record the end (a full disk)
        progress = dataclasses.replace(progress, status=handle.status or "failed")
        record = dataclasses.replace(record, error=handle.error)
    found = [store.get_run(r) for r in handle.run_ids if store.run_exists(r)]
    result = {
        "sweep_id": handle.sweep_id,
        "name": record.name,
        "status": progress.status,
        "error": record.error,
        "workers": handle.workers,
        "backend": args.backend,
        # the most trials one worker trained at once (the cap, spread over the workers)
        "population": population_capacity(members, progress.total, handle.workers),
        "total": progress.total,
        "counts": progress.counts,
        "wall_seconds": wall,
        "grid": grid,
        "runs": [run_row(r) for r in found],
        "summary": _summary(store, handle.sweep_id, grid) if grid else [],
    }
    store.close()
    if args.json:
        print_json(result)
    else:
        if found:
            print_runs(found)
        ended = dict(progress.counts)  # a trial cancelled before its turn: not "stopped"
        if never := sum(run.never_started for run in found):
            ended["stopped"] -= never
            ended[NOT_STARTED] = never
        counts = ", ".join(f"{n} {status}" for status, n in ended.items() if n)
        print(f"sweep {handle.sweep_id} {progress.status} in {wall:.1f} s: {counts or 'no trials'}")
        if record.error:
            print(terminal_text(record.error), file=sys.stderr)
    # 130 for a cancel of the whole sweep (Ctrl-C); a trial stopped alone is no failure
    if progress.status == "cancelled" or cancel.is_set():
        return EXIT_INTERRUPTED
    counts = progress.counts
    clean = progress.status == "finished" and counts["failed"] == counts["interrupted"] == 0
    return EXIT_OK if clean else EXIT_FAILED
