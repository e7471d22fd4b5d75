"""λ comparison: launch a λ × seed sweep in worker processes, or pick runs; compare learning
curves (IQM or mean with bootstrap bands), final return and AUC per group with intervals, the
probability of improvement between groups and the performance profile."""

import datetime as dt
import functools
import json
import math
import os

import streamlit as st

from gae_core.agent.config import FIELD_SPECS
from gae_core.errors import ConfigError
from gae_core.inert import markdown_text
from gae_core.insight import (
    compare,
    compare_figures,
    compare_notes,
    exports,
    grid,
    provenance,
    stats,
    views,
)
from gae_core.labels import (
    MISSING,
    algorithm_name,
    assignment,
    format_value,
    label,
    run_label,
    stored_algo,
    value_text,
)
from gae_core.outcome import SOLVED_WINDOW
from gae_core.runs.backends import DEFAULT_MEMBERS, backend_factory, ray_installed
from gae_core.runs.sweep import (
    cancel_sweep,
    check_sweep_name,
    grid_of,
    hold_critic_target,
    start_sweep,
    sweep_progress,
)
from gae_core.storage.table import runs_frame
from pages import _ui

_ui.require_navigation("pages/compare.py")
LAMBDA, LAMBDA_SPEC, SEED_SPEC = label("lambda_"), FIELD_SPECS["lambda_"], FIELD_SPECS["seed"]

st.title(f"{LAMBDA} comparison")
store = _ui.store()
# what is compared follows the URL: ?source=sweep&sweep=… or ?source=runs&run=…&run=…, and
# the grouping field (?group=)
_ui.arrive("compare", ("cmp.sweep_pick", "cmp.source", "cmp.runs", "cmp.group"))
SOURCES = {"a sweep": "sweep", "pick runs": "runs"}  # the radio's words → the URL's
if st.session_state.pop("cmp.goto_compare", False):  # "Compare this sweep" was clicked
    st.session_state["cmp.view"] = "Compare"
    st.session_state["cmp.source"] = "a sweep"
# the starting view lives in the state, not in default=: a widget given both logs a warning
st.session_state.setdefault("cmp.view", "Compare")
view = st.segmented_control(
    "view", ["Launch a sweep", "Compare"], key="cmp.view", label_visibility="collapsed"
)


def _backend_switched() -> None:  # from Ray back to this machine: at most its cores
    state = st.session_state
    state["cmp.workers"] = views.workers_after_switch(
        state.get("cmp.workers", ""), state.get("cmp.backend"), os.cpu_count() or 1
    )


def sweep_name(sweep_id: str) -> str:
    sweep = store.get_sweep(sweep_id)
    env = sweep.base_config.get("env_id", "?")
    algo = algorithm_name(stored_algo(sweep.base_config))
    when = dt.datetime.fromtimestamp(sweep.created_at).strftime("%Y-%m-%d %H:%M")
    return f"{sweep.name} · {algo} · {env} · {when}"  # no status: a label that changes resets it


