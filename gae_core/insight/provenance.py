"""What a comparison's figures were made from, so that a reader can check or redo them: the
runs' shared config, what varies besides the grouped field and the seed (a confound the page
warns about), the seeds and budgets, how the statistics are computed and with which settings,
and the version of the code (the git commit when it runs from a checkout).

The λ comparison page shows it under its summary (a paragraph for a paper's methods section,
and the record as JSON), and ``python -m gae_core summary`` prints it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gae_core.agent.config import FIELD_SPECS, with_stored_defaults
from gae_core.insight import stats
from gae_core.insight.compare import CURVE_POINTS
from gae_core.labels import format_value, label
from gae_core.outcome import SOLVED_WINDOW
from gae_core.version import __version__

__all__ = ["config_spread", "methods_record", "methods_text", "source_version"]

#: Fields that describe where a run ran, not what it computed.
_PLACEMENT = ("device", "torch_threads")


@functools.cache
def source_version() -> dict[str, Any]:
    """``{"package", "version", "commit", "local_changes"}``: gae_core's version, and the git
    commit of its source tree with whether that tree has uncommitted changes to tracked files
    (both None where it does not run from a git checkout or git is missing). Once per
    process."""
    root = Path(__file__).resolve().parents[2]
    commit = changed = None
    git = shutil.which("git")
    if git is not None and (root / ".git").exists():
        try:
            commit = _git(git, root, "rev-parse", "HEAD") or None
            if commit is not None:
                changed = bool(_git(git, root, "status", "--porcelain", "--untracked-files=no"))
        except (OSError, subprocess.SubprocessError):
            commit = changed = None
    return {"package": "gae_core", "version": __version__, "commit": commit,
            "local_changes": changed}  # fmt: skip


def _git(git: str, root: Path, *args: str) -> str:
    done = subprocess.run(
        [git, *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()


def config_spread(configs: Sequence[dict], group: str) -> tuple[dict, dict]:
    """``(shared, varying)`` over the runs' stored configs: the fields every config holds with
    one value (``{field: value}``), and the fields other than ``group``, ``seed`` and where a
    run ran (device, threads) that take several (``{field: [values, sorted by repr]}``)."""
    configs = [with_stored_defaults(c) for c in configs]
    fields = [f for f in FIELD_SPECS if any(f in c for c in configs)]
    shared, varying = {}, {}
    for field in fields:
        values = {repr(c.get(field)): c.get(field) for c in configs}
        if len(values) == 1:
            shared[field] = next(iter(values.values()))
        elif field not in (group, "seed", *_PLACEMENT):
            varying[field] = [values[k] for k in sorted(values)]
    return shared, varying


def methods_record(
    runs: Sequence[Any],
    group: str,
    *,
    statistic: str | None = None,
    window: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """What a comparison of ``runs`` (stored :class:`~gae_core.runs.records.RunRecord`\\ s)
    grouped by ``group`` was made from: the code's version, the runs (id, group value, seed,
    env steps, status), the seeds per group value, the shared config and what else varies,
    and the statistics: the scores', the intervals' bootstrap ``seed`` and, for a figure of
    curves, the curves' (``statistic``, "iqm" or "mean", across seeds of each seed's running
    mean over ``window`` episodes)."""
    configs = [r.config for r in runs]
    shared, varying = config_spread(configs, group)
    seeds: dict[str, list] = {}
    for config in configs:
        config = with_stored_defaults(config)
        seeds.setdefault(repr(config.get(group)), []).append(config.get("seed"))
    values = sorted({with_stored_defaults(c).get(group) for c in configs}, key=repr)
    return {
        "code": source_version(),
        "group": group,
        "values": values,
        "seeds": {format_value(v): sorted(seeds[repr(v)]) for v in values},
        "runs": [_run_entry(r, group) for r in runs],
        "shared_config": shared,
        "also_varies": varying,
        "statistics": {
            **_curve(statistic, window),
            "grid_points": CURVE_POINTS,
            "final_return": f"each seed's mean return over its last {SOLVED_WINDOW} episodes",
            "auc": "the area under each seed's curve on the grid, divided by the grid's span",
            "aggregate": "IQM (mean of the middle 50 % of seeds) and mean across seeds",
            "interval": "95 % percentile bootstrap over seeds (Agarwal et al., 2021)",
            "resamples": stats.RESAMPLES,
            "bootstrap_seed": seed,
        },
    }


def _curve(statistic: str | None, window: int | None) -> dict[str, Any]:
    if statistic is None:
        return {}
    what = f"{statistic.upper()} across seeds of each seed's running mean of episodic return"
    return {"curve": what, "running_mean_episodes": window}


def _run_entry(run: Any, group: str) -> dict[str, Any]:
    config = with_stored_defaults(run.config)
    return {"id": run.id, group: config.get(group), "seed": config.get("seed"),
            "env_steps": run.env_steps, "status": run.status}  # fmt: skip


def methods_text(record: dict[str, Any]) -> str:
    """:func:`methods_record` as a paragraph for a paper's methods section."""
    code = record["code"]
    version = f"gae_core {code['version']}"
    if code["commit"]:
        version += f", commit {code['commit'][:12]}"
        if code["local_changes"]:
            version += " with uncommitted changes"
    shared = record["shared_config"]
    group = record["group"]
    counts = sorted({len(s) for s in record["seeds"].values()})
    seeds_text = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    seeds_text += " seed" if counts[-1] == 1 else " seeds"
    values = ", ".join(format_value(v) for v in record["values"])
    setting = ", ".join(
        f"{name}={format_value(value)}" for name, value in shared.items() if name != "seed"
    )
    statistics = record["statistics"]
    text = [
        f"Made with {version}. {len(record['runs'])} runs of A2C with GAE, "
        f"{label(group)} ∈ {{{values}}}, {seeds_text} per value.",
        f"Shared by every run: {setting}.",
    ]
    if group == "lambda_" and shared.get("critic_target") == "advantage_lambda":
        lam = label("lambda_")
        text.append(f"The critic's target is the {lam}-return with each run's own {lam}, so the "
                    f"critic changes with {lam} too.")  # fmt: skip
    if record["also_varies"]:
        varied = "; ".join(
            f"{name} ∈ {{{', '.join(format_value(v) for v in vals)}}}"
            for name, vals in record["also_varies"].items()
        )
        text.append(f"Also varying across the runs (a confound): {varied}.")
    if "curve" in statistics:
        text.append(
            f"Curves: the {statistics['curve']} over {statistics['running_mean_episodes']} "
            f"episodes, on a common grid of {statistics['grid_points']} points in env steps."
        )
    text.append(
        f"Final return: {statistics['final_return']}. AUC: {statistics['auc']} "
        f"({statistics['grid_points']} points). Scores aggregate as {statistics['aggregate']}. "
        f"Intervals: {statistics['interval']}, {statistics['resamples']:,} resamples, seed "
        f"{statistics['bootstrap_seed']}."
    )
    return " ".join(text)
