"""Estimator lab: measured bias², variance and MSE of δ, Â^(k) and GAE(λ) against Monte-Carlo
truth, on a run's checkpoints or on the exact chain."""

import dataclasses

import gymnasium as gym
import numpy as np
import pandas as pd
import streamlit as st

from gae_core.errors import UnsupportedEnvError
from gae_core.inert import markdown_text
from gae_core.insight import lab_figures
from gae_core.insight.views import whole_number
from gae_core.lab import chain
from gae_core.lab.gradient import DEBIASED_NOTE, GradientResult, batch_problem, gradient_sentence
from gae_core.lab.gradient_samples import REFERENCE_COPIES
from gae_core.lab.jobs import (
    LabJob,
    check_run_env,
    critic_name,
    gradient_label,
    measure_gradient_run,
    state_label,
)
from gae_core.lab.measure import (
    BIAS2_NOTE,
    GSDE_NOTE,
    LabResult,
    LabSettings,
    check_memory,
    trade_off_sentence,
)
from gae_core.lab.settings import GradientSettings
from gae_core.lab.states import state_access
from gae_core.labels import assignment, label, run_label
from gae_core.storage.lab_table import LabRecord
from pages import _ui

_ui.require_navigation("pages/lab.py")
LAMBDA = label("lambda_")
#: The chain view's choices of Monte-Carlo samples (each draw takes milliseconds).
CHAIN_SAMPLES = (200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000)

st.title("Estimator lab")
st.caption(
    "How wrong is each advantage estimator, measured? For states s the policy visits (with the "
    "action a it took), the truth is Q^π(s, a) − V̂(s), by Monte Carlo with the infinite-horizon "
    "discount; each estimator is computed on K fresh continuations of (s, a) with the chosen "
    "critic. **Bias** is the error the critic injects by bootstrapping "
    f"({assignment('lambda_', 1)} has none where a continuation ends within L steps); "
    "**variance** is the noise of the sampled rewards; **MSE** = bias² + variance is what the "
    "policy gradient pays."
)
store = _ui.store()


def show_result(results: dict[str, LabResult], prefix: str, made_by: dict) -> None:
    """The trade-off plots of one or more critics, the per-state view and their CSVs (each led
    by ``made_by``: the run, the policy checkpoint and the settings)."""
    st.subheader(f"GAE({LAMBDA}): the trade-off")
    figure, frame = lab_figures.trade_off_figure({k: r.estimators for k, r in results.items()})
    st.plotly_chart(figure, key=f"{prefix}.gae", config={"displaylogo": False})
    _ui.csv_button(f"Trade-off over {LAMBDA} CSV", frame, "lab_lambda.csv", f"{prefix}.gae_csv",
                   made_by)  # fmt: skip
    bests = ", ".join(f"{k}: {assignment('lambda_', r.best_lambda())}" for k, r in results.items())
    first = next(iter(results.values()))
    tail = ", the rest from the policy's own critic" if first.tail else ""
    st.caption(
        f"Least MSE — {bests}. Bands: {first.settings.confidence * 100:g} % percentile "
        f"bootstrap across the {len(first.states)} "
        f"states. Truth horizon H = {first.horizon} steps ({label('gamma')}^H = "
        f"{first.discount_left:.1e} of the discount left{tail}). {BIAS2_NOTE[0].upper()}"
        f"{BIAS2_NOTE[1:]}."
    )
    for name, result in results.items():
        who = f"{name}: " if len(results) > 1 else ""
        st.markdown(who + result.sentence() + ".")  # our labels and numbers: no user text
    for note in dict.fromkeys(r.horizon_note() for r in results.values()):  # (one truth: one
        if note:  # note, where it matters for any of the critics compared on it)
            st.warning(note, icon=":material/warning:")
    st.subheader("k-step estimators Â^(k)")
    figure, frame = lab_figures.trade_off_figure(
        {k: r.estimators for k, r in results.items()}, kind="k_step"
    )
    st.plotly_chart(figure, key=f"{prefix}.k", config={"displaylogo": False})
    _ui.csv_button("Trade-off over k CSV", frame, "lab_k.csv", f"{prefix}.k_csv", made_by)
    st.subheader("One state: target against the estimates")
    critic = st.selectbox("critic", list(results), key=f"{prefix}.state_critic")
    result = results[critic]
    state = _ui.index_slider(st, "state", len(result.states), f"{prefix}.state")
    left, right = st.columns([3, 2])
    with left:
        figure, frame = lab_figures.state_figure(result.per_state, result.states, state)
        st.plotly_chart(figure, key=f"{prefix}.one", config={"displaylogo": False})
        _ui.csv_button("This state's CSV", frame, "lab_state.csv", f"{prefix}.one_csv",
                       {**made_by, "critic": critic})  # fmt: skip
    with right:
        info = result.states.iloc[state]
        st.markdown(
            f"Q̂(s,a) = {info['q_hat']:.4g} ± {info['q_se']:.2g}, V̂(s) = {info['v_hat']:.4g}, "
            f"target = {info['target']:.4g}.  \nV^π(s) − V̂(s) = {info['offset']:.4g}: the "
            "critic's error at s itself. It shifts every estimate alike and does not bias the "
            "policy gradient (a baseline), so it is reported apart, not counted as bias."
        )
        # every critic's rows, named (not only the critic chosen above)
        per_state, states = (
            pd.concat({name: getattr(r, part) for name, r in results.items()}, names=["critic"])
            .reset_index(level=0)
            .reset_index(drop=True)
            for part in ("per_state", "states")
        )
        _ui.csv_button(
            "Per-state table CSV (every critic)",
            per_state,
            "lab_per_state.csv",
            f"{prefix}.ps",
            made_by,
        )
        _ui.csv_button("States CSV (every critic)", states, "lab_states.csv", f"{prefix}.st",
                       made_by)  # fmt: skip


