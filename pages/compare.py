"""λ comparison: launch a λ × seed sweep in worker processes, or pick runs; compare the
learning curves (mean and 95 % band across seeds) and a summary per λ."""

import os

import streamlit as st

from gae_core.agent.config import FIELD_SPECS
from gae_core.errors import ConfigError
from gae_core.insight import compare, figures, views
from gae_core.runs.sweep import (
    cancel_sweep,
    grid_of,
    hold_critic_target,
    start_sweep,
    sweep_progress,
)
from gae_core.runs.table import runs_frame
from pages import _ui

_ui.require_navigation("pages/compare.py")

st.title("λ comparison")
store = _ui.store()
launch_tab, analyse_tab = st.tabs(["Launch a sweep", "Compare"])

with launch_tab:
    left, right = st.columns([1, 2], gap="large")
    with left:
        lambdas_text = st.text_input(
            "λ values",
            "0, 0.5, 0.9, 0.95, 0.99, 1",
            key="cmp.lambdas",
            help="Comma-separated, each in [0, 1]; every λ trains with every seed.",
        )
        seeds = st.number_input(
            "seeds per λ",
            1,
            100,
            10,
            key="cmp.seeds",
            help="Seeds 0..n−1. Bootstrap intervals need about 10 seeds per λ to be narrow; "
            "fewer than 5 give intervals too wide to rank λ values.",
        )
        workers = st.number_input(
            "worker processes", 1, os.cpu_count() or 1, os.cpu_count() or 1, key="cmp.workers"
        )
        values = _ui.config_form("cmp", exclude=("lambda_", "seed"))
        errors = []
        try:
            lambdas = views.parse_float_list(lambdas_text, "λ values")
        except ConfigError as error:
            lambdas, errors = [], [str(error)]
        hold = st.checkbox(
            "Hold the critic's target fixed across λ",
            value=True,
            key="cmp.hold_critic",
            help="The critic regresses on λ-returns with one λ for every trial, so the study "
            "varies the advantages' λ and nothing else. Unchecked, each trial's critic follows "
            "its own λ (SB3 and CleanRL), which changes two things at once.",
        )
        base, form_errors, warnings = views.build_config(values)
        if base is not None and hold:
            base = hold_critic_target(base, {"lambda_": lambdas})
            st.caption(
                f"Critic target for every trial: λ-returns with λ = {base.target_lambda:g} "
                "(the preset's λ). Advantages use each trial's own λ."
            )
        _ui.show_problems(errors + form_errors, warnings)
        trials = len(lambdas) * int(seeds)
        label = f"Launch {trials} runs ({len(lambdas)} λ × {int(seeds)} seeds)"
        if st.button(label, type="primary", disabled=bool(errors or form_errors), key="cmp.launch"):
            sweep = start_sweep(
                store, base, grid_of(lambdas=lambdas, seeds=range(int(seeds))), workers=int(workers)
            )
            _ui.sweeps()[sweep.sweep_id] = sweep
            st.session_state["cmp.sweep"] = sweep.sweep_id
    with right:
        sweep_list = store.list_sweeps()
        if not sweep_list:
            st.info("No sweeps yet.")
        else:
            ids = [s.id for s in sweep_list]
            chosen = st.session_state.get("cmp.sweep")
            sweep_id = st.selectbox(
                "sweep",
                ids,
                index=ids.index(chosen) if chosen in ids else 0,
                format_func=lambda i: store.get_sweep(i).name,
                key="cmp.progress_sweep",
            )
            running = store.get_sweep(sweep_id).status == "running"

            @st.fragment(run_every=1.0 if running else None)
            def progress() -> None:
                state = sweep_progress(store, sweep_id)
                st.progress(
                    state.fraction,
                    text=f"{state.done}/{state.total} trials ended · "
                    + ", ".join(f"{k}: {v}" for k, v in state.counts.items() if v),
                )
                trials = runs_frame(store.list_runs(sweep_id=sweep_id))
                trials["progress"] = (trials["env_steps"] / trials["total_steps"]).clip(0.0, 1.0)
                st.dataframe(
                    trials[["name", "status", "env_steps", "progress", "final_return"]],
                    hide_index=True,
                    column_config={
                        "progress": st.column_config.ProgressColumn(
                            "progress", min_value=0.0, max_value=1.0
                        )
                    },
                )
                if state.status == "running":
                    if st.button("Cancel sweep", key="cmp.cancel"):
                        cancel_sweep(store, sweep_id)
                elif running:
                    st.rerun()

            progress()

with analyse_tab:
    source = st.radio("runs", ["a sweep", "pick runs"], horizontal=True, key="cmp.source")
    if source == "a sweep":
        sweep_list = store.list_sweeps()
        if not sweep_list:
            st.info("No sweeps yet: launch one, or pick runs.")
            st.stop()
        names = {s.id: s.name for s in sweep_list}
        sweep_id = st.selectbox("sweep", list(names), format_func=names.get, key="cmp.sweep_pick")
        run_ids = [r.id for r in store.list_runs(sweep_id=sweep_id)]
    else:
        all_runs = {r.id: _ui.run_label(r) for r in store.list_runs()}
        run_ids = st.multiselect("runs", list(all_runs), format_func=all_runs.get, key="cmp.runs")
    fields = [name for name in FIELD_SPECS if name != "seed"]
    group = st.selectbox("group curves by", fields, index=fields.index("lambda_"), key="cmp.group")
    options = st.columns(3)
    window = options[0].slider("episodes per seed's running mean", 1, 100, 10, key="cmp.window")
    show_seeds = options[1].checkbox("show individual seeds", key="cmp.show_seeds")
    episodes = compare.episodes_frame(store, run_ids, group)
    if episodes.empty:
        st.info("No finished episodes in these runs yet.")
        st.stop()
    threshold = store.get_run(run_ids[0]).summary.reward_threshold
    bands, aligned = compare.aggregate_curves(episodes, group=group, window=window)
    figure, frame = figures.comparison_figure(bands, aligned, group=group, show_seeds=show_seeds)
    st.plotly_chart(figure, key="cmp.curves", config={"displaylogo": False})
    downloads = st.columns(3)
    with downloads[0]:
        _ui.csv_button(
            "Curves CSV (long: group, seed, step, return)",
            lambda: aligned,
            "lambda_curves.csv",
            "cmp.curves_csv",
        )
    with downloads[1]:
        _ui.csv_button(
            "Bands CSV (mean, 95% CI)", lambda: frame, "lambda_bands.csv", "cmp.bands_csv"
        )
    summary = compare.summary_table(episodes, group=group, threshold=threshold)
    st.subheader("Summary")
    st.caption(
        "Final return: mean ± std across seeds of each seed's last-100-episode mean. "
        "AUC: area under the seed-mean curve divided by its step span (the average return "
        "over training). Best (highlighted): highest AUC."
        + (f" Solved: a 100-episode mean ≥ {threshold:g}." if threshold is not None else "")
    )
    st.dataframe(
        summary.style.apply(
            lambda row: ["background-color: #d4edda" if row["best"] else ""] * len(row), axis=1
        ),
        hide_index=True,
        key="cmp.summary",
    )
    with downloads[2]:
        _ui.csv_button("Summary CSV", lambda: summary, "lambda_summary.csv", "cmp.summary_csv")
