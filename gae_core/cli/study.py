"""The CLI's study commands: ``lab`` (the estimator lab) and ``summary`` (a sweep's statistics)."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from gae_core.cli.commands import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    StopOnSignal,
    UsageError,
    print_json,
    progress_bar,
)
from gae_core.cli.flags import field_named
from gae_core.cli.stores import open_existing_store, open_store
from gae_core.errors import ConfigError
from gae_core.inert import terminal_text
from gae_core.labels import MISSING, assignment, format_value, label, value_text

#: The lab's flags that only one of its views reads (the others: both).
VIEW_FLAGS = {
    "per-state": ("states", "rollouts", "continuations", "segment"),
    "gradient": ("batches", "batch_size", "reference"),
}


def _given(args: argparse.Namespace, view: str) -> dict[str, Any]:
    """The flags of ``view`` (a key of :data:`VIEW_FLAGS`) given on the command line (the rest
    take the settings' defaults); a note on stderr for each flag of the other view, which this
    one ignores."""
    names = VIEW_FLAGS[view]
    (other,) = (flags for key, flags in VIEW_FLAGS.items() if key != view)
    words = "without --gradient" if view == "per-state" else "with --gradient"
    for name in other:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            print(f"note: {flag} has no effect {words} (a setting of the other view)",
                  file=sys.stderr)  # fmt: skip
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _lab_options(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The run (StoreError, exit 1, for an unknown id; an env it cannot build here, exit 2)
    and the settings both lab views share: γ (default: the run's), seed, and the λ and k grids
    when given."""
    from gae_core.lab.jobs import check_run_env

    with open_existing_store(args) as probe:
        run = probe.get_run(args.run_id)
    check_run_env(run)
    options: dict[str, Any] = {
        "gamma": run.config.get("gamma", 0.99) if args.gamma is None else args.gamma,
        "seed": args.seed,
    }
    if args.lambdas is not None:
        options["lambdas"] = tuple(args.lambdas)
    if args.ks is not None:
        options["ks"] = tuple(args.ks)
    return run, options


class _PercentBar:
    """A lab's progress on stderr in whole percent, the bar made at the first report (an error
    before it stays one line)."""

    def __init__(self, hidden: bool) -> None:
        self.hidden, self.bar, self.shown = hidden, None, 0

    def __call__(self, fraction: float) -> None:
        if self.bar is None:
            self.bar = progress_bar(100, self.hidden, unit="%")
        percent = int(fraction * 100)
        self.bar.update(percent - self.shown)
        self.shown = percent

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def lab(args: argparse.Namespace) -> int:
    if args.gradient:
        return _gradient(args)
    from gae_core.lab.jobs import measure_run
    from gae_core.lab.measure import (
        BIAS2_NOTE,
        GSDE_NOTE,
        LabCancelled,
        LabSettings,
        check_memory,
    )

    run, options = _lab_options(args)
    settings = LabSettings(
        **options, **_given(args, "per-state")
    )  # ValueError naming the field (exit 2)
    # settings past the lab's memory limit: LabTooLarge, one line naming the fields (exit 2)
    check_memory(run.config["env_id"], settings, critics=len(args.critic_step or (None,)))
    if run.config.get("use_sde"):
        print(GSDE_NOTE, file=sys.stderr)
    store = open_store(args)
    progress = _PercentBar(args.no_progress)
    cancel = threading.Event()
    try:
        with StopOnSignal(cancel, "cancelling the lab (nothing is stored)…"):
            saved = measure_run(
                store,
                args.run_id,
                policy_step=args.policy_step,
                critic_steps=args.critic_step or (None,),
                settings=settings,
                progress=progress,
                cancel=cancel,
            )
    except LabCancelled:
        print("lab cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        progress.close()
        store.close()
    reports = [lab_report(result_id, result) for result_id, result in saved]
    if args.json:
        # the first critic's figures at the top (one critic: the whole object), every
        # critic's under "critics" when several were measured
        print_json(reports[0] if len(reports) == 1 else {**reports[0], "critics": reports})
        return EXIT_OK
    for report, (_, result) in zip(reports, saved, strict=True):
        print(
            f"lab {report['result_id']}: policy step {report['policy_step']:,}, critic step "
            f"{report['critic_step']:,}, {report['states']} states, {report['seconds']:.1f} s"
        )
        level = f"{report['confidence'] * 100:g} %"
        print(f"{'estimator':<16}{'bias²':>12}{'variance':>12}{'MSE':>12}  MSE {level} CI")
        for row in (
            [{"estimator": "δ", **report["delta"]}]
            + [{"estimator": f"Â^({r['k']})", **r} for r in report["ks"]]
            + [
                {"estimator": f"GAE {assignment('lambda_', r['lambda'])}", **r}
                for r in report["lambdas"]
            ]
        ):
            print(
                f"{row['estimator']:<16}{row['bias2']:>12.4g}{row['variance']:>12.4g}"
                f"{row['mse']:>12.4g}  [{row['ci_low']:.4g}, {row['ci_high']:.4g}]"
            )
        print(f"{result.sentence()}.")  # what the page says under the same numbers
        offsets = result.states["offset"]
        print(f"V^π(s) − V̂(s), a state-only offset that does not bias the policy gradient: "
              f"mean {offsets.mean():.4g}, mean |·| {offsets.abs().mean():.4g} over the "
              f"{len(offsets)} state{'' if len(offsets) == 1 else 's'}")  # fmt: skip
        if report["horizon_note"]:
            print(report["horizon_note"])
    print(f"note: {BIAS2_NOTE}.")
    return EXIT_OK


def _gradient(args: argparse.Namespace) -> int:
    """``lab RUN --gradient``: :func:`gae_core.lab.jobs.measure_gradient_run`."""
    from gae_core.lab.gradient import DEBIASED_NOTE, gradient_sentence
    from gae_core.lab.jobs import measure_gradient_run
    from gae_core.lab.measure import LabCancelled
    from gae_core.lab.settings import GradientSettings

    run, options = _lab_options(args)
    settings = GradientSettings(
        **options, **_given(args, "gradient")
    )  # ValueError naming each field (exit 2)
    if run.config.get("use_sde"):
        from gae_core.lab.measure import GSDE_NOTE

        print(GSDE_NOTE, file=sys.stderr)
    store = open_store(args)
    progress = _PercentBar(args.no_progress)
    cancel = threading.Event()
    try:
        with StopOnSignal(cancel, "cancelling the lab (nothing is stored)…"):
            result_id, result = measure_gradient_run(
                store, args.run_id, policy_step=args.policy_step,
                critic_steps=args.critic_step or (None,), settings=settings,
                progress=progress, cancel=cancel,
            )  # fmt: skip
    except LabCancelled:
        print("lab cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        progress.close()
        store.close()
    report = gradient_report(result_id, result)
    if args.json:
        print_json(report)
        return EXIT_OK
    ref = report["reference"]
    print(
        f"gradient lens {result_id}: policy step {report['policy_step']:,}, "
        f"{report['batches']} batches of {report['batch_size']:,} samples "
        f"({report['samples_per_batch']:,} each after the reset rows), reference of "
        f"{ref['samples']:,} samples (standard error {ref['standard_error']:.4g}, norm "
        f"{ref['norm']:.4g}), {report['seconds']:.1f} s"
    )
    for critic in report["critics"]:
        print(f"\n{critic['critic']}")
        print(f"{'estimator':<14}{'cosine [CI]':<26}{'pairwise':>10}{'bias²':>12}"
              f"{'variance':>12}{'MSE':>12}{'SNR':>9}")  # fmt: skip
        rows = [(f"GAE {assignment('lambda_', r['lambda'])}", r) for r in critic["lambdas"]]
        rows += [(f"Â^({r['k']})", r) for r in critic["ks"]]
        for name, r in rows:
            cosine = f"{r['cosine']:.3f} [{r['cosine_ci_low']:.3f}, {r['cosine_ci_high']:.3f}]"
            print(f"{name:<14}{cosine:<26}{r['pairwise_cosine']:>10.3f}{r['bias2']:>12.4g}"
                  f"{r['variance']:>12.4g}{r['mse']:>12.4g}{r['snr']:>9.3g}")  # fmt: skip
        print(f"{gradient_sentence(result.table, critic['critic'])}.")  # as the page says
    for note in ("reference_note", "tail_note"):
        if report[note]:
            print(f"\n{report[note]}")
    print(f"note: {DEBIASED_NOTE}.")
    return EXIT_OK


def gradient_report(result_id: str, result: Any) -> dict[str, Any]:
    """The ``lab --gradient --json`` object: the first critic's ``lambdas`` and ``ks`` rows at
    the top (``cosine``, ``cosine_ci_low``, ``cosine_ci_high``, ``pairwise_cosine``, ``bias2``,
    ``variance``, ``mse``, ``snr``, each with its interval), every critic's under ``critics``,
    and ``reference`` (its samples, noise, standard error and norm)."""
    from gae_core.lab.gradient import QUANTITIES

    def rows(frame: Any, kind: str, key: str) -> list[dict[str, Any]]:
        part = frame[frame["kind"] == kind]
        out = []
        for r in part.to_dict("records"):
            row: dict[str, Any] = {key: int(r["param"]) if key == "k" else float(r["param"])}
            for q in QUANTITIES:
                for suffix in ("", "_ci_low", "_ci_high"):
                    value = float(r[q + suffix])
                    row[q + suffix] = value if value == value else None  # NaN → null
            out.append(row)
        return out

    critics = []
    for name, frame in result.table.groupby("critic", sort=False):
        critics.append({"critic": name, "best_lambda": result.best_lambda(name),
                        "lambdas": rows(frame, "gae", "lambda"),
                        "ks": rows(frame, "k_step", "k")})  # fmt: skip
    return {
        "result_id": result_id,
        **result.meta,
        "env_id": result.env_id,
        "batches": result.settings.batches,
        "batch_size": result.batch["envs"] * result.batch["steps"],
        "samples_per_batch": result.batch["samples"],
        "confidence": result.settings.confidence,
        "seconds": result.seconds,
        "reference": result.reference,
        "reference_note": result.reference_note(),
        "tail_note": result.tail_note(),
        "best_lambda": critics[0]["best_lambda"],
        "lambdas": critics[0]["lambdas"],
        "ks": critics[0]["ks"],
        "critics": critics,
    }


def lab_report(result_id: str, result: Any) -> dict[str, Any]:
    """The ``lab --json`` object: per λ and per k, bias², variance and MSE with bootstrap
    intervals across states at the measurement's ``confidence`` (``ci_low``/``ci_high``: the
    MSE's; ``bias2_ci_*``, ``variance_ci_*`` the others'), and each state's V^π − V̂
    (``state_offsets``)."""
    frame = result.estimators

    def rows(kind: str, key: str) -> list[dict[str, Any]]:
        part = frame[frame["kind"] == kind]
        return [
            {
                key: int(r.param) if key == "k" else float(r.param),
                "bias2": float(r.bias2),
                "variance": float(r.variance),
                "mse": float(r.mse),
                "ci_low": float(r.mse_ci_low),
                "ci_high": float(r.mse_ci_high),
                "bias2_ci_low": float(r.bias2_ci_low),
                "bias2_ci_high": float(r.bias2_ci_high),
                "variance_ci_low": float(r.variance_ci_low),
                "variance_ci_high": float(r.variance_ci_high),
            }
            for r in part.itertuples()
        ]

    return {
        "result_id": result_id,
        **result.meta,
        "env_id": result.env_id,
        "states": len(result.states),
        "seconds": result.seconds,
        "confidence": result.settings.confidence,
        "horizon": result.horizon,
        "discount_left": result.discount_left,
        "tail": result.tail,  # a rollout running at H ended with γ^H V̂(s_H), the policy's critic
        "horizon_note": result.horizon_note(),
        "best_lambda": result.best_lambda(),
        # V^π(s) − V̂(s) per state: reported apart, as it does not bias the policy gradient
        "state_offsets": [float(x) for x in result.states["offset"]],
        "delta": {k: v for k, v in rows("delta", "k")[0].items() if k != "k"},
        "lambdas": rows("gae", "lambda"),
        "ks": rows("k_step", "k"),
    }


def summary(args: argparse.Namespace) -> int:
    """A sweep's per-group statistics (the λ comparison's numbers) as a table or JSON, with
    what they were made from (:mod:`gae_core.insight.provenance`); for a two-axis study (or
    with ``--second``) also the grid of one score (:mod:`gae_core.insight.grid`)."""
    with open_existing_store(args) as store:
        sweep = store.get_sweep(args.sweep_id)  # StoreError (exit 1) for an unknown id
        # scipy.stats (0.9 s to import) only for the commands that print statistics
        from gae_core.insight import stats
        from gae_core.insight.compare import (
            RANKED_SCORES,
            distinct_runs,
            episodes_frame,
            group_scores,
            group_sentences,
            summary_records,
            summary_table,
        )
        from gae_core.insight.compare_notes import comparison_notes
        from gae_core.insight.grid import cell_records, cell_table, check_axes, study_axes
        from gae_core.insight.provenance import methods_record, methods_text

        try:  # a field by its name or its flag's (--group lambda)
            asked, args.second = (None if v is None else field_named(f, v) for f, v in
                                  (("--group", args.group), ("--second", args.second)))  # fmt: skip
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        first, other = study_axes(sweep.grid)
        group = asked or first
        # the sweep's other axis: with --group naming one of its two, the remaining one
        second = args.second or next((a for a in (first, other) if a and a != group), None)
        if second is not None and second not in sweep.grid and args.second is None:
            second = None
        if second is not None:
            try:
                check_axes(group, second)
            except ValueError as exc:
                raise UsageError(f"--{exc}") from None
        runs, repeats = distinct_runs(store.list_runs(sweep_id=args.sweep_id), group)
        also = (second,) if second else ()
        episodes = episodes_frame(store, [r.id for r in runs], group, also=also)
        used = set(episodes["run_id"])
        methods = methods_record([r for r in runs if r.id in used], group, repeats=repeats)
    if episodes.empty:
        print(f"sweep {args.sweep_id} has no finished episode yet", file=sys.stderr)
        return EXIT_OK
    threshold = runs[0].summary.reward_threshold if runs else None
    records = summary_records(summary_table(episodes, group=group, threshold=threshold), group)
    # what the comparison page says beside its table (runs short of their budget, budgets that
    # differ, too few seeds, final returns spanning most of training) and which group is best
    # on each score
    notes = comparison_notes(runs, episodes, group)
    sentences = group_sentences(group_scores(episodes, group), group)
    cells, score = None, args.score or "final_return"
    if second is None and args.score is not None:
        print(f"note: --score scores a two-axis grid; this sweep has one axis ({label(group)}), "
              "so the table gives final return and AUC", file=sys.stderr)  # fmt: skip
    if second is not None:
        try:
            cells = cell_table(episodes, group, second, score=score, threshold=threshold)
        except ValueError as exc:  # steps_to_threshold on an env without a threshold
            raise UsageError(f"--score: {exc}") from None
    if args.json:
        report: dict[str, Any] = {"sweep_id": args.sweep_id, "group": group, "summary": records,
                                  "notes": notes, "best": sentences}  # fmt: skip
        if cells is not None:
            report["grid"] = {"x": group, "y": second, "score": score,
                              "cells": cell_records(cells, group, second)}  # fmt: skip
        print_json(report | {"methods": methods})
        return EXIT_OK
    name = terminal_text(sweep.name)
    print(f"sweep {args.sweep_id} ({name}): {stats.INTERVAL_DEFINITION}")
    columns = ("final return IQM", "final return mean", "AUC IQM", "AUC mean")
    several = any(e["runs"] != e["seeds"] for e in records)  # a seed's runs averaged
    counts = f"{'seeds':>6}" + (f"{'runs':>6}" if several else "")
    rows = []
    for entry in records:
        final, auc = entry["final_return"], entry["auc"]
        cells_ = [_cell(final, "iqm"), _cell(final, "mean"), _cell(auc, "iqm"), _cell(auc, "mean")]
        seeds = f"{entry['seeds']:>6}" + (f"{entry['runs']:>6}" if several else "")
        rows.append((f"{value_text(group, entry['value']):>10}{seeds}  ", cells_))
    heads = [f"{c} [CI]" for c in columns]
    width = 2 + max(len(c) for c in heads + [c for _, cells_ in rows for c in cells_])
    print((f"{label(group):>10}{counts}  " + "".join(f"{c:<{width}}" for c in heads)).rstrip())
    for lead, cells_ in rows:  # as wide as the widest cell: one seed's words are long
        print((lead + "".join(f"{c:<{width}}" for c in cells_)).rstrip())
    for score, sentence in sentences.items():
        print(f"{RANKED_SCORES[score]}: {sentence}.")
    for note in notes:
        print(f"note: {note}")
    if cells is not None:
        _print_grid(cells, group, second, score)
    print(f"\nmethods: {terminal_text(methods_text(methods))}")
    return EXIT_OK


def _print_grid(cells: Any, x: str, y: str, score: str) -> None:
    """The two-axis grid: rows ``y``, columns ``x``, each cell ``IQM [low, high]`` marked."""
    from gae_core.insight.grid import MARKS, SCORES, axis_values, best_cell_sentence
    from gae_core.insight.stats import estimate_text

    xs, ys = axis_values(cells, x), axis_values(cells, y)
    by = {(r[x], r[y]): r for r in cells.to_dict("records")}
    print(f"\n{label(y)} × {label(x)}: IQM of {SCORES[score][0]} [CI]")
    grid = []
    for yv in ys:
        row = []
        for xv in xs:
            r = by.get((xv, yv))
            if r is None:
                row.append(MISSING)
                continue
            mark = "★" if r["best"] else "≈" if r["not_distinguishable"] else ""
            row.append(mark + estimate_text(r["iqm"], r["iqm_ci_low"], r["iqm_ci_high"]))
        grid.append(row)
    width = 2 + max(len(c) for c in [*(format_value(v) for v in xs), *(c for r in grid for c in r)])
    heads = "".join(f"{format_value(v):<{width}}" for v in xs)
    print(f"{label(y) + ' / ' + label(x):>10}  " + heads)
    for yv, row in zip(ys, grid, strict=True):
        print((f"{format_value(yv):>10}  " + "".join(f"{c:<{width}}" for c in row)).rstrip())
    print(best_cell_sentence(cells, x, y, assignment) + ".")
    print(" ".join(MARKS.values()))


def _cell(score: dict[str, Any], name: str) -> str:
    from gae_core.insight.stats import estimate_text  # scipy: imported when a table is printed

    return estimate_text(score[name], score[f"{name}_ci_low"], score[f"{name}_ci_high"])
