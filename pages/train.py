"""Train page: configure and start A2C+GAE runs, watch them learn live, stop them."""

import streamlit as st

from gae_core.insight import views
from pages import _ui

_ui.require_navigation("pages/train.py")

st.title("Train")
st.caption(
    "A2C with GAE(γ, λ) advantages on a gymnasium environment, trained in a background thread. "
    "Runs keep going when you close the tab; come back here or to Runs to find them."
)
manager = _ui.manager()
store = manager.store

form_column, live_column = st.columns([1, 2], gap="large")

with form_column:
    st.subheader("Configuration")
    values = _ui.config_form("train")
    name = st.text_input("run name (optional)", key="train.name", max_chars=80)
    config, errors, warnings = views.build_config(values)
    _ui.show_problems(errors, warnings)
    if st.button("Start", type="primary", disabled=config is None, key="train.start"):
        # the run selectbox below is keyed: set its state, or it keeps showing the old run
        st.session_state["train.view"] = manager.start(config, name=name.strip() or None)

with live_column:
    runs = store.list_runs()
    if not runs:
        st.info("No runs yet: set the configuration and press Start.")
        st.stop()
    active = [r for r in runs if r.active]
    ordered = active + [r for r in runs if not r.active]
    ids = [r.id for r in ordered]
    if st.session_state.get("train.view") not in ids:  # first visit, or the run was deleted
        chosen = st.session_state.get("train.run")
        st.session_state["train.view"] = chosen if chosen in ids else ids[0]
    labels = {r.id: _ui.run_label(r) for r in ordered}
    run_id = st.selectbox("run", ids, format_func=labels.get, key="train.view")
    st.session_state["train.run"] = run_id
    running = store.get_run(run_id).active

    @st.fragment(run_every=1.0 if running else None)
    def live() -> None:
        # The chart controls live in the fragment: a click reruns only this part of the page.
        controls = st.columns([2, 3])
        x_axis = controls[0].radio(
            "x axis",
            ["env_step", "wall_time"],
            format_func={"env_step": "env steps", "wall_time": "wall time"}.get,
            horizontal=True,
            key="train.x",
        )
        smoothing = controls[1].slider(
            "return smoothing (TensorBoard EMA weight)", 0.0, 0.99, 0.6, 0.01, key="train.smooth"
        )
        run = store.get_run(run_id)
        _ui.run_header(run)
        if run.active:
            if st.button("Stop", key="train.stop", icon=":material/stop:"):
                manager.stop(run_id)
        elif running:  # it just ended: redraw the page once, without the timer
            st.rerun()
        _ui.run_charts(run_id, x=x_axis, smoothing=smoothing, prefix="train")

    live()