if view == "Launch a sweep":
    left, right = st.columns([1, 2], gap="large")
    with left:
        lambdas_text = st.text_input(
            f"{LAMBDA} values",
            "0, 0.5, 0.9, 0.95, 0.99, 1",
            key="cmp.lambdas",
            persist_state="session",
            help=f"Separated by commas or spaces, each {LAMBDA_SPEC.allowed}, each once; every "
            f"{LAMBDA} trains with every seed.",
        )
        gammas_text = st.text_input(
            f"γ values (optional: a γ × {LAMBDA} study)",
            "",
            key="cmp.gammas",
            persist_state="session",
            help=f"Separated by commas or spaces, each {FIELD_SPECS['gamma'].allowed}: every γ "
            "trains with "
            f"every {LAMBDA} and seed, and the comparison draws the grid as a heat map (the GAE "
            "paper's figure 2). Empty: the γ below for every trial.",
        )
        count_column, first_column = st.columns(2)
        # with γ values every γ × λ cell trains them (the box keeps its text: it is keyed)
        per = f"γ × {LAMBDA} cell" if gammas_text.strip() else LAMBDA
        seeds_text = count_column.text_input(  # text, read on the server (as the first seed)
            f"seeds per {per}", str(views.DEFAULT_SEEDS_PER_LAMBDA), key="cmp.seeds",
            persist_state="session",
            help=f"Bootstrap intervals need about 10 seeds per {LAMBDA} to rank {LAMBDA} values; "
            "fewer than 5 give intervals too wide (and too optimistic) to read (an integer, "
            "{} to {}).".format(*views.SEEDS_PER_LAMBDA),
        )  # fmt: skip
        first_seed = first_column.text_input(  # text: a number box's browser side swallows
            "first seed", value="0", key="cmp.first_seed",  # a value past 2^53 unsaid
            persist_state="session",
            help="The trials' seeds are this one and the next ones (0: seeds 0 to n−1). Start "
            "past an earlier sweep's seeds for fresh replicates of the same study "
            f"(an integer, 0 to {SEED_SPEC.max:,}).",
        )  # fmt: skip
        seeds, seed_errors = views.typed_count(f"seeds per {per}", seeds_text,
                                               *views.SEEDS_PER_LAMBDA)  # fmt: skip
        seed_values, first_errors = views.sweep_seeds(first_seed, seeds or 1)
        name = st.text_input(
            "sweep name (optional)", key="cmp.name", max_chars=80, persist_state="session",
            help="Names the sweep and prefixes its trials' names; empty: sweep-<id>.",
        ).strip() or None  # fmt: skip
        # what is wrong and Launch sit under the study's boxes, in view beside the progress
        # panel; the backend and the training config (a long form) come below them
        launch_slot = st.container()
        backend_name, address = "local", None
        if ray_installed():
            backend_name = st.segmented_control(
                "backend", ["local", "ray"], default="local", key="cmp.backend",
                format_func={"local": "local processes", "ray": "Ray"}.get,
                on_change=_backend_switched,
                help="Local: worker processes on this machine. Ray: each trial (or population "
                "of trials) a Ray task on any node of a cluster (or a local Ray); the workers "
                "count is then how many tasks run at once.",
            ) or "local"  # fmt: skip
            if backend_name == "ray":
                address = st.text_input(
                    "Ray address (empty: start a local Ray)", key="cmp.ray_address",
                    help="A running cluster's address, e.g. ray://head:10001 or head:6379.",
                ).strip() or None  # fmt: skip
        cores = os.cpu_count() or 1
        fewest, most = views.workers_range(backend_name, cores)
        # the box's text lives in session state only: a default beside a value set here made
        # Streamlit print a warning on the page after a switch back from Ray
        st.session_state.setdefault("cmp.workers", str(cores))
        workers, worker_errors = views.typed_count("worker processes", st.text_input(
            "worker processes", key="cmp.workers",
            help=f"Trials train in this many processes at once (this machine has {cores} "
            "cores; with Ray, the cluster's CPUs); a worker that dies costs only the trials it "
            f"held (one, or its population), each retried once (an integer, {fewest} to {most}).",
        ), fewest, most)  # fmt: skip
        batched = st.toggle(
            "batched populations", value=True, key="cmp.batched",
            help="Each worker (or Ray task) trains its share of the trials as one population: "
            "one batched "
            "network pass for all of them, several times faster on small networks. Every "
            "trial is still its own run, identical in distribution to training it alone but "
            "not bit for bit. Off: each trial trains alone.",
        )  # fmt: skip
        hold = st.checkbox(
            f"Hold the critic's target fixed across {LAMBDA}",
            value=True,
            key="cmp.hold_critic",
            help=f"The critic regresses on {LAMBDA}-returns with one {LAMBDA} for every trial, "
            f"so the study varies the advantages' {LAMBDA} and nothing else. Unchecked, each "
            f"trial's critic follows its own {LAMBDA} (SB3 and CleanRL), which changes two "
            "things at once.",
        )
        # held, the critic's target is the checkbox's: its own fields would contradict it
        held_fields = ("critic_target", "critic_lambda") if hold else ()
        # γ values given: the grid sets every trial's γ, so the form's γ box would mislead
        gridded = ("gamma",) if gammas_text.strip() else ()
        values = _ui.config_form("cmp", exclude=("lambda_", "seed", *held_fields), hidden=gridded)
        gammas: list[float] = []
        errors = []
        try:
            members = DEFAULT_MEMBERS if batched else 1
            backend = backend_factory(backend_name, address, members=members)
        except ConfigError as error:
            errors.append(str(error))
        try:
            lambdas = views.parse_float_list(
                lambdas_text, f"{LAMBDA} values", LAMBDA_SPEC.min, LAMBDA_SPEC.max
            )
        except ConfigError as error:
            lambdas = []
            errors.append(str(error))
        if gammas_text.strip():
            try:
                spec = FIELD_SPECS["gamma"]
                gammas = views.parse_float_list(gammas_text, "γ values", spec.min, spec.max)
            except ConfigError as error:
                errors.append(str(error))
        base, form_errors, warnings = views.build_config(values)
        if base is not None and hold:
            base = hold_critic_target(base, {"lambda_": lambdas})
            st.caption(
                f"Critic target for every trial: {LAMBDA}-returns with "
                f"{assignment('lambda_', base.target_lambda)} (the preset's {LAMBDA}). "
                f"Advantages use each trial's own {LAMBDA}."
            )
        errors += seed_errors + first_errors + worker_errors
        grid = grid_of(lambdas=lambdas, seeds=seed_values, **({"gamma": gammas} if gammas else {}))
        if name and base is not None and not errors:
            try:
                check_sweep_name(name, base, grid)
            except ValueError as error:  # nothing printable in it, or too long for the grid
                errors.append(str(error))
        seeds, blocked = seeds or 0, bool(errors or form_errors)  # (unread seeds: none)
        trials = len(lambdas) * max(len(gammas), 1) * seeds
        plural = "seed" if seeds == 1 else "seeds"
        axes = f" × {len(gammas)} γ" if gammas else ""  # in the trials' order: λ, γ, seed
        launch = f"Launch {trials} runs ({len(lambdas)} {LAMBDA}{axes} × {seeds} {plural})"
        if base is not None:  # the budget is set far below this button: say it on it
            launch += f", {base.total_steps:,} env steps each"
        if blocked:  # a count from half-read boxes ("0 λ" for "0.9, 1.5") would mislead
            launch = "Launch: fix what is named above first"
        with launch_slot:
            _ui.show_problems(errors + form_errors, warnings)
            _ui.offer_spacing("cmp", base)
            # (blocked: a click that reaches this run anyway launches nothing either)
            clicked = st.button(launch, type="primary", disabled=blocked, key="cmp.launch")
        if clicked and not blocked:
            study = {"base": base.to_dict(), "grid": grid, "name": name, "workers": workers,
                     "backend": [backend_name, address, batched]}  # fmt: skip
            sweep = _ui.start_once(  # a double click launches one sweep
                "cmp.launch", study, lambda: start_sweep(
                    store, base, grid, workers=workers, backend=backend, name=name
                ), "this sweep",
            )  # fmt: skip
            if sweep is not None:
                _ui.sweeps()[sweep.sweep_id] = sweep
                # the progress box is keyed: once drawn, it keeps its own choice over `index`
                st.session_state["cmp.sweep"] = sweep.sweep_id
                st.session_state["cmp.progress_sweep"] = sweep.sweep_id
                # the link and the Compare view follow the sweep just launched
                st.session_state["cmp.sweep_pick"] = sweep.sweep_id
                st.session_state["cmp.source"] = "a sweep"
                _ui.to_url(source="sweep", sweep=sweep.sweep_id)
    with right:
        sweep_list = store.list_sweeps()
        if not sweep_list:
            st.info("No sweeps yet.")
        else:
            ids = [s.id for s in sweep_list]
            chosen = st.session_state.get("cmp.sweep")
            sweep_id = st.selectbox(
                "sweep", ids, index=ids.index(chosen) if chosen in ids else 0,
                format_func=sweep_name, key="cmp.progress_sweep",
            )  # fmt: skip
            running = store.get_sweep(sweep_id).status == "running"

            @st.fragment(run_every=1.0 if running else None)
            def progress() -> None:
                state = sweep_progress(store, sweep_id)
                st.progress(
                    state.fraction,
                    text=f"{state.done}/{state.total} trials ended · "
                    + ", ".join(f"{k}: {v}" for k, v in state.counts.items() if v),
                )
                # oldest first: the grid's order (λ, γ, then seed), as `sweep` prints them
                trials = runs_frame(store.list_runs(sweep_id=sweep_id)[::-1])
                trials["progress"] = (trials["env_steps"] / trials["total_steps"]).clip(0.0, 1.0)
                st.dataframe(
                    trials[["name", "status", "env_steps", "progress", "final_return"]],
                    hide_index=True,
                    column_config={
                        "name": st.column_config.TextColumn(label("name")),
                        "env_steps": st.column_config.NumberColumn(
                            label("env_steps"), format="localized"
                        ),
                        "progress": st.column_config.ProgressColumn(
                            "progress", min_value=0.0, max_value=1.0
                        ),
                        "final_return": st.column_config.NumberColumn(
                            label("final_return"),
                            format="%.1f",
                            help=f"mean of the last {SOLVED_WINDOW} episodes (of all, while "
                            f"fewer have ended); {MISSING} before the first episode ends",
                        ),
                    },
                    placeholder=MISSING,
                )
                if state.status == "running":
                    return  # Cancel is drawn below, outside this fragment
                if running:
                    st.rerun()  # it just ended: the whole page, which drops Cancel
                error = store.get_sweep(sweep_id).error
                if error:
                    st.warning(markdown_text(error))
                if st.button("Compare this sweep", icon=":material/query_stats:",
                             key="cmp.go_compare"):  # fmt: skip
                    st.session_state["cmp.sweep_pick"] = sweep_id
                    st.session_state["cmp.goto_compare"] = True
                    st.rerun(scope="app")

            progress()
            if running:
                # outside the 1 s fragment, as the Train page's Stop: a click reruns the whole
                # page rather than queueing behind the fragment's timer
                st.button("Cancel sweep", key="cmp.cancel", on_click=cancel_sweep,
                          args=(store, sweep_id))  # fmt: skip
    st.stop()

