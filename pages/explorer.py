"""Advantage explorer: δ_t, Â^(k) and GAE(γ, λ) step by step on a recorded trajectory."""

import streamlit as st

from gae_core.agent.config import field_problems
from gae_core.inert import markdown_text
from gae_core.insight import explorer, figures
from gae_core.insight.views import field_message, whole_number
from gae_core.labels import assignment, label, run_label
from pages import _ui

_ui.require_navigation("pages/explorer.py")
LAMBDA, GAMMA = label("lambda_"), label("gamma")

st.title("Advantage explorer")
store = _ui.store()


@st.cache_data(max_entries=32, show_spinner="Loading the trajectory…")
def trajectory_arrays(run_id, policy_step, recorded, fresh_seed, critic_step):
    trajectory = explorer.load_trajectory(
        store,
        run_id,
        policy_step,
        recorded=recorded,
        fresh_seed=fresh_seed,
        critic_step=critic_step,
    )
    arrays = (
        trajectory.rewards,
        trajectory.values,
        trajectory.next_values,
        trajectory.terminated,
        trajectory.truncated,
    )
    return arrays, float(trajectory.value_scale)


@st.cache_data(max_entries=64)
def estimates(arrays, gamma, ks):
    """δ, Â^(k) table and one gae_lambda_sweep over the whole λ grid (slider moves are free)."""
    import gae_core

    base = explorer.advantage_table(*arrays, gamma=gamma, lambdas=[], ks=list(ks))
    sweep = gae_core.gae_lambda_sweep(*arrays, gamma=gamma, lambdas=explorer.LAMBDA_GRID)
    return base, sweep


with_trajectories = store.runs_with_trajectories()
runs = [r for r in store.list_runs() if r.id in with_trajectories and not r.damaged]
if not runs:
    st.info("No run has recorded trajectories yet: train one (checkpoints record them).")
    st.stop()

#: Widgets whose defaults come from the run (its checkpoints, its γ and λ): a widget with a key
#: keeps its value when its default changes, so another run forgets them and starts from its own.
PER_RUN = ("ex.policy", "ex.critic", "ex.source", "ex.gamma", "ex.t", "ex.seed")


def _forget(keys: tuple[str, ...]) -> None:
    for key in keys:
        st.session_state.pop(key, None)


def _start_at(key: str, value) -> None:
    """Give a per-run widget its run's default through Session State, not as its default
    argument: the browser keeps a keyed widget's value by its key, and only a value set this way
    replaces what it shows, so a picked run's boxes show its own checkpoints and γ."""
    if key not in st.session_state:
        st.session_state[key] = value


_ui.arrive("explorer", ("ex.run", *PER_RUN))
pick = st.columns([3, 2, 2, 2])
labels = {r.id: run_label(r) for r in runs}
ids = list(labels)
run_id = pick[0].selectbox(
    "run", ids, index=ids.index(_ui.from_url("run", ids, ids[0])), format_func=labels.get,
    key="ex.run", on_change=_forget, args=(PER_RUN,),
)  # fmt: skip
_ui.say_if_linked_missing(ids, labels[run_id], "has no recorded trajectory to explore")
run = store.get_run(run_id)
steps = store.checkpoint_steps(run_id)
# the URL's checkpoints count only for the run it names (another run's steps mean nothing here)
url_run = _ui.from_url("run", [run_id], None) == run_id
unheld = _ui.not_a_checkpoint(steps)
_start_at("ex.policy", _ui.from_url("policy", steps, steps[-1], unheld) if url_run else steps[-1])
policy_step = pick[1].selectbox(
    "policy checkpoint (env step)", steps, format_func="{:,}".format, key="ex.policy"
)
# the lab's critics are a list (an early one next to the policy's own): the explorer takes the
# last, the policy's own where the lab's default or its "Measure this checkpoint" set them
_start_at("ex.critic", _ui.all_from_url("critic", steps, [policy_step], unheld)[-1]
          if url_run else policy_step)  # fmt: skip
critic_step = pick[2].selectbox(
    "critic checkpoint (values)",
    steps,
    format_func="{:,}".format,
    key="ex.critic",
    help="Re-evaluate V with another checkpoint's critic: an early critic shows how critic "
    "error turns into bias in the advantages.",
)
recorded = len(store.trajectory_blobs(run_id, policy_step))
sources = [f"recorded #{i}" for i in range(recorded)] + ["fresh recording"]
unrecorded = _ui.options_are("this checkpoint's trajectories", sources)
_start_at("ex.source", _ui.from_url("trajectory", sources, sources[0], unrecorded)
          if url_run else sources[0])  # fmt: skip
