"""Runs page: every run in the store; filter, sort, open, overlay, rename, delete, export."""

import hashlib
import secrets

import pandas as pd
import streamlit as st

from gae_core import metrics as M
from gae_core.errors import StoreError
from gae_core.inert import clean_name, markdown_text
from gae_core.insight import exports, figures, views
from gae_core.labels import MISSING, algorithm_name, label, run_label
from gae_core.outcome import SOLVED_WINDOW
from gae_core.storage.records import STATUSES
from gae_core.storage.table import runs_frame
from pages import _ui

_ui.require_navigation("pages/runs.py")
# The table's selection and the status filter follow the URL (``?run=…&status=…``, _ui.arrive):
# on arrival or Back the tables' selections are forgotten, and the table is keyed anew for the
# visit, so it starts from the URL's runs (a table the browser still showed would keep its own).
tables = [key for key in st.session_state if str(key).startswith("runs.table.")]
_ui.arrive("runs", ("runs.status", "runs.visit", *tables))
visit = st.session_state.setdefault("runs.visit", secrets.token_hex(4))

st.title("Runs")
store = _ui.store()
any_active = bool(store.list_runs(status=["queued", "running"]))


# The filters sit outside the live fragment, so typing in them is not undone by a redraw. The
# table's CSV is a link to the server's export, read from the store when clicked.
table = runs_frame(store.list_runs())
if table.empty:
    st.info("No runs in the store yet. Start one on the Train page.")
    st.stop()
filters = st.columns([2, 2, 2.6, 1.4], vertical_alignment="top")  # CSV link: one line, above
# the table's toolbar (which shows over the top of the table, where a bottom-aligned link sat)
unknown = _ui.options_are("the statuses", STATUSES)
statuses = filters[0].multiselect(
    "status", list(STATUSES),
    default=_ui.all_from_url("status", list(STATUSES), [], unknown, empty="every status"),
    key="runs.status",
)  # fmt: skip
_ui.to_url(status=statuses)
envs = filters[1].multiselect(
    "environment", sorted(table["env_id"].dropna().unique()), key="runs.env"
)
text = filters[2].text_input("name or id contains", key="runs.text")


def shown_runs() -> pd.DataFrame:
    """The runs the filters let through, as they are in the store now."""
    table = runs_frame(store.list_runs())
    return views.filter_runs(table, statuses=statuses, envs=envs, text=text).reset_index(drop=True)


with filters[3]:
    _ui.csv_link(
        "Runs table CSV", exports.runs_url(statuses=statuses, envs=envs, text=text), "runs-csv"
    )


@st.fragment(run_every=_ui.LIVE_CHARTS_EVERY_S if any_active else None)
def runs_view() -> None:
    """The table and the selected runs, refreshed every second while runs train."""
    shown = shown_runs()

    # The table's widget key names the exact list of run ids it shows (and the visit):
    # selections are row positions, so when another process adds or deletes a run the key
    # changes and the selection starts from the URL's runs, by id, instead of pointing at
    # whichever run moved into the selected row.
    shown_ids = shown["run_id"].tolist()
    gone = []  # a link to runs deleted since (the page's own Delete takes its run out of it)
    for linked in st.query_params.get_all("run"):
        if linked.strip() and linked not in shown_ids:  # filtered out, or gone: ask the store
            try:
                store.get_run(linked)
            except StoreError:
                gone.append(linked)
    if gone:
        _ui.say_cannot_open("runs" if len(gone) > 1 else "a run", _ui.not_held("run", gone))
    digest = hashlib.sha1("\n".join([visit, *shown_ids]).encode()).hexdigest()[:16]
    table_key = f"runs.table.{digest}"
    wanted = [shown_ids.index(i) for i in _ui.all_from_url("run", shown_ids, [])]
    on_screen = [
        "name", "run_id", "algo", "env_id", "lambda_", "gamma", "seed", "status", "env_steps",
        "best_return", "final_return", "solved_at_step", "started_at", "wall_seconds", "error",
    ]  # fmt: skip
    selection = st.dataframe(
        shown.assign(algo=shown["algo"].map(algorithm_name)),  # "ppo" reads as PPO
        hide_index=True,
        placeholder=MISSING,  # a run never solved: an empty cell, not "None"
        on_select="rerun",
        selection_mode="multi-row",
        selection_default={"selection": {"rows": wanted}} if wanted else None,
        key=table_key,
        column_order=on_screen,
        column_config={
            "name": st.column_config.TextColumn(label("name")),
            "run_id": st.column_config.TextColumn(label("run_id")),
            "algo": st.column_config.TextColumn(label("algo")),
            "env_id": st.column_config.TextColumn(label("env_id")),
            "lambda_": st.column_config.NumberColumn(label("lambda_"), format="%.3g"),
            "gamma": st.column_config.NumberColumn(label("gamma"), format="%.4g"),
            "env_steps": st.column_config.NumberColumn(label("env_steps"), format="localized"),
            "best_return": st.column_config.NumberColumn(
                label("best_return"),
                format="%.1f",
                help=f"best mean of {SOLVED_WINDOW} consecutive episodes ({MISSING} until "
                f"{SOLVED_WINDOW} have ended: a lucky handful is no best)",
            ),
            "final_return": st.column_config.NumberColumn(
                label("final_return"),
                format="%.1f",
                help=f"mean of the last {SOLVED_WINDOW} episodes (of all, while fewer have ended)",
            ),
            "solved_at_step": st.column_config.NumberColumn(
                label("solved_at_step"), format="localized"
            ),
            "started_at": st.column_config.TextColumn(label("started_at")),
            "wall_seconds": st.column_config.NumberColumn(label("wall_seconds"), format="%.1f"),
            "error": st.column_config.TextColumn(
                label("error"), help="why a run failed, or what is wrong with its stored row"
            ),
        },
    )

    rows = selection.selection.rows if selection else []
    selected = [shown_ids[i] for i in rows if 0 <= i < len(shown_ids)]
    if selected or selected != [shown_ids[i] for i in wanted]:
        # the user's choice (none: they deselected), not a context run only filtered out
        _ui.to_url(run=selected)
    if not selected:
        st.caption("Select one run to open it, several to overlay them.")
        return

    if len(selected) == 1:
        try:
            run = store.get_run(selected[0])
        except StoreError:
            st.warning("That run was deleted meanwhile.")
            return
        _ui.run_header(run)
        actions = st.columns([3, 1, 1])
        new_name = actions[0].text_input("name", value=run.name, key=f"runs.name.{run.id}")

        # never disabled by the box's value: a text box sends what was typed only when it
        # loses focus, so the click that takes the focus away must itself reach the button
        if actions[1].button("Rename", key="runs.rename"):
            try:  # checked before the dialog asks to confirm it, as the store will check it
                new_name = clean_name(new_name, field="run name")
            except ValueError as error:
                st.error(markdown_text(str(error)))
            else:
                if new_name == run.name:
                    st.info("Type the new name in the box, then press Rename.")
                else:
                    # kept in state: the dialog stays open, with the id it was opened for,
                    # until it is answered, whatever the table's selection does meanwhile
                    st.session_state["runs.renaming"] = (run.id, run.name, new_name)
                    st.rerun()  # the whole page: the dialogs are drawn outside this fragment
        if actions[2].button("Delete", key="runs.delete", disabled=run.active):
            st.session_state["runs.deleting"] = (run.id, run.name)
            st.rerun()
        with st.expander("Config"):
            st.json(run.config)
        _ui.run_charts(run.id, prefix="runs", live=run.active, **_ui.chart_controls("runs"))
    else:
        metric = st.selectbox(
            "metric",
            [m.key for m in M.LIVE],
            format_func=lambda k: M.get(k).title,
            key="runs.metric",
        )
        controls = _ui.chart_controls("runs")
        chosen = shown[shown["run_id"].isin(selected)]
        if chosen["env_id"].nunique() > 1:
            st.warning(
                "These runs come from different environments "
                f"({', '.join(sorted(chosen['env_id'].dropna().unique()))}): their returns are not "
                "on one scale."
            )
        runs = {run_label(store.get_run(r)): store.metrics(r, [metric]) for r in selected}
        figure, _ = figures.overlay_figure(
            runs, metric, x=controls["x"], smoothing=controls["smoothing"]
        )
        st.plotly_chart(figure, key="runs.overlay", config={"displaylogo": False})
        url = exports.overlay_url(selected, metric, smoothing=controls["smoothing"])
        _ui.csv_link("CSV of every logged point", url, "runs-overlay-csv")


