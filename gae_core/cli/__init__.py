"""Command line: ``python -m gae_core [--data-dir DIR] {train,runs,export,sweep,...}``.

Every ``TrainConfig`` field is a flag of ``train`` and ``sweep``, generated from its
:class:`~gae_core.agent.config.FieldSpec` (``lambda_`` is ``--lambda``, ``env_id`` is ``--env``)
and parsed by the same spec that reads ``sweep --grid`` values and the form's text boxes.

Exit codes: 0 success, 1 the run or sweep failed (or something was not found, or the store is
unusable: the message names the path), 2 bad usage or a bad config value (the message names the
field and its range), 130 stopped with Ctrl-C or SIGTERM (the data so far is kept; a second
Ctrl-C aborts at once, with no JSON). With ``--json`` the last line on stdout is one JSON object
(``runs --json``: one JSON array); progress bars and messages go to stderr. Names typed by users are
printed without control characters, and so are paths (the data folder's among them) and error
messages.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gae_core.agent.config import FIELD_SPECS
from gae_core.cli import commands, manage, study
from gae_core.cli.flags import (
    RUN_ID_WORDS,
    add_config_flags,
    env_modules_named,
    flag_type,
    name_flag,
)
from gae_core.env_modules import ENV_MODULES_VAR, use_env_modules
from gae_core.errors import ConfigError, StoreError
from gae_core.inert import terminal_text
from gae_core.lab.settings import GradientSettings, LabSettings
from gae_core.labels import label
from gae_core.runs.backends import BACKENDS, DEFAULT_MEMBERS
from gae_core.storage.records import STATUSES
from gae_core.storage.store import DATA_ENV_VAR

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    lam, gam = label("lambda_"), label("gamma")
    data_dir = argparse.ArgumentParser(add_help=False)
    modules = argparse.ArgumentParser(add_help=False)
    env_module_help = (
        "import PKG first: a module that registers gymnasium envs (repeatable; workers import "
        f"it too). The dashboard reads ${ENV_MODULES_VAR}=pkg1,pkg2 instead"
    )
    # before the command and after it: two lists (a subcommand's namespace would overwrite one)
    modules.add_argument("--env-module", action="append", default=[], metavar="PKG",
                         help=env_module_help)  # fmt: skip
    data_dir.add_argument(
        "--data-dir",
        default=argparse.SUPPRESS,
        help=f"folder of the run store (default: ${DATA_ENV_VAR}, else ./runs)",
    )
    parser = argparse.ArgumentParser(
        prog="python -m gae_core",
        description=f"Train A2C or PPO agents with GAE, list and export runs, {lam} × seed sweeps.",
        parents=[data_dir],
    )
    parser.add_argument("--env-module", dest="env_module_first", action="append", default=[],
                        metavar="PKG", help=env_module_help)  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser(
        "train",
        parents=[data_dir, modules],
        help="train one run in the foreground",
        description="Train one A2C or PPO run headless; Ctrl-C stops it and keeps its data.",
    )
    train.add_argument("--name", help=f"run name (default: env, {lam}, {gam} and seed)")
    train.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="print the config it would train with (each field's flag and source: the flag, "
        "--like's run, the env's preset or the default, then the whole config as one command) "
        "and exit; nothing is trained or stored",
    )
    add_config_flags(train)
    train.set_defaults(handler=commands.train)

    runs = sub.add_parser("runs", parents=[data_dir, modules], help="list runs with their status")
    runs.add_argument("--status", nargs="+", choices=STATUSES, help="only runs with these statuses")
    runs.add_argument("--sweep", help=f"only the trials of this sweep ({RUN_ID_WORDS})")
    runs.add_argument("--json", action="store_true", help="print one JSON array")
    runs.add_argument(
        "--csv",
        metavar="PATH",
        help="write the runs table as CSV ('-' for stdout), the columns of the Runs page's CSV",
    )
    runs.set_defaults(handler=commands.runs)

    export = sub.add_parser(
        "export", parents=[data_dir, modules], help="export a run's metrics as CSV"
    )
    export.add_argument("run_id", help=f"the run: {RUN_ID_WORDS}")
    export.add_argument("--csv", required=True, metavar="PATH", help="output file ('-' for stdout)")
    export.add_argument(
        "--long", action="store_true", help="long rows (env_step, wall_time, key, value)"
    )
    export.set_defaults(handler=commands.export)

    sweep = sub.add_parser(
        "sweep",
        parents=[data_dir, modules],
        help=f"run a grid of {lam} (and γ, or any field) × seeds in worker processes",
        description="Run every combination of the grid as its own run, in worker processes. "
        "Ctrl-C cancels: pending trials are skipped, running ones stop; data is kept.",
    )
    sweep.add_argument("--lambdas", type=float, nargs="+", metavar="L", help=f"{lam} values")
    sweep.add_argument(
        "--gammas",
        type=float,
        nargs="+",
        metavar="G",
        help=f"γ values: with --lambdas, a γ × {lam} study (summary and the compare page draw "
        "it as a heat map)",
    )
    sweep.add_argument("--seeds", type=flag_type(FIELD_SPECS["seed"]), nargs="+", metavar="S")
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
    sweep.add_argument(
        "--retries", type=int, default=1, help="restarts of a trial whose worker died (default 1)"
    )
    sweep.add_argument("--name", help="sweep name")
    sweep.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="where trials train: local worker processes (default) or Ray tasks "
        "(pip install -r requirements-ray.txt)",
    )
    sweep.add_argument(
        "--address",
        default=None,
        help="with --backend ray: a running Ray cluster's address (default: start a local Ray)",
    )
    sweep.add_argument(
        "--population",
        type=int,
        default=None,
        metavar="N",
        help="train up to N trials per worker process (or Ray task) as one batched population "
        f"(default {DEFAULT_MEMBERS}; consecutive batches of trials / workers). Each trial is "
        "still its own run, identical in distribution to training it alone but not bit for "
        "bit; 1 trains each trial alone. Trials share a population when they share the env, the "
        "algorithm and the network's shape (gae_core.agent.trainer.SHARED).",
    )
    sweep.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_config_flags(sweep)
    sweep.set_defaults(handler=commands.sweep)

    lab = sub.add_parser(
        "lab",
        parents=[data_dir, modules],
        help=f"measure bias², variance and MSE of δ, Â^(k) and GAE({lam}) on a run's checkpoint",
        description="The estimator lab: Monte-Carlo truth Q^π(s,a) − V̂(s) for states sampled "
        "from the policy, K continuations per state, every estimator at their first row. The "
        "result is stored with the run (the dashboard's Estimator lab page lists it).",
    )
    lab.add_argument("run_id", help=f"the run: {RUN_ID_WORDS}")
    lab.add_argument("--policy-step", type=int, help="policy checkpoint (default: latest)")
    lab.add_argument(
        "--critic-step",
        type=int,
        action="append",
        help="critic checkpoint (default: the policy's own); repeat to compare critics (--json: "
        "the first one's figures on top, every critic's under 'critics')",
    )
    lab.add_argument("--gamma", type=float, help=f"discount {gam} in [0, 1) (default: the run's)")
    per_state = {"states": "states sampled, N", "rollouts": "truth rollouts per state, M",
                 "continuations": "continuations per state, K",
                 "segment": "continuation length L"}  # fmt: skip
    for name, words in per_state.items():  # (defaults: LabSettings's, where the lab reads them)
        lab.add_argument(f"--{name}", type=int,
                         help=f"{words} (default {getattr(LabSettings, name)})")  # fmt: skip
    lab.add_argument("--lambdas", type=float, nargs="+", help=f"{lam} grid (default 0, 0.01, …, 1)")
    lab.add_argument(
        "--ks",
        type=int,
        nargs="+",
        help="k-step horizons (default 1, 2, 4, … 256, those past L as L)",
    )
    lab.add_argument("--seed", type=int, default=0)
    lab.add_argument(
        "--gradient",
        action="store_true",
        help="the gradient lens instead of the per-state view: per estimator, the batch "
        "policy gradient's cosine to a Monte-Carlo reference gradient, pairwise cosine between "
        "batches, bias², variance, MSE and SNR, with bootstrap intervals over batches",
    )
    lab.add_argument(
        "--batches",
        type=int,
        help=f"--gradient: independent batches, K (default {GradientSettings.batches})",
    )
    lab.add_argument(
        "--batch-size",
        type=int,
        help="--gradient: samples per batch (default: the run's num_envs × rollout_steps)",
    )
    lab.add_argument(
        "--reference",
        type=int,
        help="--gradient: at least this many samples of the reference gradient, in whole "
        "episodes (default "
        f"{GradientSettings.reference:,})",
    )
    lab.add_argument("--json", action="store_true", help="end stdout with one JSON object")
    lab.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    lab.set_defaults(handler=study.lab)

    summary = sub.add_parser(
        "summary",
        parents=[data_dir, modules],
        help="a sweep's statistics per group: IQM and mean of final return and AUC with CIs, "
        f"the two-axis grid of a γ × {lam} study, and the methods that made them",
    )
    summary.add_argument("sweep_id", help=f"the sweep: {RUN_ID_WORDS}")
    summary.add_argument(
        "--group",
        help="config field to group by, by its name or its flag's (lambda_ or lambda; default: "
        f"the sweep's first axis, {lam})",
    )
    summary.add_argument(
        "--second",
        metavar="FIELD",
        help="a second grid axis: print the two-axis grid, each cell's IQM with its interval, "
        "the best cell and those not distinguishable from it (default: the sweep's other "
        "axis, if it has two)",
    )
    summary.add_argument(
        "--score",
        choices=("final_return", "auc", "steps_to_threshold"),
        help="the two-axis grid's score (default final_return; a sweep of one axis: a note)",
    )
    summary.add_argument("--json", action="store_true", help="print one JSON object")
    summary.set_defaults(handler=study.summary)

    stop = sub.add_parser("stop", parents=[data_dir, modules], help="ask a running run to stop")
    stop.add_argument("run_id", help=f"the run: {RUN_ID_WORDS}")
    stop.set_defaults(handler=manage.stop)

    rename = sub.add_parser("rename", parents=[data_dir, modules], help="rename a run")
    rename.add_argument("run_id", help=f"the run: {RUN_ID_WORDS}")
    rename.add_argument("name")
    rename.set_defaults(handler=manage.rename)

    delete = sub.add_parser("delete", parents=[data_dir, modules], help="delete a run and its data")
    delete.add_argument("run_id", help=f"the run: {RUN_ID_WORDS}")
    delete.add_argument(
        "--force", action="store_true", help="even if it is active: stop it first, then delete"
    )
    delete.set_defaults(handler=manage.delete)
    # no abbreviated flags: argparse read `train --lr 3e-4` as --lr-schedule (the one flag
    # starting so), and a flag added later would change what an abbreviation means
    for command in (parser, *sub.choices.values()):
        command.allow_abbrev = False
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return commands.EXIT_USAGE
    try:
        named = env_modules_named(args)
        if named:
            use_env_modules(named)  # EnvModuleError (a ValueError): one line, exit 2
        return handler(args)
    except (ConfigError, commands.UsageError, ValueError) as exc:
        for line in str(exc).splitlines() or [""]:  # every problem named: one line each
            print(f"error: {terminal_text(name_flag(line))}", file=sys.stderr)
        return commands.EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return commands.EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`
        sys.stderr.close()
        return commands.EXIT_OK
    except (StoreError, OSError) as exc:
        print(f"error: {terminal_text(exc)}", file=sys.stderr)
        return commands.EXIT_FAILED