source = pick[3].selectbox("trajectory", sources, key="ex.source")
fresh_seed = None
if source == "fresh recording":
    # text, read on the server: a browser number box refuses a value past 2^53 unsaid
    _start_at("ex.seed", _ui.text_from_url("seed", "0") if url_run else "0")
    fresh_seed = whole_number(st.text_input("seed of the fresh episode", key="ex.seed"))
    if problem := field_problems({"seed": fresh_seed}).get("seed"):
        st.error(markdown_text(f"the fresh episode's {problem}"))  # it quotes what was typed
        st.stop()
arrays, value_scale = trajectory_arrays(
    run_id,
    policy_step,
    None if fresh_seed is not None else sources.index(source),
    fresh_seed,
    critic_step,
)


def _sorted(key: str) -> None:
    """Keep a multiselect's chips in value order (the order of the lines' colours)."""
    st.session_state[key] = sorted(st.session_state[key])


knobs = st.columns([2, 3, 3, 3])
# the URL's γ (a link to a view at another γ), else the run's own
_start_at("ex.gamma", _ui.number_from_url("gamma", float(run.config["gamma"]), 0.0, 1.0)
          if url_run else float(run.config["gamma"]))  # fmt: skip
# no min/max on the box: the browser would refuse a value out of [0, 1] with a small red mark
# and keep the last one; here the estimators' own message names the field and its range
gamma = knobs[0].number_input(
    label("gamma"), step=0.001, format="%.6g", key="ex.gamma",
    help=f"In [0, 1]; shown and used at full precision (the run's own {GAMMA} by default).",
)  # fmt: skip
# λ moves in the browser (the chart's own slider): the server only says where it starts
own_lambda = round(run.config["lambda_"], 2)  # the slider's grid: λ to 2 decimals
linked = _ui.number_from_url("lambda", own_lambda, 0.0, 1.0) if url_run else own_lambda
lambda_ = round(linked, 2)  # on the slider's grid (a link's 0.955 starts it at 0.95)
_start_at("ex.t", 0)
t = _ui.index_slider(
    knobs[1], "step t for the weights", len(arrays[0]), "ex.t",
    help="The bottom panel's step: how GAE weighs each Â^(k) there, with the steps left in "
    "its segment.",
)  # fmt: skip
# what makes the numbers, in the link: γ as it round-trips, a fresh episode's seed (none for a
# recorded one: another run's fresh seed would carry over)
# λ moves in the browser: the link's is only where the slider starts, rewritten where the page
# could not read it (named above), so the link does not keep a value it cannot show
unread = {"lambda": lambda_} if st.query_params.get("lambda") not in (None, str(lambda_)) else {}
in_range = gamma is not None and 0.0 <= gamma <= 1.0  # (else said below; the link keeps none)
_ui.to_url(run=run_id, policy=policy_step, critic=critic_step, trajectory=source,
           gamma=repr(float(gamma)) if in_range else [],
           seed=[] if fresh_seed is None else fresh_seed, **unread)  # fmt: skip
# defaults through Session State, as the per-run boxes': `_sorted` sets these keys, and a
# widget with a default argument whose key the API set logs Streamlit's warning about both
_start_at("ex.pinned", [1.0])  # λ = 0 is δ itself: pinning it would draw δ twice
_start_at("ex.ks", [10])  # Â^(1) is δ itself
pinned = knobs[2].multiselect(
    f"pinned {LAMBDA} (overlay)",
    [float(x) for x in explorer.LAMBDA_GRID],
    key="ex.pinned",
    on_change=_sorted,
    args=("ex.pinned",),
)
ks = knobs[3].multiselect(
    "k-step horizons k",
    [1, 2, 3, 5, 10, 20, 50, 100, 200, 500],
    key="ex.ks",
    on_change=_sorted,
    args=("ex.ks",),
)

try:
    base, sweep = estimates(arrays, gamma, tuple(sorted(ks)))
except ValueError as error:  # γ out of [0, 1]: said under its name, nothing drawn at another γ
    st.error(markdown_text(field_message("gamma", str(error))))
    st.stop()
