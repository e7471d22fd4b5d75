"""Train page: configure and start A2C or PPO runs with GAE, watch them learn live, stop them."""

import time

import pandas as pd
import streamlit as st

from gae_core import metrics as M
from gae_core.insight import figures, views
from gae_core.labels import label, run_label
from pages import _ui

_ui.require_navigation("pages/train.py")
FIRST_POINTS_FOR_S = 10.0
_ui.arrive("train", ("train.view",))

st.title("Train")
st.caption(
    f"A2C or PPO with GAE({label('gamma')}, {label('lambda_')}) advantages on a gymnasium "
    "environment, trained in a background process. "
    "Runs keep going when you close the tab; come back here or to Runs to find them."
)
manager = _ui.manager()
store = manager.store

form_column, live_column = st.columns([1, 2], gap="large")

with form_column:
    st.subheader("Configuration")
    # Start and the form's verdict come first (filled in below, once the fields are read), so
    # they are on screen without scrolling past every field.
    top = st.container()
    values = _ui.config_form("train")
    with top:
        left, right = st.columns([3, 1], vertical_alignment="bottom")
        name = left.text_input(
            "run name (optional)", key="train.name", max_chars=80, persist_state="session"
        )  # kept, as the fields below are
        config, errors, warnings = views.build_config(values)
        if right.button("Start", type="primary", disabled=config is None, key="train.start"):
            run_name = name if name.strip() else None
            try:  # a double click starts one run (the second click gets the first's id)
                run_id = _ui.start_once(
                    "train.start", {"config": config.to_dict(), "name": run_name},
                    lambda: manager.start(config, name=run_name), "this run",
                )  # fmt: skip
            except ValueError as error:  # a name with nothing printable in it
                errors = [str(error)]
            else:
                if run_id is not None:
                    # the run selectbox below is keyed: set its state, or it keeps the old run
                    st.session_state["train.view"] = run_id
        _ui.show_problems(errors, warnings)
        _ui.offer_spacing("train", config)

with live_column:
    runs = store.list_runs()
    if not runs:
        st.info("No runs yet: set the configuration and press Start.")
        # the return chart, empty, where it will be: the browser loads its chart library now,
        # not when the first point arrives (docs/PERFORMANCE.md, "Start → first reward point")
        empty = pd.DataFrame({"key": [], "env_step": [], "wall_time": [], "value": []})
        figure, _ = figures.metric_figure(empty, M.EPISODIC_RETURN.key)
        st.plotly_chart(figure, key="train.placeholder", config={"displaylogo": False})
        st.stop()
    active = [r for r in runs if r.active]
    ordered = active + [r for r in runs if not r.active]
    ids = [r.id for r in ordered]
    if st.session_state.get("train.view") not in ids:  # arrived here, or the run was deleted
        st.session_state["train.view"] = _ui.from_url("run", ids, ids[0])
    labels = {r.id: run_label(r) for r in ordered}
    pick, reuse, stop = st.columns([3, 1.6, 1], vertical_alignment="bottom")
    run_id = pick.selectbox("run", ids, format_func=labels.get, key="train.view")
    _ui.say_if_linked_missing(ids, labels[run_id], "")  # every stored run is listed here
    _ui.to_url(run=run_id)
    shown = store.get_run(run_id)
    running = shown.active
    # outside the fragments, as Stop: the form it fills is drawn by the whole page
    cannot = _ui.reuse_settings_problem(shown)
    reuse.button("Reuse settings", key="train.reuse", icon=":material/content_copy:",
                 on_click=_ui.reuse_settings, args=("train", shown), disabled=bool(cannot),
                 help=cannot or "Fill the form with this run's settings, seed and all, to "
                 "change one and start again. (A sweep's trial trained in a population: alone, "
                 "the same settings train the same run up to float rounding, which can grow "
                 "over training.)", width="stretch")  # fmt: skip
    if running:
        # Outside the fragments, beside the run it stops: a click reruns the whole page, which
        # supersedes whichever fragment's timer is running or queued, instead of queueing one
        # more fragment run behind them on a loaded server. A callback, not `if st.button`:
        # it runs before anything is drawn. When the run ends, the status line's fragment
        # reruns the page and the button goes.
        stop.button("Stop", key="train.stop", icon=":material/stop:", on_click=manager.stop,
                    args=(run_id,), width="stretch")  # fmt: skip

    # Two fragments: the status line refreshes every second and costs little; the charts (the
    # expensive part) refresh on their own timer, and a click on a chart control reruns only
    # them.
    @st.fragment(run_every=1.0 if running else None)
    def status() -> None:
        run = store.get_run(run_id)
        _ui.run_header(run)
        # where to take this run next, the run in the link: the explorer and the lab, open once
        # it has a checkpoint (a training run gains one as it goes). Drawn from the start, so
        # nothing below moves when they open (a click in flight would land elsewhere).
        links = st.columns(3)
        closed = None
        if not store.checkpoint_steps(run_id):
            closed = ("Open once the run has a checkpoint." if run.active
                      else "This run saved no checkpoint.")  # fmt: skip
        where = {"query_params": {"run": run_id}, "disabled": bool(closed), "help": closed}
        links[0].page_link("pages/explorer.py", label="Explore this run",
                           icon=":material/biotech:", **where)  # fmt: skip
        links[1].page_link("pages/lab.py", label="Measure it in the lab",
                           icon=":material/science:", **where)  # fmt: skip
        if run.sweep_id is not None:
            links[2].page_link("pages/compare.py", label="Compare its sweep",
                               icon=":material/stacked_line_chart:",
                               query_params={"source": "sweep", "sweep": run.sweep_id})  # fmt: skip
        if running and not run.active:  # it just ended: redraw the page once, without timers
            st.rerun()

    # a run just started looks for its first points often (for its first 10 s at most: long
    # first episodes), then redraws at the live pace
    started = shown.started_at
    young = started is None or time.time() - started < FIRST_POINTS_FOR_S
    waiting = running and young and st.session_state.get("train.drawn") != run_id
    every = _ui.FIRST_POINTS_EVERY_S if waiting else _ui.LIVE_CHARTS_EVERY_S

    @st.fragment(run_every=every if running else None)
    def charts() -> None:
        if waiting and st.session_state.get("train.drawn") == run_id:
            # drawn a tick ago: rerun the page, so this timer slows to the live pace; before
            # drawing anything (what a fragment draws before a rerun is dropped from the page)
            st.rerun()
        drew = _ui.run_charts(run_id, prefix="train", live=running, **_ui.chart_controls("train"))
        if waiting and drew:
            st.session_state["train.drawn"] = run_id

    status()
    charts()