def job_status(job: LabJob, cancel_key: str) -> None:
    """A lab job's progress, ETA and Cancel while it runs; its error or cancellation once it
    ended. A job this session watched running redraws the whole page once when it ends (its
    results appear, the fragment's timer stops); one that had ended before does not (a rerun
    would drop the page's first-run lines, a link's notes among them)."""
    watched = f"{cancel_key}.watched"
    if not job.done:
        st.session_state[watched] = job  # the job itself: an id can be reused
        st.progress(job.fraction, text=f"measuring… {_ui.lab_eta(job)}")
        st.button("Cancel", key=cancel_key, on_click=job.cancel)  # a callback: see train.py's Stop
        return
    job.seen = True  # the sidebar stops offering the way back to it
    if job.error:
        st.error(job.error.splitlines()[0])
        with st.expander("Error details"):
            st.code(job.error)
    elif job.cancelled:
        st.warning("Cancelled: nothing was stored.")
    if st.session_state.get(watched) is job:
        del st.session_state[watched]
        st.rerun()


def shown_job(key: str, mine: str) -> LabJob | None:
    """The lab job under ``key`` as this session shows it: while it measures, and once it has
    ended until some lab page has shown how (the sidebar's way back leads here, from any
    session); after that only in the sessions that started it or showed it before its end
    was seen (``mine``, their Session State key naming the job's key), whose error or
    cancellation message stays until the next Measure."""
    job = _ui.lab_jobs().get(key)
    if job is None:
        return None
    if job.done and job.seen and st.session_state.get(mine) != key:
        return None
    st.session_state[mine] = key  # shown here: its end stays here too
    return job


def stored_measurements(run_id: str, gradient: bool) -> dict[str, list[LabRecord]]:
    """The run's stored measurements of one view, newest first, under the id a link names
    (``?measurement=``): a gradient measurement's own; a per-state Measure's results (one per
    critic, in critic order) under its first one's."""
    records = [r for r in store.lab_records(run_id)
               if (r.summary.get("kind") == "gradient") == gradient]  # fmt: skip
    if gradient:
        return {r.id: [r] for r in records}
    by_batch: dict[object, list[LabRecord]] = {}
    for record in records:
        by_batch.setdefault(record.summary.get("batch", record.id), []).append(record)
    batches = [sorted(batch, key=lambda r: r.critic_step) for batch in by_batch.values()]
    return {batch[0].id: batch for batch in batches}