if "cmp.source" not in st.session_state:  # a link naming a sweep or runs says which
    named = "sweep" if "sweep" in st.query_params else "runs" if "run" in st.query_params else None
    if named is None or "source" in st.query_params:
        words = _ui.options_are("the sources", SOURCES.values())  # the link's, else the context's
        named = _ui.from_url("source", list(SOURCES.values()), named or "sweep", words)
    wanted = named
    st.session_state["cmp.source"] = next(k for k, v in SOURCES.items() if v == wanted)
source = st.radio("runs", list(SOURCES), horizontal=True, key="cmp.source")
if source == "a sweep":
    sweep_list = store.list_sweeps()
    if not sweep_list:
        _ui.to_url(source=SOURCES[source])
        st.info("No sweeps yet: launch one, or pick runs.")
        st.stop()
    ids = [s.id for s in sweep_list]
    if st.session_state.get("cmp.sweep_pick") not in ids:
        st.session_state["cmp.sweep_pick"] = _ui.from_url("sweep", ids, ids[0])
    sweep_id = st.selectbox("sweep", ids, format_func=sweep_name, key="cmp.sweep_pick")
    _ui.say_if_linked_missing(ids, sweep_name(sweep_id), "", what="sweep")  # every one listed
    picked_in_url = {"sweep": sweep_id}
    run_ids = [r.id for r in store.list_runs(sweep_id=sweep_id)]
    first_axis, other_axis = grid.study_axes(store.get_sweep(sweep_id).grid)
