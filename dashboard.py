"""The dashboard's main script (served by ``app.py``): navigation, the home page and the
sidebar's runs in progress. Thin: all logic lives in gae_core; pages/ hold one file per page."""

import streamlit as st

from gae_core.agent.presets import preset_config
from gae_core.env_modules import ENV_MODULES_VAR, EnvModuleError, import_named_modules
from gae_core.inert import markdown_text
from gae_core.insight import views
from gae_core.labels import label
from pages import _ui

LAMBDA = label("lambda_")
st.set_page_config(page_title="GAE Lab", page_icon=LAMBDA, layout="wide")
try:  # the env modules the server was started with (GAE_CORE_ENV_MODULES) register their envs
    import_named_modules()
except EnvModuleError as error:
    st.error(f"{error}. Fix {ENV_MODULES_VAR} and restart the server.", icon=":material/error:")


def home() -> None:
    st.title("GAE Lab")
    st.markdown(
        "A workbench for advantage estimators in policy-gradient RL: the TD residual "
        f"δ_t, the k-step estimators Â^(k) and GAE({label('gamma')}, {LAMBDA}) "
        "([Schulman et al., 2016](https://arxiv.org/abs/1506.02438)). "
        "Train A2C or PPO agents with GAE, "
        f"watch them learn, and see what {LAMBDA} does."
    )
    left, right = st.columns([1, 2], gap="large")
    with left:
        st.subheader("Quick start")
        st.caption("Train CartPole-v1 with its preset (about a minute) and watch it live.")
        if st.button("Train CartPole-v1", type="primary", icon=":material/play_arrow:",
                     key="home.quick"):  # fmt: skip
            run_id = _ui.manager().start(preset_config("CartPole-v1"))
            st.switch_page(train, query_params={"run": run_id})
    with right:
        st.subheader("Recent runs")
        recent = _ui.store().list_runs()[:5]
        if not recent:
            st.caption("None yet.")
        for run in recent:
            st.markdown(
                f"{_ui.STATUS_ICONS.get(run.status, '')} **{markdown_text(run.name)}** — "
                f"{markdown_text(views.status_text(run))}"
            )
        if recent:
            st.page_link(runs, label="All runs", icon=":material/table_rows:")
    st.subheader("Pages")
    st.page_link(
        train,
        label="Train — start A2C or PPO runs and watch them learn live",
        icon=":material/fitness_center:",
    )
    st.page_link(
        runs,
        label="Runs — every run in the store: open, overlay, export",
        icon=":material/table_rows:",
    )
    st.page_link(
        explorer_page,
        label=f"Advantage explorer — δ_t, Â^(k) and GAE step by step as {LAMBDA} moves",
        icon=":material/biotech:",
    )
    st.page_link(
        lab_page,
        label="Estimator lab — measured bias², variance and MSE of each estimator against "
        "Monte-Carlo truth",
        icon=":material/science:",
    )
    st.page_link(
        compare,
        label=f"{LAMBDA} comparison — {LAMBDA} × seed sweeps with 95% bands",
        icon=":material/stacked_line_chart:",
    )


@st.fragment(run_every=2.0)
def runs_in_progress() -> None:
    """The sidebar's runs in progress, drawn after the page (a run its Start just stored is
    listed at once) and on a timer (runs that start or end elsewhere)."""
    store = _ui.store()
    active = store.list_runs(status=["queued", "running"])
    st.caption(f"Runs in progress: {len(active)}")
    for run in active[:10]:
        fraction, eta = views.progress(run, rate=views.measured_rate(store, run))
        when = "queued" if run.status == "queued" else f"ETA {views.format_duration(eta)}"
        st.progress(fraction, text=f"{markdown_text(run.name)} · {when}")
        st.page_link(train, label="watch on Train", icon=":material/fitness_center:",
                     query_params={"run": run.id})  # fmt: skip
    for key, job in list(_ui.lab_jobs().items()):  # a lab measurement left running: its
        if job.seen:  # progress and the way back to it, until the lab page has shown its end
            continue
        view = "policy gradient" if key.startswith("gradient ") else "per state"
        if not job.done:
            when = _ui.lab_eta(job)
        else:
            when = "failed" if job.error else "cancelled" if job.cancelled else "done"
        st.progress(job.fraction, text=f"lab ({view}): run {job.run_id} · {when}")
        st.page_link(lab_page, label="open in the lab", icon=":material/science:",
                     query_params={"run": job.run_id, "view": view})  # fmt: skip


home_page = st.Page(home, title="Home", icon=":material/home:", default=True)
train = st.Page("pages/train.py", title="Train", icon=":material/fitness_center:")
runs = st.Page("pages/runs.py", title="Runs", icon=":material/table_rows:")
explorer_page = st.Page("pages/explorer.py", title="Advantage explorer", icon=":material/biotech:")
lab_page = st.Page("pages/lab.py", title="Estimator lab", icon=":material/science:")
compare = st.Page(
    "pages/compare.py", title=f"{LAMBDA} comparison", icon=":material/stacked_line_chart:"
)
pages = [home_page, train, runs, explorer_page, lab_page, compare]
st.session_state[_ui.NAVIGATION_FLAG] = True
page = st.navigation(pages)
wanted = st.session_state.pop(_ui.WANTED_PAGE, None)
if wanted is not None:  # a direct link that reached a page before navigation existed
    wanted_page, params = wanted
    st.switch_page(wanted_page, query_params=params)
_ui.expand_short_ids()  # ?run=ab0c, as the CLI takes an id: the page reads the full id
try:
    page.run()
finally:  # the sidebar after the page, so a run its Start or Launch just stored is listed
    with st.sidebar:
        runs_in_progress()