def choose_stored(
    stored: dict[str, list[LabRecord]], gradient: bool, linked: bool, run_id: str, policy_step: int
) -> None:
    """Set the view's stored-measurement box: to the link's ``?measurement=`` where ``linked``
    (the page arrived at a URL naming this run; not after a switch of view, whose
    measurement the URL still holds), else to the newest, again whenever a newer one is
    stored; the gradient lens's to the newest of the policy checkpoint chosen above, again
    whenever that checkpoint changes too. Otherwise it keeps the user's choice."""
    key = "lab.g_stored" if gradient else "lab.stored"
    kind = "gradient measurements" if gradient else "per-state measurements"
    why = f"it is not one of this run's stored {kind}"
    if not stored:
        st.session_state.pop(key, None)
        if linked:  # a link's measurement of the other view, or of nothing stored: said
            _ui.say_unread("measurement", st.query_params.get_all("measurement"), why, [])
        return
    newest = next(iter(stored))
    if gradient:
        of_policy = [i for i, (r,) in stored.items() if r.policy_step == policy_step]
        newest = (of_policy or [newest])[0]
        follows = (run_id, policy_step, of_policy[0] if of_policy else None)
    else:
        follows = (run_id, newest)
    if st.session_state.get(key) in stored and st.session_state.get(f"{key}_for") == follows:
        return
    st.session_state[f"{key}_for"] = follows
    st.session_state[key] = (
        _ui.from_url("measurement", list(stored), newest, why,
                     lambda i: (gradient_label if gradient else state_label)(*stored[i]))
        if linked else newest
    )  # fmt: skip


