"""What a comparison must say beside its figures, where the figures alone would mislead: runs
short of their budget, budgets that differ, final returns that span most of training, too few
seeds. The λ comparison page shows each as a warning, and ``summary`` prints them as notes
(:func:`comparison_notes`, the one list both read)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gae_core.agent.config import with_stored_defaults
from gae_core.insight import stats
from gae_core.insight.compare import curve_end
from gae_core.labels import assignment, format_value
from gae_core.outcome import SOLVED_WINDOW, final_window_share
from gae_core.storage.records import NOT_STARTED, STATUSES

__all__ = [
    "budgets_note", "comparison_notes", "final_window_note", "unfinished_note", "unfinished_runs",
]  # fmt: skip


def comparison_notes(runs: Sequence[Any], episodes: pd.DataFrame, group: str) -> list[str]:
    """Every note a comparison of ``runs`` (drawn from ``episodes``, grouped by ``group``) must
    give, in the order the page shows them; none where the figures say it all."""
    notes = [
        unfinished_note(runs, episodes, group),
        None if episodes.empty else budgets_note(runs, episodes),
        None
        if episodes.empty
        else stats.few_seeds_warning(int(episodes.groupby(group)["seed"].nunique().min())),
        None if episodes.empty else final_window_note(episodes),
    ]
    return [note for note in notes if note]


def unfinished_runs(runs: Sequence[Any]) -> list[Any]:
    """The runs that have not finished their budget: any status but ``finished``."""
    return [r for r in runs if r.status != "finished"]


def unfinished_note(runs: Sequence[Any], episodes: pd.DataFrame, group: str) -> str | None:
    """What a comparison must say when some of the ``runs`` it was given
    (:class:`RunRecord`\\ s, those drawn or not) have not finished their budget (still
    training, stopped before it, failed, interrupted, or cancelled before they started): how
    many, by status; which have no finished episode in ``episodes`` and are not drawn, and the
    ``group`` values left with no run at all; and what the rest does to the figures: the curves
    and every seed's AUC end where the shortest drawn run's episodes end (:func:`curve_end`),
    finished runs' too, while each run's final return is its last episodes wherever it
    stopped. None when every run finished."""
    unfinished = unfinished_runs(runs)
    if not unfinished:
        return None
    said = Counter(getattr(r, "shown_status", r.status) for r in unfinished)
    order = [*STATUSES, NOT_STARTED]  # the store's order, never-started trials last
    how = ", ".join(f"{said[status]} {status}" for status in sorted(said, key=order.index))
    verb = "has not finished its" if len(unfinished) == 1 else "have not finished their"
    text = f"{len(unfinished)} of these {len(runs)} runs {verb} budget ({how})"
    drawn = set(episodes["run_id"]) if not episodes.empty else set()
    missing = [r for r in runs if r.id not in drawn]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        text += f"; {len(missing)} finished no episode and {verb} not drawn"

        def value(run: Any) -> Any:
            return with_stored_defaults(run.config).get(group)

        shown = {format_value(value(r)) for r in runs if r.id in drawn}
        absent = {format_value(value(r)): value(r) for r in missing}
        absent = [assignment(group, v) for k, v in sorted(absent.items()) if k not in shown]
        if absent:
            text += f", which leaves {' and '.join(absent)} with no run"
    if drawn:
        text += (
            ": the curves and every run's AUC end where the shortest drawn run's episodes end "
            f"({curve_end(episodes):,} env steps), and each run's final return is its last "
            f"{SOLVED_WINDOW} episodes wherever it stopped"
        )
    return text + "."


def final_window_note(episodes: pd.DataFrame, most: float = 0.5) -> str | None:
    """What a comparison must say where some run's final return spans more than ``most`` of
    its env steps (:func:`~gae_core.outcome.final_window_share`); None where none does."""
    steps = episodes.sort_values("env_step").groupby("run_id")["env_step"]
    shares = steps.apply(final_window_share)
    if not (wide := shares[shares > most]).size:
        return None
    return (f"In {len(wide)} of these {len(shares)} runs the final return's last {SOLVED_WINDOW} "
            f"episodes span more than {most:.0%} of the run's env steps (up to {wide.max():.0%}): "
            "it averages early learning too, so it lags where the curves end and can rank the "
            "groups otherwise. The curves and the AUC show how they learned; longer runs give "
            "the final return its meaning.")  # fmt: skip


def budgets_note(runs: Sequence[Any], episodes: pd.DataFrame) -> str | None:
    """What a comparison must say where every run finished but the drawn runs' budgets
    (``total_steps``) differ: the curves and the AUC end where the shortest run's episodes end
    (:func:`curve_end`), each run's final return at its own end. None otherwise
    (:func:`unfinished_note` says it of runs short of their budget)."""
    if unfinished_runs(runs):
        return None
    drawn = set(episodes["run_id"])
    budgets = {with_stored_defaults(r.config).get("total_steps") for r in runs if r.id in drawn}
    if len(budgets) < 2:
        return None
    return (f"These runs' budgets differ ({min(budgets):,} to {max(budgets):,} env steps): "
            "the curves and every run's AUC end where the shortest run's episodes end "
            f"({curve_end(episodes):,} env steps), while each run's final return is its last "
            f"{SOLVED_WINDOW} episodes at its own end.")  # fmt: skip
