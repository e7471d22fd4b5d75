"""What a comparison's figures were made from, so that a reader can check or redo them: the
runs they use and their seeds, the config those runs share, what else varies (crossed with the
grouped field alike in every group, or a confound), how the statistics are computed and with
which settings, the code each run was created with (stored with the run since schema 4: the
code of the process that created it, which local workers share; a Ray node runs what it has
installed) and the code that computed the statistics (the git commit when it runs from a
checkout).

The λ comparison page shows it under its summary (a paragraph for a paper's methods section,
and the record as JSON), and ``python -m gae_core summary`` prints it.
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gae_core import metrics as M
from gae_core.agent.config import BOOKKEEPING_FIELDS, FIELD_SPECS
from gae_core.insight import stats
from gae_core.insight.compare import CURVE_POINTS, SHARED_SEED, effective_config
from gae_core.insight.compare import completed_config as _complete
from gae_core.labels import algorithm_name, format_value, label
from gae_core.outcome import SOLVED_WINDOW
from gae_core.version import loaded_version

__all__ = ["config_spread", "csv_made_by", "is_confound", "methods_record", "methods_text"]


def _order(value: Any) -> tuple:
    """Numbers by value, then lists of numbers by their numbers (``16x16`` before
    ``128x128``), then anything else by its repr (strings, None)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return (0, float(value), (), "")
    if isinstance(value, list | tuple) and all(isinstance(v, numbers.Real) for v in value):
        return (1, 0.0, tuple(float(v) for v in value), "")
    return (2, 0.0, (), repr(value))


def config_spread(configs: Sequence[dict], group: str) -> tuple[dict, dict]:
    """``(shared, varying)`` over readable stored configs: the fields with one value in every
    config (``{field: value}``), and the fields other than ``group``, ``seed`` and
    :data:`~gae_core.agent.config.BOOKKEEPING_FIELDS` that take several
    (``{field: {"values": [...], "crossed": bool, "one_where_it_applies": bool}}``; crossed:
    every ``group`` value holds the same values of it, as many times each, so its runs are
    pooled alike in every group rather than confounded with the grouped field). A setting
    with no effect given the others reads as None
    (:func:`~gae_core.insight.compare.effective_config`); one that takes one value wherever
    it has an effect (``one_where_it_applies``: PPO's clip range beside A2C runs) varies only
    with the fields that make it idle, themselves grouped or listed, so it is no confound
    (:func:`is_confound`)."""
    configs = [c for c in (effective_config(c, keep=(group,)) for c in configs) if c is not None]
    shared, varying = {}, {}
    for field in (f for f in FIELD_SPECS if configs and f in configs[0]):
        values = {repr(c[field]): c[field] for c in configs}
        if len(values) == 1:
            shared[field] = next(iter(values.values()))
        elif field not in (group, "seed", *BOOKKEEPING_FIELDS):
            per_group: dict[str, Counter] = {}
            for c in configs:
                per_group.setdefault(repr(c.get(group)), Counter())[repr(c[field])] += 1
            crossed = len({tuple(sorted(n.items())) for n in per_group.values()}) == 1
            ordered = sorted(values.values(), key=_order)
            applied = {repr(v) for v in values.values() if v is not None}
            varying[field] = {"values": ordered, "crossed": crossed,
                              "one_where_it_applies": len(applied) == 1}  # fmt: skip
    return shared, varying


def is_confound(entry: dict[str, Any]) -> bool:
    """Whether a field :func:`config_spread` lists as varying confounds the grouped one: not
    crossed with it, and more than one value where it has an effect."""
    return not entry["crossed"] and not entry.get("one_where_it_applies", False)