def gradient_lens(
    run, policy_step: int, critic_steps: list[int], stored: dict[str, list[LabRecord]]
) -> None:
    """The policy-gradient view: measure (in the background) and show the ``stored``
    measurement chosen (:func:`stored_measurements`)."""
    st.caption(
        f"What {LAMBDA} does to the policy-gradient estimate itself. K independent batches, each "
        f"the size the run trains on, give ĝ = mean ∇log π(a|s)·Â for every {LAMBDA} with the "
        "chosen critic; a reference g* from many whole episodes with Monte-Carlo advantages is "
        f"the truth. Cosine to g*, cosine between batches, bias², variance, MSE and the "
        f"signal-to-noise ratio per {LAMBDA}, with bootstrap intervals over batches."
    )
    envs = int(run.config.get("num_envs", 8))
    default_size = envs * int(run.config.get("rollout_steps", 5))
    knobs = st.columns(4)
    # text boxes (see the per-state knobs below): GradientSettings says what is out of range,
    # and Measure waits
    batches = knobs[0].text_input("batches K", "32", key="lab.g_batches")
    size = knobs[1].text_input(f"batch size (multiple of {envs})", f"{default_size}",
                               key="lab.g_size",
                               help=f"Default: the run's own batch, {default_size:,} samples "
                               "(num_envs × rollout_steps), the gradient one update takes. "
                               f"Larger batches show where {LAMBDA} matters once the "
                               "noise averages out.")  # fmt: skip
    reference = knobs[2].text_input("reference samples", "500000", key="lab.g_reference")
    seed = knobs[3].text_input("seed", "0", key="lab.g_seed")
    size = whole_number(size)
    problems = []
    try:
        settings = GradientSettings(gamma=float(run.config.get("gamma", 0.99)),
                                    batches=whole_number(batches), batch_size=size,
                                    reference=whole_number(reference),
                                    seed=whole_number(seed))  # fmt: skip
    except ValueError as error:
        settings, problems = None, str(error).splitlines()
    if isinstance(size, int) and size >= 1:
        problems.append(batch_problem(size, envs))
    if not critic_steps:
        problems.append("Choose at least one critic checkpoint.")
    problems = [p for p in problems if p]
    for problem in problems:  # every problem of the boxes, one a line
        st.error(markdown_text(problem))  # it quotes what was typed
    if not problems:
        limit = gym.spec(run.config["env_id"]).max_episode_steps
        rounds = (f" (a round of {run.config['env_id']}'s episodes of up to {limit:,} steps is "
                  f"up to {REFERENCE_COPIES * limit:,} samples)" if limit else "")  # fmt: skip
        st.caption(f"{settings.batches} batches of {settings.batch_size:,} samples, and a "
                   f"reference of at least {settings.reference:,}: it plays whole episodes, "
                   f"{REFERENCE_COPIES} at a time, until it has its share, so it often takes "
                   f"more{rounds}. "
                   "For scale, the defaults took 30–45 s on CartPole on a 2-core CPU and a "
                   "few minutes on HalfCheetah (the ETA settles once the first episodes have "
                   "ended).")  # fmt: skip
    if st.button("Measure the gradient", type="primary", disabled=bool(problems),
                 key="lab.g_start"):  # fmt: skip
        st.session_state["lab.g_job"] = f"gradient {run.id}"
        _ui.lab_jobs()[f"gradient {run.id}"] = LabJob(
            store, run.id, measure=measure_gradient_run, policy_step=policy_step,
            critic_steps=critic_steps, settings=settings,
        )  # fmt: skip
    job = shown_job(f"gradient {run.id}", "lab.g_job")

    @st.fragment(run_every=0.5 if job is not None and not job.done else None)
    def progress() -> None:
        if job is not None:
            job_status(job, "lab.g_cancel")

    progress()
    if not stored:
        st.info("No gradient measurement of this run yet.")
        return
    (record,) = stored[st.selectbox("stored gradient measurements (newest first)", list(stored),
                                    format_func=lambda i: gradient_label(*stored[i]),
                                    key="lab.g_stored")]  # fmt: skip
    if record.policy_step != policy_step:
        st.info(f"Shown: a measurement of policy {record.policy_step:,}, not of the policy "
                f"checkpoint chosen above ({policy_step:,}): Measure the gradient to measure "
                "that one.", icon=":material/info:")  # fmt: skip
    result = GradientResult.from_json(store.load_lab_result(record.id))
    for note in (result.reference_note(), result.tail_note()):
        if note:
            st.warning(note, icon=":material/warning:")
    for critic in result.table["critic"].unique():
        st.markdown(markdown_text(gradient_sentence(result.table, critic)) + ".")
    st.subheader(f"Over {LAMBDA}")
    figure, frame = lab_figures.gradient_figure(result.table)
    st.plotly_chart(figure, key="lab.g_lambda", config={"displaylogo": False})
    made_by = {
        "run_id": run.id,
        "policy_step": record.policy_step,
        **dataclasses.asdict(result.settings),  # the batch the measurement used, also
        "batch_size": result.batch["envs"] * result.batch["steps"],
    }  # where it defaulted
    _ui.csv_button(f"Gradient over {LAMBDA} CSV", frame, "gradient_lambda.csv", "lab.g_l_csv",
                   made_by)  # fmt: skip
    st.subheader("Over k (Â^(k))")
    figure, frame = lab_figures.gradient_figure(result.table, kind="k_step")
    st.plotly_chart(figure, key="lab.g_k", config={"displaylogo": False})
    _ui.csv_button("Gradient over k CSV", frame, "gradient_k.csv", "lab.g_k_csv", made_by)
    ref = result.reference
    st.caption(
        f"Reference g*: {ref['samples']:,} samples, norm {ref['norm']:.4g}, standard error "
        f"{ref['standard_error']:.3g} ({DEBIASED_NOTE}). Batches: "
        f"{result.settings.batches} × {result.batch['envs'] * result.batch['steps']:,} "
        f"({result.batch['samples']:,} samples each after the reset rows); bands: "
        f"{result.settings.confidence * 100:g} % percentile bootstrap over batches. "
        f"{result.seconds:.0f} s."
    )


mode = st.radio(
    "measure", ["a run's checkpoints", "the exact chain"], horizontal=True, key="lab.mode"
)

