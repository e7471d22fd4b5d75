"""Runs page: every run in the store; filter, sort, open, overlay, rename, delete, export."""

import streamlit as st

from gae_core import dashboard, figures
from gae_core.store import STATUSES, StoreError
from pages import _ui

_ui.require_navigation("pages/runs.py")

st.title("Runs")
store = _ui.store()
table = dashboard.runs_table(store.list_runs())
if table.empty:
    st.info("No runs in the store yet. Start one on the Train page.")
    st.stop()

filters = st.columns([2, 2, 3])
statuses = filters[0].multiselect("status", list(STATUSES), key="runs.status")
envs = filters[1].multiselect("environment", sorted(table["env"].dropna().unique()), key="runs.env")
text = filters[2].text_input("name or id contains", key="runs.text")
shown = dashboard.filter_runs(table, statuses=statuses, envs=envs, text=text)

selection = st.dataframe(
    shown,
    hide_index=True,
    on_select="rerun",
    selection_mode="multi-row",
    key="runs.table",
    column_config={
        "lambda": st.column_config.NumberColumn("λ", format="%.3g"),
        "gamma": st.column_config.NumberColumn("γ", format="%.3g"),
        "env_steps": st.column_config.NumberColumn("steps", format="localized"),
        "best_return": st.column_config.NumberColumn(
            "best return", format="%.1f", help="best mean of 100 consecutive episodes"
        ),
        "final_return": st.column_config.NumberColumn(
            "final return", format="%.1f", help="mean of the last 100 episodes"
        ),
        "sweep_id": None,  # in the CSV, not on screen
        "solved_at_step": st.column_config.NumberColumn("solved at step", format="localized"),
        "duration_s": st.column_config.NumberColumn("duration (s)", format="%.1f"),
    },
)
_ui.csv_button("Runs table CSV", lambda: shown, "runs.csv", key="runs.csv")

selected = shown.iloc[selection.selection.rows]["run_id"].tolist() if selection else []
if not selected:
    st.caption("Select one run to open it, several to overlay them.")
    st.stop()

x_axis = st.radio(
    "x axis",
    ["env_step", "wall_time"],
    format_func=figures.X_AXES.get,
    horizontal=True,
    key="runs.x",
)

if len(selected) == 1:
    run = store.get_run(selected[0])
    _ui.run_header(run)
    actions = st.columns([3, 1, 1])
    new_name = actions[0].text_input("name", value=run.name, key=f"runs.name.{run.id}")
    if actions[1].button("Rename", key="runs.rename", disabled=new_name.strip() == run.name):
        try:
            store.rename_run(run.id, new_name)
            st.rerun()
        except (ValueError, StoreError) as error:
            st.error(str(error))

    @st.dialog("Delete run")
    def confirm_delete(run_id: str, name: str) -> None:
        st.write(f"Delete **{name}** ({run_id}) with its metrics, checkpoints and trajectories?")
        st.write("This cannot be undone.")
        if st.button("Delete", type="primary", key="runs.delete.confirm"):
            try:
                store.delete_run(run_id)
            except StoreError as error:
                st.error(str(error))
                return
            st.rerun()

    if actions[2].button("Delete", key="runs.delete", disabled=run.active):
        confirm_delete(run.id, run.name)
    with st.expander("Config"):
        st.json(run.config)
    smoothing = st.slider("return smoothing", 0.0, 0.99, 0.6, 0.01, key="runs.smooth")
    _ui.run_charts(run.id, x=x_axis, smoothing=smoothing, prefix="runs")
else:
    metric = st.selectbox(
        "metric",
        list(dashboard.LIVE_METRICS),
        format_func=lambda k: figures.METRIC_LABELS[k][0],
        key="runs.metric",
    )
    smoothing = st.slider("smoothing", 0.0, 0.99, 0.6, 0.01, key="runs.overlay_smooth")
    names = dict(zip(shown["run_id"], shown["name"], strict=True))
    runs = {f"{names[r]} ({r})": store.metrics(r, [metric]) for r in selected}
    figure, frame = figures.overlay_figure(runs, metric, x=x_axis, smoothing=smoothing)
    st.plotly_chart(figure, key="runs.overlay", config={"displaylogo": False})
    _ui.csv_button("CSV", lambda: frame, f"overlay_{figures.column_name(metric)}.csv", "runs.ocsv")