@st.dialog("Rename run", on_dismiss=lambda: st.session_state.pop("runs.renaming", None))
def confirm_rename(run_id: str, old: str, new: str) -> None:
    st.markdown(f"Rename **{markdown_text(old)}** ({run_id}) to **{markdown_text(new)}**?")
    if st.button("Rename", type="primary", key="runs.rename.confirm"):
        st.session_state.pop("runs.renaming", None)
        try:
            store.rename_run(run_id, new)
        except (ValueError, StoreError) as error:
            st.error(str(error))
            return
        st.rerun()


@st.dialog("Delete run", on_dismiss=lambda: st.session_state.pop("runs.deleting", None))
def confirm_delete(run_id: str, name: str) -> None:
    st.markdown(
        f"Delete **{markdown_text(name)}** ({run_id}) with its metrics, checkpoints and "
        "trajectories?"
    )
    st.write("This cannot be undone.")
    if st.button("Delete", type="primary", key="runs.delete.confirm"):
        st.session_state.pop("runs.deleting", None)
        try:
            store.delete_run(run_id)  # by id: rows that moved meanwhile cannot redirect it
        except StoreError as error:
            st.error(str(error))
            return
        _ui.to_url(run=[r for r in st.query_params.get_all("run") if r != run_id])
        st.rerun()


runs_view()
# The dialogs belong to the run they were opened for (its id), not to a row of the table: a run
# that another process adds or deletes while one is open changes the rows, never the dialog.
if renaming := st.session_state.get("runs.renaming"):
    confirm_rename(*renaming)
elif deleting := st.session_state.get("runs.deleting"):
    confirm_delete(*deleting)

st.divider()
size = store.size_bytes()
st.caption(f"Store: {size / 2**20:,.1f} MB at {markdown_text(str(store.path))}")
with st.expander("Retention"):
    st.write(
        "Checkpoints, with their recorded trajectories, are most of the store. Thinning keeps "
        "every N-th checkpoint of each ended run and always its last one."
    )
    keep = st.number_input("keep every N-th checkpoint", 1, 1000, 2, key="runs.keep")
    cols = st.columns(3)
    if cols[0].button("Thin checkpoints", key="runs.thin"):
        removed = store.thin_checkpoints(int(keep))
        saved = store.vacuum()
        st.success(f"Removed {removed:,} checkpoints; {saved / 2**20:,.1f} MB given back.")
    orphans_help = "Rows left by runs deleted in older versions of the store."
    if cols[1].button("Drop orphaned data", key="runs.orphans", help=orphans_help):
        removed = store.drop_orphans()
        saved = store.vacuum()
        st.success(f"Removed {removed:,} orphaned rows; {saved / 2**20:,.1f} MB given back.")