else:
    sweep_id, first_axis, other_axis = "runs", "lambda_", None
    all_runs = {r.id: run_label(r) for r in store.list_runs()}
    if "cmp.runs" not in st.session_state:
        st.session_state["cmp.runs"] = _ui.all_from_url(
            "run", list(all_runs), [], _ui.not_held("run")
        )
    run_ids = st.multiselect("runs", list(all_runs), format_func=all_runs.get, key="cmp.runs")
    picked_in_url = {"run": run_ids}
fields = [name for name in FIELD_SPECS if name != "seed"]
options = st.columns([2, 1.5, 2, 1.5, 2.5])  # the heat map's axis box reads whole
# the URL's grouping, else the sweep's own axis (not an earlier comparison's grouping)
wanted_group = first_axis if first_axis in fields else "lambda_"
if "group" in st.query_params:  # a link's, named if it is no field to group by
    wanted_group = _ui.from_url(
        "group", fields, wanted_group, "it is not a field the runs can be grouped by", label
    )
group = options[0].selectbox(
    "group curves by", fields, index=fields.index(wanted_group), format_func=label,
    key="cmp.group",
)  # fmt: skip
_ui.to_url(source=SOURCES[source], **picked_in_url, group=group)  # one history entry
seconds = [None, *(f for f in fields if f != group)]
second = options[4].selectbox(
    "heat map: second axis", seconds, index=seconds.index(other_axis if other_axis in seconds
                                                        else None),
    format_func=lambda f: "none" if f is None else label(f), key=f"cmp.second.{sweep_id}",
    help=f"A two-axis study (γ × {LAMBDA}, as in the GAE paper's figure 2): one score per cell "
    f"of {label(group)} × this field, drawn as a heat map below the summary.",
)  # fmt: skip
center = options[1].segmented_control(
    "curve", ["iqm", "mean"], default="iqm", format_func={"iqm": "IQM", "mean": "mean"}.get,
    key="cmp.center",
    help="IQM: the mean of the middle 50 % of seeds (robust to one failed seed); mean: all.",
)  # fmt: skip
window = options[2].slider("episodes per run's running mean", 1, 100, 10, key="cmp.window")
show_seeds = options[3].checkbox("show seeds", key="cmp.show_seeds")
picked, repeats = compare.distinct_runs([store.get_run(r) for r in run_ids], group)
unfinished_ids = [r.id for r in compare_notes.unfinished_runs(picked)]
leave_out = "run that has not finished its" if len(unfinished_ids) == 1 else (
    "runs that have not finished their")  # fmt: skip