def methods_record(
    runs: Sequence[Any],
    group: str,
    *,
    statistic: str | None = None,
    window: int | None = None,
    repeats: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What a comparison of ``runs`` (stored :class:`~gae_core.storage.records.RunRecord`\\ s:
    those its figures use) grouped by ``group`` was made from: the code that computed it, each
    group's seeds and its number of runs, the runs (id, group value, seed, env steps, status),
    the runs left out as ``repeats`` of another (:func:`gae_core.insight.compare.distinct_runs`:
    left-out id → the kept run's id), the shared config and what else varies, and the
    statistics with their settings; for a figure of curves also the curves' (``statistic``,
    "iqm" or "mean", across seeds of each run's running mean over ``window`` episodes)."""
    completed = [(r, _complete(r.config)) for r in runs]
    readable = [(r, c) for r, c in completed if c is not None]
    shared, varying = config_spread([c for _, c in readable], group)
    groups: dict[str, dict] = {}
    for _, config in readable:
        entry = groups.setdefault(
            repr(config[group]), {"value": config[group], "seeds": [], "runs": 0}
        )
        entry["seeds"].append(config["seed"])
        entry["runs"] += 1
    ordered = sorted(groups.values(), key=lambda g: _order(g["value"]))
    for entry in ordered:
        entry["seeds"] = sorted(set(entry["seeds"]))
    return {
        "analysis_code": loaded_version(),
        "created_with": _codes(r.code for r, _ in readable),
        "group": group,
        "groups": ordered,
        "runs": [_run_entry(r, c, group) for r, c in readable],
        "unreadable_runs": [r.id for r, c in completed if c is None],
        "repeats": dict(repeats or {}),
        "shared_config": shared,
        "also_varies": varying,
        "statistics": {**_curve(statistic, window), **_scores()},
    }


def csv_made_by(
    sweep_id: str | None, run_ids: Sequence[str], used: Sequence[str], group: str
) -> dict[str, Any]:
    """What every CSV of a comparison leads with (``made_by`` of
    :func:`~gae_core.insight.exports.with_provenance`), so a file says what it holds wherever
    it goes: the sweep its runs come from (``sweep_id``), or for runs picked one by one the
    runs its numbers use (``run_ids``, space-separated); the runs of ``run_ids`` (the sweep's
    or those picked) it leaves out (``left_out``: repeats, unfinished runs left out, runs
    without a finished episode; empty if none); the field grouping them (``group_by``) and
    the metric its scores are of. A page adds each CSV's own settings (its window, score)."""
    kept = set(used)
    where = {"sweep_id": sweep_id} if sweep_id is not None else {"run_ids": " ".join(used)}
    return {
        **where,
        "left_out": " ".join(r for r in run_ids if r not in kept),
        "group_by": group,
        "metric": M.EPISODIC_RETURN.key,
    }


def _run_entry(run: Any, config: dict, group: str) -> dict[str, Any]:
    return {"id": run.id, group: config[group], "seed": config["seed"],
            "env_steps": run.env_steps, "status": run.status, "code": run.code}  # fmt: skip


def _codes(codes: Any) -> list[dict[str, Any]]:
    """The distinct codes (``source_version()`` at creation) the runs were created with, each
    with how many runs; None for runs stored before runs recorded it."""
    seen: dict[str, dict] = {}
    for code in codes:
        key = repr(sorted(code.items())) if code else "None"
        seen.setdefault(key, {"code": code, "runs": 0})["runs"] += 1
    return list(seen.values())


def _count_text(counts: Any) -> str:
    """``4``, or ``3 to 5`` where groups differ."""
    counts = sorted(set(counts))
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def _version_text(code: dict[str, Any]) -> str:
    text = f"gae_core {code['version']}"
    if code.get("commit"):
        text += f" (commit {code['commit'][:12]}"
        text += ", with uncommitted changes)" if code.get("local_changes") else ")"
    return text


def _curve(statistic: str | None, window: int | None) -> dict[str, Any]:
    if statistic is None:
        return {}
    name = {"iqm": "IQM", "mean": "mean"}[statistic]
    return {
        "curve": f"the {name} across seeds of each run's running mean of episodic return over "
        f"{window} episodes, with the interval below at every grid point",
        "running_mean_episodes": window,
    }


def _scores() -> dict[str, Any]:
    return {
        "grid": f"{CURVE_POINTS} points in env steps from 0 to the shortest run's last "
        "finished episode (fewer where steps repeat)",
        "final_return": f"each run's mean return over its last {SOLVED_WINDOW} episodes (all "
        "of them if fewer), at the budget it reached",
        "auc": "the area under each seed's unsmoothed return (the last episode finished at or "
        "before each grid point; a seed's runs averaged, from the first point where each has "
        "one) divided by the span from its first such point to the grid's end: its average "
        "return over training",
        "replicate": "the seed (a seed with several runs in a group counts once, as the mean "
        f"of its runs' curves and scores: {SHARED_SEED})",
        "aggregate": f"IQM ({stats.IQM_DEFINITION}) and mean across seeds",
        "interval": stats.INTERVAL_DEFINITION,
        "confidence": stats.CONFIDENCE,
        "resamples": stats.RESAMPLES,
        "bootstrap_seed": stats.BOOTSTRAP_SEED,
        "improvement": "P(X > Y) + ½ P(X = Y) over pairs of seeds, each group resampled on its own",
    }


def methods_text(record: dict[str, Any]) -> str:
    """:func:`methods_record` as a paragraph for a paper's methods section."""
    code, group, groups = record["analysis_code"], record["group"], record["groups"]
    if not groups:
        return "No run with a readable config."
    seeds = _count_text(len(g["seeds"]) for g in groups)
    values = ", ".join(format_value(g["value"]) for g in groups)
    runs = record["runs"]
    per_value = f"{seeds} seed{'' if seeds == '1' else 's'} per value"
    if any(g["runs"] != len(g["seeds"]) for g in groups):  # a seed has several runs
        per_value += (f" ({_count_text(g['runs'] for g in groups)} runs: a seed's runs count "
                      "once, as their mean)")  # fmt: skip
    algo = algorithm_name(record["shared_config"].get("algo"))
    text = [f"{len(runs)} runs of {algo} with GAE, {label(group)} ∈ {{{values}}}, {per_value}."]
    unfinished = sum(r["status"] != "finished" for r in runs)
    if unfinished:
        text.append(f"{unfinished} of them had not finished: their final returns are taken "
                    "where they stopped, and every run's curve and AUC end at the shortest "
                    "run's last episode.")  # fmt: skip
    repeats = record.get("repeats") or {}
    if repeats:
        left = ", ".join(f"{run} → {kept}" for run, kept in repeats.items())
        text.append(f"Left out as repeats (same effective config, seed and code) of the run "
                    f"kept, which trained at least as far: {left}.")  # fmt: skip
    shared = record["shared_config"]
    setting = ", ".join(  # None: a setting with no effect in any run (TrainConfig.idle_fields)
        f"{k}={format_value(v)}" for k, v in shared.items() if k != "seed" and v is not None
    )
    text.append(f"Shared by every run: {setting}.")
    lam = label("lambda_")
    if group == "lambda_" and shared.get("critic_target") == "advantage_lambda":
        text.append(f"The critic's target is the {lam}-return with each run's own {lam}, so the "
                    f"critic changes with {lam} too (critic_lambda is unused).")  # fmt: skip
    kinds = {"Crossed with it, alike in every group, and pooled": lambda v: v["crossed"],
             "Also varying across the runs (a confound)": is_confound,
             "Set where it has an effect, one value there (no effect in the other runs)":
             lambda v: not v["crossed"] and not is_confound(v)}  # fmt: skip
    for what, kind in kinds.items():
        fields = {k: v for k, v in record["also_varies"].items() if kind(v)}
        if fields:
            listed = "; ".join(
                f"{k} ∈ {{{', '.join(format_value(x) for x in v['values'])}}}"
                for k, v in fields.items()
            )
            text.append(f"{what}: {listed}.")
    s = record["statistics"]
    if "curve" in s:
        text.append(f"Curves: {s['curve']}.")
    text.append(
        f"Grid: {s['grid']}. Final return: {s['final_return']}. AUC: {s['auc']}. Replicate: "
        f"{s['replicate']}. Scores aggregate as {s['aggregate']}; intervals: {s['interval']}, "
        f"{s['resamples']:,} resamples, seed {s['bootstrap_seed']} (none with one seed). "
        f"Probability of improvement: {s['improvement']}."
    )
    trained = [t for t in record["created_with"] if t["code"]]
    untold = sum(t["runs"] for t in record["created_with"] if not t["code"])
    if len(trained) == 1:
        told = f"Runs created with {_version_text(trained[0]['code'])}"
    elif trained:
        told = "Runs created with " + "; ".join(
            f"{_version_text(t['code'])} ({t['runs']} runs)" for t in trained
        )
    else:
        told = "The runs do not record the code they were created with"
    if trained and untold:
        told += f"; {untold} stored before runs recorded their code"
    computed = f"Statistics computed with {_version_text(code)}"
    if code.get("checkout_changed"):  # a long-running app: the checkout moved on since it loaded
        computed += ", which this process loaded; the checkout has changed since"
    text.append(f"{told}. {computed}.")
    return " ".join(text)