if mode == "the exact chain":
    st.markdown(
        "A 7-state random walk (terminal ends, +1 on the right) where every moment is known by "
        "enumeration: the curves carry no Monte-Carlo error, and the points beside them show what "
        "sampling gives."
    )
    knobs = st.columns(6)
    error = knobs[0].slider("critic error scale", 0.0, 0.5, 0.2, 0.01, key="lab.chain_error")
    p_right = knobs[1].slider("π(right)", 0.05, 0.95, 0.6, 0.05, key="lab.chain_p")
    gamma = knobs[2].slider(
        label("gamma"), 0.5, 0.999, 0.95, 0.001, format="%.3f", key="lab.chain_gamma"
    )
    segment = knobs[3].slider("segment L", 1, 12, 8, key="lab.chain_segment")
    seed = knobs[4].number_input("critic seed", 0, 10_000, 0, key="lab.chain_seed")
    samples = knobs[5].select_slider("Monte-Carlo samples", CHAIN_SAMPLES, 2_000,
                                     key="lab.chain_samples")  # fmt: skip
    spec = chain.ChainSpec()
    policy = chain.policy_matrix(spec, p_right)
    v_pi, _ = chain.exact_values(spec, policy, gamma)
    critic = chain.critic_with_error(v_pi, error, seed=int(seed))
    grid = np.round(np.linspace(0, 1, 101), 2)
    moments = chain.exact_estimator_moments(
        spec, policy, critic, gamma, spec.start, 1, segment, grid, np.array([1])
    )
    sampled = chain.sampled_gae_moments(spec, policy, critic, gamma, spec.start, 1, segment,
                                        grid[::10], samples, seed=int(seed))  # fmt: skip
    figure, frame = lab_figures.exact_figure(grid, moments.gae, sampled)
    st.plotly_chart(figure, key="lab.exact", config={"displaylogo": False})
    st.markdown(trade_off_sentence(grid, frame["bias2"], frame["variance"]) + ".")
    chain_made_by = {"chain_states": spec.n_states, "critic_error_scale": error,
                     "critic_seed": seed, "p_right": p_right, "gamma": gamma,
                     "segment": segment, "monte_carlo_samples": samples,
                     "monte_carlo_seed": seed}  # fmt: skip
    _ui.csv_button("Exact trade-off CSV", frame, "chain_exact.csv", "lab.exact_csv",
                   chain_made_by)  # fmt: skip
    st.caption(
        f"From the middle state, moving right. Target Q^π − V̂ = {moments.target:.4f}; "
        f"V^π − V̂ there = {moments.state_offset:.4f}. Raise the critic error: bias at small "
        f"{LAMBDA} grows and the best {LAMBDA} moves right; shorten the segment: "
        f"{assignment('lambda_', 1)} keeps the bias of the bootstrap at L. Points: the same "
        f"moments estimated from {samples:,} continuations sampled by stepping the chain "
        "(seeded by the critic seed), MSE with ± 2 of the samples' standard errors; a "
        "continuation too rare to be drawn is in neither the points nor their bars, so with "
        "few samples the points can miss the curve by more than the bars show."
    )
    st.stop()

runs = [r for r in store.list_runs() if not r.damaged and store.checkpoint_steps(r.id)]
if not runs:
    st.info("No run has a checkpoint yet: train one first (checkpoints are what the lab replays).")
    st.stop()
labels = {r.id: run_label(r) for r in runs}
ids = list(labels)
arrived = _ui.arrive("lab", ("lab.run", "lab.policy", "lab.critics", "lab.view", "lab.g_stored",
                             "lab.stored"))  # fmt: skip
run_id = st.selectbox(
    "run", ids, index=ids.index(_ui.from_url("run", ids, ids[0])), format_func=labels.get,
    key="lab.run",
)  # fmt: skip
_ui.say_if_linked_missing(ids, labels[run_id], "has no readable checkpoint to replay")
run = store.get_run(run_id)
try:
    check_run_env(run)  # an env of the user's own: names the module the server must import
    state_access(run.config["env_id"])
except UnsupportedEnvError as error:
    st.error(f"{error}.")  # it names the families the lab supports
    st.stop()
if run.config.get("use_sde"):
    st.info(GSDE_NOTE, icon=":material/info:")
steps = store.checkpoint_steps(run_id)
url_run = _ui.from_url("run", [run_id], None) == run_id
url_steps = steps if url_run else []  # the URL's checkpoints are the URL's run's
unheld = _ui.not_a_checkpoint(steps) if url_run else None
if st.session_state.get("lab.policy") not in steps:
    st.session_state["lab.policy"] = _ui.from_url("policy", url_steps, steps[-1], unheld)
if "lab.critics" not in st.session_state or not set(st.session_state["lab.critics"]) <= set(steps):
    fallback = list(dict.fromkeys([steps[0], steps[-1]]))
    st.session_state["lab.critics"] = _ui.all_from_url("critic", url_steps, fallback, unheld)