if unfinished_ids and st.checkbox(
    f"Leave out the {len(unfinished_ids)} {leave_out} budget",
    key="cmp.finished_only",
    help="Their final returns are taken where they stopped and they end every curve and AUC "
    "early; left out, the statistics compare whole budgets only.",
):
    picked = [r for r in picked if r.id not in unfinished_ids]
also = (second,) if second else ()
episodes = compare.episodes_frame(store, [r.id for r in picked], group, also=also)
if not run_ids:
    st.info("Pick runs to compare in the box above (at least two, from one environment)."
            if sweep_id == "runs" else "This sweep has no runs left (deleted since).")  # fmt: skip
    st.stop()
if episodes.empty:
    st.info("No finished episodes in these runs yet.")
    st.stop()
used = set(episodes["run_id"])  # the runs the figures draw (those with a finished episode)
runs = [r for r in picked if r.id in used]
# every CSV below leads with what made it: the sweep (or the runs picked), the runs left out,
# the grouping and the metric, and then its own settings
made_by = provenance.csv_made_by(
    sweep_id if source == "a sweep" else None, run_ids, [r.id for r in runs], group
)
envs = sorted({r.config.get("env_id") for r in runs})
if len(envs) > 1:
    st.warning(f"These runs come from different environments ({', '.join(envs)}): their "
               "returns are not on one scale.")  # fmt: skip
record = provenance.methods_record(
    runs, group, statistic=center or "iqm", window=window, repeats=repeats
)
varies = record["also_varies"]
confounds = [label(f) for f, v in varies.items() if provenance.is_confound(v) and f != "env_id"]
if confounds:
    st.warning(
        f"These runs also differ in {', '.join(confounds)}: the curves do not isolate "
        f"{label(group)}. The methods below list the values.",
        icon=":material/warning:",
    )