table = explorer.with_gae_columns(base, sweep, pinned)
shown = ["delta", *[explorer.k_step_column(k) for k in sorted(ks)]]
shown += [explorer.gae_column(x) for x in sorted(pinned)]

figure, frames = figures.explorer_figure(table, sweep, show=shown, lambda_=lambda_, t=int(t))
st.plotly_chart(figure, key="ex.main", config={"displaylogo": False})
horizon = int(table["steps_left"].iloc[int(t)])
st.caption(
    f"Drag {LAMBDA} on the chart: it redraws in the browser. At t = {int(t)}, {horizon} "
    f"{'step is' if horizon == 1 else 'steps are'} left in the segment: Â^({horizon}) carries "
    f"the tail {LAMBDA}^{horizon - 1} of the weight (red)."
)
# every CSV says what made it: the run, both checkpoints, the trajectory and γ
made_by = {"run_id": run_id, "policy_step": policy_step, "critic_step": critic_step,
           "trajectory": source if fresh_seed is None else f"fresh recording, seed {fresh_seed}",
           "gamma": gamma}  # fmt: skip
row = st.columns([1.7, 1.4, 1.3, 3.6])  # the lab button's label whole at 1400 px
with row[0]:
    _ui.csv_button("Per-step table CSV", frames["steps"], "advantages.csv", "ex.csv",
                   made_by)  # fmt: skip
with row[1]:
    _ui.csv_button("Heat map CSV", frames["heat"], "gae_heatmap.csv", "ex.heat_csv",
                   made_by)  # fmt: skip
with row[2]:
    _ui.csv_button("Weights CSV", frames["weights"], "weights.csv", "ex.weights_csv",
                   {**made_by, "t": int(t), "steps_left": horizon})  # fmt: skip
row[3].markdown(
    f"**{len(table)} steps**, episode ends: "
    f"{'terminated' if table['terminated'].iloc[-1] else 'truncated or cut'} · "
    f"{assignment('gamma', gamma)}"
)
if row[3].button(
    "Measure this checkpoint in the Estimator lab",
    icon=":material/science:",
    key="ex.to_lab",
    help="Bias², variance and MSE of every estimator against Monte-Carlo truth, for this "
    "policy with this critic (and the policy's own).",
):
    # the lab's whole selection, so its first run adds no history entry: Back comes here
    critics = [str(step) for step in dict.fromkeys([critic_step, policy_step])]
    wanted = {"run": run_id, "policy": str(policy_step), "critic": critics, "view": "per state"}
    st.switch_page("pages/lab.py", query_params=wanted)
st.caption(explorer.units_note(run.config, value_scale))
with st.expander("What the lines are", expanded=False):
    # one formula per row: three side by side were cut off at 1400 px
    st.markdown("TD residual — the one-step advantage, biased wherever V is wrong:")
    st.latex(r"\delta_t = r_t + \gamma\,(1-\text{term}_t)\,V(s_{t+1}) - V(s_t)")
    st.markdown("k-step — k real rewards, then the critic (stops at the episode end):")
    st.latex(r"\hat A^{(k)}_t = \sum_{l=0}^{k-1} \gamma^l \delta_{t+l}")
    st.markdown("GAE — every k-step estimator, weighted geometrically:")
    st.latex(
        r"\begin{aligned}\hat A^{\mathrm{GAE}}_t &= \sum_{l=0}^{L_t-1}(\gamma\lambda)^l"
        r"\,\delta_{t+l} \\ &= (1-\lambda)\sum_{k=1}^{L_t-1}\lambda^{k-1}\hat A^{(k)}_t"
        r" + \lambda^{L_t-1}\hat A^{(L_t)}_t\end{aligned}"
    )
    st.markdown(
        f"Three of the lines coincide: δ_t = Â^(1)_t = GAE({assignment('lambda_', 0)}). "
        f"{assignment('lambda_', 0)} is δ_t: low variance, biased by critic error. "
        f"{assignment('lambda_', 1)} is the discounted return minus V(s_t): unbiased for the "
        f"{GAMMA}-discounted objective, but it carries the noise of "
        "every later reward. L_t counts the steps left in t's episode segment; truncated "
        "steps bootstrap from V of the final observation, terminated ones do not. The "
        "Estimator lab measures this trade-off instead of asserting it."
    )