pick = st.columns([2, 3])
policy_step = pick[0].selectbox(
    "policy checkpoint (env step)", steps, format_func="{:,}".format, key="lab.policy"
)
critic_steps = pick[1].multiselect(
    "critic checkpoints (an early one next to a late one is the interesting contrast)",
    steps,
    key="lab.critics",
    format_func=lambda s: f"{s:,}",
)
views_ = ["per state", "policy gradient"]
view = st.segmented_control(
    "view", views_, key="lab.view",
    default=_ui.from_url("view", views_, "per state", _ui.options_are("the views", views_)),
    help="Per state: bias², variance and MSE of each advantage against Monte-Carlo truth. "
    "Policy gradient: the same estimators' batch gradients against a reference gradient.",
) or "per state"  # fmt: skip
# the view's stored measurement is chosen here, so the link gets it in the same one update
gradient = view == "policy gradient"
stored = stored_measurements(run_id, gradient)
choose_stored(stored, gradient, arrived and url_run, run_id, policy_step)
shown = st.session_state.get("lab.g_stored" if gradient else "lab.stored")
_ui.to_url(run=run_id, policy=policy_step, critic=critic_steps, view=view,
           measurement=[] if shown is None else shown)  # fmt: skip
if gradient:
    gradient_lens(run, policy_step, critic_steps, stored)
    st.stop()
# no min/max on the boxes, and whole numbers as text: the browser would refuse an
# out-of-range value (or one past 2^53) with a small red mark and keep the last one; here it
# reaches LabSettings, whose message names the field and its range below the boxes, and
# Measure stays disabled
knobs = st.columns(6)
gamma = knobs[0].number_input(label("gamma"), value=float(run.config.get("gamma", 0.99)),
                              format="%.4g", key="lab.gamma")  # fmt: skip
states = knobs[1].text_input("states N", "64", key="lab.states")
rollouts = knobs[2].text_input("truth rollouts M", "32", key="lab.rollouts")
continuations = knobs[3].text_input("continuations K", "32", key="lab.k")
segment = knobs[4].text_input("segment L", "500", key="lab.segment")
seed = knobs[5].text_input("seed", "0", key="lab.seed")
try:
    settings = LabSettings(gamma=float(gamma), states=whole_number(states),
                           rollouts=whole_number(rollouts),
                           continuations=whole_number(continuations),
                           segment=whole_number(segment),
                           seed=whole_number(seed))  # fmt: skip
    problem = None if critic_steps else "Choose at least one critic checkpoint."
    # the lab's own refusal (LabTooLarge), before anything starts
    memory = check_memory(run.config["env_id"], settings, critics=max(1, len(critic_steps)))
except ValueError as error:
    settings, problem = None, str(error)
if problem:
    for line in problem.splitlines():  # every problem of the boxes, one a line
        st.error(markdown_text(line))  # it quotes what was typed
else:
    st.caption(
        f"At most {settings.env_steps():,} env steps and about {memory.bytes / 2**20:,.0f} MiB "
        f"of memory (truth horizon H = "
        f"{settings.truth_horizon:,}, {label('gamma')}^H = "
        f"{settings.gamma**settings.truth_horizon:.1e}); "
        "the defaults take about 10 s on CartPole."
    )
if st.button("Measure", type="primary", disabled=bool(problem), key="lab.start"):
    job = LabJob(store, run_id, policy_step=policy_step, critic_steps=critic_steps,
                 settings=settings)  # fmt: skip
    _ui.lab_jobs()[run_id] = job
    st.session_state["lab.job"] = run_id

job = shown_job(run_id, "lab.job")  # this run's job (its end: where shown_job says)


@st.fragment(run_every=0.5 if job is not None and not job.done else None)
def progress() -> None:
    if job is not None:
        job_status(job, "lab.cancel")


progress()

if not stored:
    st.info("No measurement of this run yet: choose checkpoints and press Measure.")
    st.stop()
batch = stored[
    st.selectbox(
        "stored measurements (newest first)",
        list(stored),
        format_func=lambda i: state_label(*stored[i]),
        key="lab.stored",
    )
]
results = {
    critic_name(r.critic_step): LabResult.from_json(store.load_lab_result(r.id)) for r in batch
}
st.markdown(f"**{markdown_text(run.name)}**, policy checkpoint {batch[0].policy_step:,}")
first = next(iter(results.values()))
# the truth horizon H the measurement used (the settings hold None where H was derived from γ)
made_by = {"run_id": run_id, "policy_step": batch[0].policy_step,
           **dataclasses.asdict(first.settings), "horizon": first.horizon}  # fmt: skip
show_result(results, "lab.result", made_by)