idle, why = compare.idle_in(runs, group)
if idle:
    st.warning(
        f"{label(group)} has no effect in {idle} of these runs, since {why}: those train "
        "alike whatever its value, so their groups differ in name only.",
        icon=":material/warning:",
    )
crossed = [label(f) for f, v in varies.items() if v["crossed"]]
if crossed:
    st.info(
        f"{', '.join(crossed)} also varies, alike in every {label(group)} group, and is pooled: "
        "a seed's runs at its values count once, as the mean of their curves and scores "
        f"({compare.SHARED_SEED}).",
        icon=":material/info:",
    )
if repeats:
    st.info(
        f"{len(repeats)} of these runs repeat another's config, seed and code: each is left out "
        "for the one that trained furthest (ties: the latest). The methods below name them.",
        icon=":material/info:",
    )
for note in compare_notes.comparison_notes(picked, episodes, group):  # (picked: drawn or not)
    st.warning(note, icon=":material/warning:")
threshold = runs[0].summary.reward_threshold if len(envs) == 1 else None
bands, aligned = compare.aggregate_curves(
    episodes, group=group, window=window, statistic=center or "iqm"
)
figure, frame = compare_figures.comparison_figure(
    bands, aligned, group=group, show_seeds=show_seeds
)
st.plotly_chart(figure, key="cmp.curves", config={"displaylogo": False})
downloads = st.columns(3)
curve_made_by = {**made_by, "running_mean_episodes": window, "x_axis": "env_step"}
with downloads[0]:
    _ui.csv_button("Curves CSV (each seed on the grid)", aligned, "curves.csv",
                   "cmp.curves_csv", curve_made_by)  # fmt: skip
with downloads[1]:  # (which statistic: the frame's own column)
    _ui.csv_button("Bands CSV", frame, "bands.csv", "cmp.bands_csv",
                   {**curve_made_by, "interval": stats.INTERVAL_DEFINITION})  # fmt: skip

summary = compare.summary_table(episodes, group=group, threshold=threshold)
st.subheader("Summary")
score_groups = compare.group_scores(episodes, group)
for score, sentence in compare.group_sentences(score_groups, group).items():
    st.markdown(f"**{compare.RANKED_SCORES[score]}:** {sentence}.")
shown = summary.copy()
cells = []
for score in ("final_return", "auc"):
    for name in ("iqm", "mean"):
        base = f"{score}_{name}"
        cells.append(f"{label(score)} {'IQM' if name == 'iqm' else 'mean'}")
        shown[cells[-1]] = [
            stats.estimate_text(p, lo, hi)  # one decimal in every cell: 150.0, not 150
            for p, lo, hi in zip(
                shown[base], shown[f"{base}_ci_low"], shown[f"{base}_ci_high"], strict=True
            )
        ]
shown[label(group)] = [value_text(group, v) for v in shown[group]]
columns = [label(group), "seeds", *cells]
if (summary["runs"] != summary["seeds"]).any():  # a seed's runs averaged: say how many
    columns.insert(2, "runs")
if threshold is not None:
    shown["solved"] = [f"{v:.0%}" for v in shown["solved_fraction"]]
    shown["median steps to solve"] = [
        "not reached" if v == math.inf else MISSING if v != v else format_value(int(v))
        for v in shown["median_steps_to_solve"]
    ]
    columns += ["solved", "median steps to solve"]
st.dataframe(
    shown[columns].style.apply(
        lambda row: (
            ["background-color: #d4edda" if summary.loc[row.name, "best"] else ""] * len(row)
        ),
        axis=1,
    ),
    hide_index=True,
    placeholder=MISSING,
    key="cmp.summary",
)
st.caption(
    f"Per seed, the final return is the mean of its last {SOLVED_WINDOW} episodes (of all "
    "of them where fewer ended; of its runs' means, where it has several) and the AUC the "
    "area under its unsmoothed curve (the running mean smooths the chart only) divided by the "
    "span (its average return over training). "
    f"Each cell: the IQM or mean across seeds and its {stats.INTERVAL_DEFINITION} interval. "
    "Highlighted: the highest final-return IQM. How "
    "each is computed: the methods below."
    + (
        f" Solved: the share of runs with a {SOLVED_WINDOW}-episode mean ≥ {threshold:g}; "
        "median steps to solve: the step by which half the runs had (not reached: fewer than "
        "half ever did)."
        if threshold is not None
        else ""
    )
)
with downloads[2]:
    # "not reached" (inf in the table) is an empty cell in the CSV, as a spreadsheet expects
    exported = summary.replace([math.inf, -math.inf], math.nan)
    _ui.csv_button("Summary CSV", exported, "summary.csv", "cmp.summary_csv",
                   {**made_by, "final_return_episodes": SOLVED_WINDOW, "reward_threshold":
                    threshold, "interval": stats.INTERVAL_DEFINITION})  # fmt: skip
if second:
    st.subheader(f"{label(second)} × {label(group)}")
    choices = [s for s in grid.SCORES if threshold is not None or s != "steps_to_threshold"]
    grid_score = st.segmented_control(
        "score of each cell", choices, default="final_return", key="cmp.grid_score",
        format_func=lambda s: grid.SCORES[s][0].split(" (")[0],
        help=" · ".join(f"{s}: {what}" for s, (what, _) in grid.SCORES.items()),
    ) or "final_return"  # fmt: skip
    cells = grid.cell_table(episodes, group, second, score=grid_score, threshold=threshold)
    figure, drawn = compare_figures.grid_figure(cells, group, second)
    st.plotly_chart(figure, key="cmp.grid", config={"displaylogo": False})
    st.markdown(grid.best_cell_sentence(cells, group, second, assignment) + ".")
    st.caption(
        f"Each cell: the IQM across its seeds of {grid.SCORES[grid_score][0]}, with its "
        f"{stats.INTERVAL_DEFINITION} interval and the mean on hover. "
        + " ".join(grid.MARKS.values())
    )
    _ui.csv_button("Grid CSV (the cells drawn)", drawn, "grid.csv", "cmp.grid_csv",
                   {**made_by, "second_axis": second, "score": grid_score, "reward_threshold":
                    threshold, "interval": stats.INTERVAL_DEFINITION})  # fmt: skip
with st.expander("Methods and provenance (to cite these figures)"):
    st.code(provenance.methods_text(record), language=None, wrap_lines=True)
    _ui.download_button(
        "Provenance JSON", functools.partial(json.dumps, record, indent=1, allow_nan=False),
        exports.download_name("provenance.json", made_by), "application/json",
        "cmp.provenance_json",
    )  # fmt: skip
pair_score = st.segmented_control(
    "score for the two charts below", list(compare.RANKED_SCORES), default="final_return",
    format_func=label, key="cmp.pair_score",
    help=f"Final return: the last {SOLVED_WINDOW} episodes per run (a seed: its runs' mean). "
    "AUC: the average return over training (how fast it learned); it separates groups that "
    "all end at the env's ceiling.",
)  # fmt: skip
pair_score = pair_score or "final_return"
groups = score_groups[pair_score]
left, right = st.columns(2, gap="large")
with left:
    figure, matrix = compare_figures.improvement_figure(
        stats.improvement_matrix(groups), group, label(pair_score)
    )
    st.plotly_chart(figure, key="cmp.improvement", config={"displaylogo": False})
    _ui.csv_button("Improvement CSV", matrix, "improvement.csv", "cmp.improvement_csv",
                   {**made_by, "score": pair_score})  # fmt: skip
with right:
    figure, profile = compare_figures.profile_figure(
        stats.performance_profile(groups), group, label(pair_score)
    )
    st.plotly_chart(figure, key="cmp.profile", config={"displaylogo": False})
    _ui.csv_button("Profile CSV", profile, "profile.csv", "cmp.profile_csv",
                   {**made_by, "score": pair_score})  # fmt: skip
