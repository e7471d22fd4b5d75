"""Streamlit glue shared by the pages: the process-wide run manager, the config form, CSV
buttons. No estimator math and no training logic here: that is gae_core's."""

from __future__ import annotations

import html
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from gae_core import metrics as M
from gae_core.agent.config import FIELD_SPECS, FieldSpec, TrainConfig, field_problems
from gae_core.agent.field_spec import echo
from gae_core.agent.presets import TUNED_FIELDS, preset_of, preset_values
from gae_core.env_modules import registered_env_ids
from gae_core.errors import ConfigError, StoreError, UnknownId
from gae_core.inert import markdown_text, to_csv
from gae_core.insight import exports, views
from gae_core.labels import algorithm_name, run_label
from gae_core.runs.manager import RunManager
from gae_core.storage.store import ID_LENGTH, SHORT_ID, RunStore

NAVIGATION_FLAG = "gae.navigation"
WANTED_PAGE = "gae.wanted_page"


def require_navigation(page_file: str) -> None:
    """Run a page only under dashboard.py's navigation.

    ``pages/`` is also Streamlit's legacy multipage folder: on a fresh server, a direct link
    (``/runs``) runs ``pages/runs.py`` alone, before ``dashboard.py`` has called ``st.navigation``
    once, so the page would lack the app's sidebar and layout. Hand over to ``dashboard.py``, which
    sets the flag and switches back to the page asked for, with the link's query parameters (the
    selection it names, :func:`from_url`).
    """
    if not st.session_state.get(NAVIGATION_FLAG):
        params = {name: st.query_params.get_all(name) for name in st.query_params}
        st.session_state[WANTED_PAGE] = (page_file, params)
        st.switch_page("dashboard.py", query_params=params)


# -- the selection in the URL -----------------------------------------------------------------
# Each page keeps what it shows (run, checkpoints, critic, trajectory, λ, sweep, view) in the
# URL's query parameters, under the short names below, so a reload, the browser's back button or
# a link pasted into another tab opens the same view; cross-page buttons pass theirs on. What a
# page last wrote is also the session's context, so a page reached from the sidebar opens on the
# run the user was looking at elsewhere, not on the newest one.
_CONTEXT = "gae.context"
_PAGE = "gae.page"
_WRITTEN = "gae.written"  # what the page shown last wrote into the URL
#: The names that belong to one run: a context that changes run forgets them.
_PER_RUN = ("policy", "critic", "trajectory", "gamma", "seed", "lambda", "measurement")


def arrive(page: str, keys: Sequence[str]) -> bool:
    """Call first on a page whose widgets ``keys`` follow the URL: on the first run of the page
    since another page, or when the URL no longer holds what the page last wrote (the Back
    button, a link to the same page), forget their values, so the widgets open on the URL's
    selection (or the session's context); other runs keep what the user chose. Whether it
    forgot them: a choice the page makes itself reads the link only then."""
    written = st.session_state.get(_WRITTEN, {})
    moved = any(st.query_params.get_all(name) != texts for name, texts in written.items())
    arrived = st.session_state.get(_PAGE) != page or moved
    if arrived:
        for key in keys:
            st.session_state.pop(key, None)
    st.session_state[_PAGE] = page
    st.session_state[_WRITTEN] = {}
    return arrived


def _id_start(text: str) -> bool:
    """Whether a link's id text is the start of an id rather than a whole one."""
    return SHORT_ID <= len(text) < ID_LENGTH


def _resolver(what: str) -> Callable[[str], str]:
    """The store's lookup of a ``run`` or ``sweep`` id from its start."""
    return store().resolve_run_id if what == "run" else store().resolve_sweep_id


def expand_short_ids() -> None:
    """A link's ``?run=`` or ``?sweep=`` given as the start of an id (its first ``SHORT_ID`` or
    more characters, as the CLI and the exports take it) becomes the id it names before a page
    reads it; a start that names none or several is left for the page to say so."""
    for name in ("run", "sweep"):
        texts = st.query_params.get_all(name)
        if not any(_id_start(text) for text in texts):
            continue  # (full ids, or none: no store query; a start is looked up each rerun)
        full = []
        for text in texts:
            try:
                full.append(_resolver(name)(text) if _id_start(text) else text)
            except UnknownId:
                full.append(text)
        if full != texts:
            st.query_params[name] = full


def _wanted(name: str) -> list[str]:
    if name in st.query_params:
        return st.query_params.get_all(name)
    held = st.session_state.get(_CONTEXT, {}).get(name)
    return [] if held is None else held


def from_url(
    name: str,
    options: Sequence[_T],
    fallback: _T,
    why: str | None = None,
    shown_as: Callable[[Any], str] | None = None,
) -> _T:
    """The option the URL's ``?name=`` names (compared as text; without one, the session's
    context), else ``fallback``: the default to give a widget. With ``why`` (what the page
    allows, in words), a link naming something else says so (:func:`say_unread`), showing
    the fallback as ``shown_as`` writes it (the widget's ``format_func``)."""
    wanted = _wanted(name)[:1]
    chosen = next((option for option in options if [str(option)] == wanted), None)
    if chosen is None and why is not None:
        say_unread(name, wanted, why, fallback, shown_as)
    return fallback if chosen is None else chosen


def say_unread(
    name: str,
    unread: Sequence[str],
    why: str,
    shown: Any,
    shown_as: Callable[[Any], str] | None = None,
    empty: str = "none",
) -> None:
    """The info line of a link whose ``?name=`` holds values the page cannot show (``why``:
    what it allows), rather than replacing them silently, and what is shown instead (``empty``
    for an empty selection); only the URL counts, not the session's context (a value another
    run's page left there)."""
    linked = st.query_params.get_all(name)
    unread = [text for text in unread if text in linked]
    if unread:
        quoted = ", ".join(echo(text) for text in unread[:5]) + (", …" if len(unread) > 5 else "")
        write = shown_as or _shown
        shown = ", ".join(map(write, shown)) if isinstance(shown, list) else write(shown)
        say_cannot_open(f"{name} {quoted}", why, shown or empty)


def _shown(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def options_are(what: str, options: Sequence[Any]) -> str:
    """Why a link's value is not one of a page's ``options``: "the views are per state, …"."""
    return f"{what} are {', '.join(map(str, options))}"


def not_a_checkpoint(steps: Sequence[int]) -> str:
    """Why a link's checkpoint (``?policy=``, ``?critic=``) is not one the run has."""
    return f"it is not one of this run's checkpoints ({steps[0]:,} to {steps[-1]:,} env steps)"


def not_held(what: str, ids: Sequence[str] = ()) -> str:
    """Why a link's run or sweep ids cannot be opened when the store has none of them
    (without ``ids``: "no such run", after a line that quotes them); where one is the start
    of several ids, that it is, naming them (:func:`expand_short_ids` leaves it as it was)."""
    for text in filter(_id_start, ids):
        try:
            _resolver(what)(text)
        except UnknownId as error:
            if error.candidates:
                return str(error)
    quoted = ", ".join(echo(i) for i in ids[:5]) + (", …" if len(ids) > 5 else "")
    plural = "s" if len(ids) > 1 else ""
    named = f"{what}{plural} {quoted}" if ids else f"such {what}"
    return f"this data folder holds no {named} (deleted, or a link from another folder)"


def text_from_url(name: str, fallback: str) -> str:
    """The URL's ``?name=`` as text (without one, the session's context), else ``fallback``:
    a text box's default, checked where the box's own text is (the explorer's fresh seed)."""
    return (_wanted(name)[:1] or [fallback])[0]


def number_from_url(name: str, fallback: float, low: float, high: float) -> float:
    """The number the URL's ``?name=`` (without one, the session's context) gives, where it
    reads as a finite number in ``[low, high]``, else ``fallback`` (and a link's value out of
    it says so): a widget's default for a value with no list of options (the explorer's γ)."""
    wanted = _wanted(name)[:1]
    try:
        value = float(wanted[0]) if wanted else fallback
    except ValueError:
        value = math.nan
    if low <= value <= high:  # (NaN is in no range)
        return value
    say_unread(name, wanted, f"it must be a number in [{low:g}, {high:g}]", fallback)
    return fallback


def all_from_url(
    name: str,
    options: Sequence[_T],
    fallback: list[_T],
    why: str | None = None,
    empty: str = "none",
) -> list[_T]:
    """:func:`from_url` of a multiselect: every option the URL's repeated ``?name=`` names, in
    the URL's order, else ``fallback``; with ``why``, a link's values that are not options are
    named (:func:`say_unread`; ``empty``: what an empty selection shows)."""
    by_text = {str(option): option for option in options}
    wanted = _wanted(name)
    chosen = list(dict.fromkeys(by_text[text] for text in wanted if text in by_text)) or fallback
    if why is not None:
        unread = [text for text in wanted if text not in by_text]
        say_unread(name, unread, why, chosen, empty=empty)
    return chosen


def say_if_linked_missing(ids: Sequence[str], shown: str, lacking: str, what: str = "run") -> None:
    """An info line where the URL's ``?run=`` (``what="sweep"``: ``?sweep=``) names a run or
    sweep that is not among ``ids`` (those this page can open): the page opens on ``shown``
    instead, and says why rather than switching silently. Either this data folder holds no
    such run or sweep (deleted, or a link from another folder), or it does and ``lacking`` says
    what the page needs that it lacks. Only the URL counts: the session's context names a
    deleted run after the Runs page's Delete, and that is no link to explain."""
    named = st.query_params.get_all(what)[:1]
    if not named or named[0] in ids:
        return
    try:
        record = (store().get_run if what == "run" else store().get_sweep)(named[0])
    except StoreError:
        why = not_held(what, named)
    else:  # typed or pasted: quoted, cut short if long
        damaged = getattr(record, "damaged", None)  # (pages leave damaged runs out)
        why = f"{what} {echo(named[0])} " + (f"is damaged: {damaged}" if damaged else lacking)
    # the link's checkpoints, λ, γ … were the run it names: not read for another, and said so
    held = [name for name in _PER_RUN if name in st.query_params] if what == "run" else []
    if held:
        listed = ", ".join(held[:-1]) + (" and " if len(held) > 1 else "") + held[-1]
        shown = f"{shown}, at its own {listed} (the link's were the run it names)"
    say_cannot_open(f"a {what}", why, shown)


def say_cannot_open(named: str, why: str, shown: str | None = None) -> None:
    """The info line of a link naming what a page cannot open (``named``: "a run", "runs"),
    why, and what the page shows instead."""
    instead = f" Showing {shown}." if shown else ""
    st.info(markdown_text(f"The link names {named} this page cannot open: {why}.{instead}"),
            icon=":material/link_off:")  # fmt: skip


def _texts(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]


def to_url(**selection: Any) -> None:
    """Write the page's selection into the URL (``run=…&policy=…``; a list as repeated keys,
    an empty list as none: nothing chosen) and the session's context; a parameter that
    already holds the value is left alone.

    Every change of one call goes in one update: the browser adds a history entry for each
    URL Streamlit sends, and Back should step over a page's selection, not through each of
    its parameters. A page writes its whole selection in one call for the same reason."""
    context = st.session_state.setdefault(_CONTEXT, {})
    written = st.session_state.setdefault(_WRITTEN, {})
    if "run" in selection and context.get("run") != _texts(selection["run"]):
        for name in _PER_RUN:  # another run's checkpoints and trajectory mean nothing here
            context.pop(name, None)
    changes: dict[str, Any] = {}
    for name, value in selection.items():
        texts = _texts(value)
        context[name] = written[name] = texts
        if st.query_params.get_all(name) != texts:
            changes[name] = texts if isinstance(value, list | tuple) else texts[0]
    if changes:
        st.query_params.update(changes)


@st.cache_resource
def _manager() -> RunManager:
    """One RunManager per server process, shared by every session.

    Each run is a sweep of one on the local pool: it trains in a worker process (a warm spare
    waits for the next Start), so training never holds this server's interpreter lock: with
    runs training in threads, a click on a chart control took up to 1.6 s to redraw. A 1 ms GIL
    switch interval (default 5 ms) helps the coordinators' threads share the server with the
    page scripts.
    """
    sys.setswitchinterval(0.001)
    manager = RunManager(RunStore(), processes=True)
    manager.warm_up()
    return manager


def manager() -> RunManager:
    """The process-wide run manager; a store that cannot be opened (damaged file, data folder
    that is a file or read-only) stops the page with one message naming the path."""
    try:
        return _manager()
    except StoreError as error:
        st.error(f"The run store cannot be used: {error}", icon=":material/error:")
        st.caption("Set GAE_CORE_DATA to another folder, or move the file away, and reload.")
        st.stop()
        raise  # st.stop() raises; this keeps type checkers informed


def store() -> RunStore:
    return manager().store


#: Clicks of Start or Launch this close together (seconds) are one click burst.
REPEAT_WINDOW_S = 3.0
_STARTS = "gae.starts"
_starts_lock = threading.Lock()  # held only to read and mark a record, never across a start
_clock = time.monotonic  # read at each call: the tests move it on instead of sleeping
#: How long a repeat click's rerun waits for the first click's start, running in another
#: script thread, to return (a sweep's start creates its rows and threads: well under a second).
_WAIT_FOR_FIRST_S = 30.0
_T = TypeVar("_T")


def start_once(action: str, identity: Any, start: Callable[[], _T], what: str) -> _T | None:
    """Call ``start()`` once per click burst of the button ``action`` and return what it
    started; for a repeat, say so ("Already starting …") and return what the burst's first
    click started, so the page can show it whichever of the burst's reruns draws it (``None``
    for a repeat made inside that start, or if it has not returned within
    :data:`_WAIT_FOR_FIRST_S`); a repeat re-raises the error of a first start that failed
    while it waited, whose own run Streamlit has stopped.

    A repeat is a click with the same ``identity`` (what ``start`` would start, as JSON-able
    data) while the previous start of ``action`` has not returned, or within
    :data:`REPEAT_WINDOW_S` of its return or of the last repeat. A double click reaches the
    page as two reruns with the button True once each; the second either follows a first run
    that has returned, or (Streamlit's fast reruns) begins in a new script thread while the
    first is still inside ``start()``: that second run waits for the first's start to return
    (at most :data:`_WAIT_FOR_FIRST_S`), because the first run is stopped at its next element
    and never draws what it started. A click after a quiet window, or with other settings,
    starts again: identical runs on purpose stay possible. The record lives in the browser
    session's state; a ``start`` that raises leaves none behind, so the next click retries at
    once.
    """
    key = json.dumps(identity, sort_keys=True, default=str)
    # One dict per session, changed in place: a write to session state from a script thread
    # that another thread's rerun is compacting can be lost, a change inside this dict cannot.
    records = st.session_state.setdefault(_STARTS, {})
    with _starts_lock:
        now = _clock()
        before = records.get(action)
        repeat = (
            before is not None
            and before["identity"] == key
            and (before["in_flight"] or now - before["at"] < REPEAT_WINDOW_S)
        )
        if repeat and not before["in_flight"]:
            before["at"] = now  # the burst goes on while the clicks keep coming
        elif not repeat:
            mine = records[action] = {
                "identity": key, "in_flight": True, "at": now, "result": None,
                "thread": threading.get_ident(), "returned": threading.Event(),
            }  # fmt: skip
    if repeat:
        st.info(
            f"Already starting {what}: a click within {REPEAT_WINDOW_S:g} s of the last one "
            f"does nothing. To start another identical one, wait {REPEAT_WINDOW_S:g} s and "
            "click again.",
            icon=":material/hourglass_top:",
        )
        if before.get("thread") != threading.get_ident():
            before["returned"].wait(_WAIT_FOR_FIRST_S)
        if isinstance(before.get("error"), Exception):
            raise before["error"]
        return before.get("result")
    try:
        result = start()
    except BaseException as error:
        with _starts_lock:
            mine["error"] = error
            if records.get(action) is mine:
                if before is None:
                    del records[action]
                else:
                    records[action] = before
        mine["returned"].set()
        raise
    with _starts_lock:
        mine["in_flight"], mine["at"], mine["result"] = False, _clock(), result
    mine["returned"].set()
    return result


def csv_button(
    label: str, frame: pd.DataFrame, file_name: str, key: str, made_by: dict | None = None
) -> None:
    """A download button whose CSV is generated on click (exactly the frame that is plotted,
    led by the columns of ``made_by``: the run, checkpoints and settings that made it,
    :func:`~gae_core.insight.exports.with_provenance`), saved as ``file_name`` led by the run
    or sweep it is of (:func:`~gae_core.insight.exports.download_name`).

    It takes the frame itself, not a callable: a page that passed ``lambda: frame`` and then
    drew another chart into ``frame`` handed out the last chart's data from every button
    (Python's late binding; three lab buttons gave one file).

    Streamlit revokes such a button's download when the fragment that drew it redraws, so a
    button inside a fragment that redraws on a timer can miss a click (see the Runs page)."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"csv_button({label!r}) takes the DataFrame, got {type(frame).__name__}")
    file_name = exports.download_name(file_name, made_by)  # led by the run or sweep
    frame = exports.with_provenance(frame, **(made_by or {}))
    download_button(label, lambda: to_csv(frame), file_name, "text/csv", key)


def download_button(label: str, data: Callable[[], str], file_name: str, mime: str, key: str):
    """A download button whose file is generated on click (:func:`csv_button`'s caveat)."""
    st.download_button(
        label, data=data, file_name=file_name, mime=mime, key=key, on_click="ignore",
        icon=":material/download:",
    )  # fmt: skip


def csv_link(label: str, url: str, key: str) -> None:
    """A link that downloads a CSV of the run store from the server's export route
    (:mod:`gae_core.insight.exports`), read from the store when clicked.

    Every CSV of what the store holds goes this way, live or not: a link cannot be revoked by a
    redraw, where a download button on a page that redraws every second lost 1 click in 30."""
    with st.container(key=key):
        st.markdown(
            f':material/download: <a href="{html.escape(url)}" download>{html.escape(label)}</a>',
            unsafe_allow_html=True,
        )


def _widget_value(spec: FieldSpec, value: Any) -> Any:
    """A config value as its widget holds it (an int as its digits, a list of ints as
    "64, 64": both are text boxes)."""
    if spec.kind == "int":
        return str(value)
    if spec.kind == "int_list":
        return ", ".join(str(v) for v in value)
    if spec.kind == "float":
        return float(value)
    return value


def _idle_now(prefix: str) -> dict[str, str]:
    """The fields that change nothing given the form's choices and switches as they stand
    (:meth:`TrainConfig.idle_fields`, fields by the form's names), each greyed only while its
    own value reads, and read last run (a greyed box the user cannot fix would keep Start
    disabled). Every field that decides it is a choice or a switch, always a valid value, so a
    number being typed cannot hide it; the device never idles one (and may be absent here)."""
    chosen = {
        name: st.session_state[f"{prefix}.{name}"]
        for name, spec in FIELD_SPECS.items()
        if spec.kind in ("choice", "bool")
        and name != "device"
        and f"{prefix}.{name}" in st.session_state
    }
    try:
        idle = TrainConfig(**chosen).idle_fields(views.form_name)
    except (ConfigError, TypeError):  # an env this server cannot build: the form says so
        return {}
    # A field read wrong last run stays editable this run too: Streamlit drops the value a
    # disabled widget receives, so the fix typed into it would be lost as it greyed.
    unread_key = f"{prefix}.idle_unread"
    before = st.session_state.get(unread_key, set())
    unread = {name for name in idle if not _reads(name, prefix)}
    st.session_state[unread_key] = unread
    return {name: why for name, why in idle.items() if name not in unread | before}


def _reads(name: str, prefix: str) -> bool:
    """Whether field ``name``'s widget holds a value its field takes (as the form's validation
    reads it); a field not drawn yet takes its default."""
    value = st.session_state.get(f"{prefix}.{name}", FIELD_SPECS[name].default)
    value, unread = views.read_field(name, value)
    return unread is None and not field_problems({name: value})


def _widget(
    spec: FieldSpec,
    key: str,
    on_change: Callable[[], None] | None = None,
    idle: str | None = None,
) -> Any:
    """One field's widget; its value lives in session state (set by :func:`config_form`).

    Every value reaches the form's validation (:func:`~gae_core.insight.views.build_config`),
    which names the field and its range and keeps Start disabled: an int field is a text box
    read on the server ("1,000", "1_000", " 42 "), because a number box's browser side refuses
    a number past 2^53 (a 20-digit seed) with a red mark alone and never sends it; float
    number boxes carry no min/max, which the browser would enforce the same silent way.
    """
    # what the user typed outlives the page; a field with no effect now is greyed, with why
    kept = {"key": key, "persist_state": "session", "disabled": idle is not None}
    why = f" No effect now: {idle}." if idle else ""
    if spec.kind == "choice":
        shown = algorithm_name if spec.name == "algo" else str  # "ppo" reads as PPO
        choices = env_choices() if spec.name == "env_id" else list(spec.choices or ())
        return st.selectbox(spec.label, choices, help=spec.help + why, on_change=on_change,
                            format_func=shown, **kept)  # fmt: skip
    if spec.kind == "bool":
        return st.checkbox(spec.label, help=spec.help + why, **kept)
    if spec.kind == "int":
        return st.text_input(
            spec.label, help=f"{spec.help} (an integer, {spec.min:,} to {spec.max:,}){why}", **kept
        )
    if spec.kind == "float":
        return st.number_input(
            spec.label,
            # no default of its own: with value="min" (0 here) the browser draws the box at 0
            # and shows the state's value a moment later, longer on a busy page. A cleared box
            # reads None, which the form refuses, naming the field.
            value=None,
            format="%.6g",
            help=f"{spec.help} (range {spec.min:g} to {spec.max:g}){why}",
            **kept,
        )
    return st.text_input(
        spec.label,
        help=f"{spec.help}; comma-separated, each in [{spec.min}, {spec.max}]{why}",
        **kept,
    )


def config_form(
    prefix: str, *, exclude: tuple[str, ...] = (), hidden: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Widgets for every TrainConfig field but ``exclude``'s (main ones first, the rest under
    "Advanced"), starting from the preset of the chosen env and algorithm; choosing another
    env or algorithm loads its preset into the fields presets tune
    (:data:`~gae_core.agent.presets.TUNED_FIELDS`), says so, and keeps the others (the seed, …)
    as the user set them. Why the preset is what it is sits under it. ``hidden`` fields are
    not drawn for now (another box sets them) but still follow the presets, so they come back
    right."""
    env_key, algo_key = f"{prefix}.env_id", f"{prefix}.algo"
    env_id = st.session_state.get(env_key, FIELD_SPECS["env_id"].default)
    algo = st.session_state.get(algo_key, FIELD_SPECS["algo"].default)
    for name, value in preset_values(env_id, algo).items():
        key = f"{prefix}.{name}"
        if name not in exclude and key not in st.session_state:
            st.session_state[key] = _widget_value(FIELD_SPECS[name], value)

    shown_key = f"{prefix}.shown"  # the tuned fields' values as the last run drew them

    def load_preset() -> None:
        chosen = st.session_state[env_key]
        algo = st.session_state.get(algo_key, FIELD_SPECS["algo"].default)
        shown = st.session_state.get(shown_key, {})
        changed, kept = [], []  # the fields the preset changes, and those typed meanwhile
        for name, value in preset_values(chosen, algo).items():
            if name not in exclude and name in TUNED_FIELDS:
                key, new = f"{prefix}.{name}", _widget_value(FIELD_SPECS[name], value)
                now = st.session_state.get(key, shown.get(name))
                if name not in ("env_id", "algo") and name in shown and now != shown[name]:
                    # typed right after the env was chosen: Streamlit ran both in one rerun,
                    # this callback after the typed value arrived, which must win
                    kept.append(FIELD_SPECS[name].label)
                    continue
                if key in st.session_state and st.session_state[key] != new:
                    changed.append(FIELD_SPECS[name].label)
                st.session_state[key] = new
        where = "its preset" if preset_of(chosen, algo) else "the field defaults (it has no preset)"
        more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
        said = ", ".join(changed[:6]) + more
        typed = f"; kept as you typed: {', '.join(kept)}" if kept else ""
        # what matters first: a long toast is cut behind "view more"
        detail = f" (new values: {said}{typed})" if changed or kept else ""
        st.toast(f"{chosen}, {algorithm_name(algo)}: the tuned settings are {where}, the "
                 f"others as you left them{detail}.")  # fmt: skip

    values: dict[str, Any] = {}
    main, advanced = views.form_specs((*exclude, *hidden))
    idle = _idle_now(prefix)
    for spec in main:
        key = f"{prefix}.{spec.name}"
        loads = spec.name in ("env_id", "algo")
        values[spec.name] = _widget(spec, key, load_preset if loads else None, idle.get(spec.name))
    # "Advanced" opens as it was left: the expander's own state goes when another page is
    # shown (a widget's does), a plain session key outlives it
    opened, seen = f"{prefix}.advanced", f"{prefix}.advanced_was_open"

    def keep_open() -> None:
        st.session_state[seen] = st.session_state[opened]

    shut = not st.session_state.get(seen, False)
    with st.expander("Advanced", expanded=not shut, key=opened, on_change=keep_open):
        for spec in advanced:
            values[spec.name] = _widget(spec, f"{prefix}.{spec.name}", idle=idle.get(spec.name))
    st.session_state[shown_key] = {
        name: st.session_state[f"{prefix}.{name}"]
        for name in TUNED_FIELDS
        if f"{prefix}.{name}" in st.session_state
    }
    chosen_algo = values.get("algo", FIELD_SPECS["algo"].default)
    preset = preset_of(values.get("env_id"), chosen_algo)
    if preset is not None:
        name = algorithm_name(chosen_algo)
        with st.expander(f"Why {values['env_id']}'s {name} preset is what it is"):
            st.markdown(markdown_text(preset.why))
    return values


def offer_spacing(prefix: str, config: Any) -> None:
    """Under a short budget's warnings, a button that spreads checkpoints and evaluations over
    it (:func:`~gae_core.insight.views.spacing`): a run with one checkpoint gives the explorer
    and the lab nothing to compare."""
    spaced = views.spacing(config) if config is not None else {}
    if not spaced:
        return
    words = {"checkpoint_every": "checkpoint", "eval_every": "evaluate"}
    what = " and ".join(f"{words[name]} every {steps:,}" for name, steps in spaced.items())
    st.button(f"Fit them to this budget: {what} env steps", key=f"{prefix}.spacing",
              on_click=_set_fields, args=(prefix, spaced))  # fmt: skip


def _set_fields(prefix: str, values: dict[str, Any]) -> None:
    for name, value in values.items():
        st.session_state[f"{prefix}.{name}"] = _widget_value(FIELD_SPECS[name], value)


def env_choices() -> list[str]:
    """The form's env ids: the built-in ones, then those the server's modules register."""
    built_in = list(FIELD_SPECS["env_id"].choices or ())
    return built_in + [i for i in registered_env_ids() if i not in built_in]


def reuse_settings_problem(run: Any) -> str | None:
    """Why ``run``'s settings cannot fill the form here (a damaged config, a value today's
    fields refuse, an env this server's modules do not register: what
    :meth:`TrainConfig.from_stored` refuses), as markdown, or None."""
    try:
        if run.damaged:
            raise ConfigError(run.damaged)
        TrainConfig.from_stored(run.config)
    except ConfigError as error:
        return markdown_text(f"Its settings cannot be used here: {error}")
    return None


def reuse_settings(prefix: str, run: Any) -> None:
    """Fill form ``prefix`` with ``run``'s stored config (:meth:`TrainConfig.from_stored`), to
    change a field or two and start again (the CLI's ``train --like``); a toast says so."""
    _set_fields(prefix, TrainConfig.from_stored(run.config).to_dict())
    st.toast(f"The form now holds the settings of {markdown_text(run_label(run))}: change what "
             "you like and press Start.")  # fmt: skip


def show_problems(errors: list[str], warnings: list[str]) -> None:
    """A form's errors and warnings; an error quotes what was typed (``got '[x](…)'``), shown
    as typed, not as markdown."""
    for error in errors:
        st.error(markdown_text(error), icon=":material/error:")
    for warning in warnings:
        st.warning(warning, icon=":material/warning:")


STATUS_ICONS = {
    "queued": ":material/schedule:",
    "running": ":material/play_circle:",
    "stopped": ":material/stop_circle:",
    "finished": ":material/check_circle:",
    "failed": ":material/error:",
    "interrupted": ":material/report:",
}


#: How often live charts redraw while a run trains (seconds). Slower than the status line: a
#: redraw of every chart costs far more than the progress bar, and under load a timer shorter
#: than a redraw would keep the charts permanently rerunning.
LIVE_CHARTS_EVERY_S = 1.5
#: How often a live run's charts look for their first points (a run just started), so the
#: first return is on the page soon after Start, not one live interval later.
FIRST_POINTS_EVERY_S = 0.25


def index_slider(where: Any, what: str, count: int, key: str, help: str | None = None) -> int:
    """A slider over the positions ``0 … count − 1`` in ``where`` (a column, or ``st``); with
    one position or none, 0 and a caption saying so (a slider needs two)."""
    if count > 1:
        return where.slider(what, 0, count - 1, key=key, help=help)
    where.caption(f"{what}: 0 (the only one)" if count == 1 else f"{what}: none")
    return 0


def run_header(run: Any) -> None:
    """Status line and progress bar with ETA."""
    fraction, eta = views.progress(run, rate=views.measured_rate(store(), run))
    icon = STATUS_ICONS.get(run.status, "")
    since = None if run.active else views.final_window_start(store(), run)
    st.markdown(
        f"{icon} **{markdown_text(run.name)}** — {markdown_text(views.status_text(run, since))}"
    )
    text = (
        views.steps_text(run) + f" · elapsed {views.format_duration(run.wall_seconds)}"
        f" · ETA {views.format_duration(eta)}"
    )
    st.progress(fraction, text=text)
    if run.status == "failed" and run.error:
        with st.expander("Error details"):
            st.code(run.error)


def chart_controls(prefix: str) -> dict[str, Any]:
    """The live charts' controls (x axis, TensorBoard smoothing, log scale for losses)."""
    from gae_core.insight import figures

    columns = st.columns([2, 3, 2])
    x = columns[0].radio(
        "x axis", list(figures.X_AXES), format_func=figures.X_AXES.get, horizontal=True,
        key=f"{prefix}.x",
    )  # fmt: skip
    smoothing = columns[1].slider(
        "smoothing (TensorBoard EMA weight)", 0.0, 0.99, 0.6, 0.01, key=f"{prefix}.smooth",
        help="Applied to every chart TensorBoard would smooth; raw points stay visible.",
    )  # fmt: skip
    log_losses = columns[2].toggle(
        "log losses", key=f"{prefix}.log",  # short: a longer label is cut off at 1400 px
        help="A log scale for the losses: value loss, gradient norm and advantage std often "
        "span decades.",
    )  # fmt: skip
    return {"x": x, "smoothing": smoothing, "log_losses": log_losses}


def run_charts(
    run_id: str, *, x: str, smoothing: float, log_losses: bool, prefix: str, live: bool = False
) -> bool:
    """The metric charts of one run, two per row, each with a link to the CSV of every logged
    point (smoothed like the chart); whether the episodic return is among them. ``live`` (a
    timer redraws them): the diagnostics change at their own, slower pace
    (:func:`~gae_core.insight.views.live_snapshot`)."""
    from gae_core.insight import exports, figures

    metrics = store().metrics(run_id)
    if metrics.empty:
        if store().get_run(run_id).active:
            st.info("No metrics yet: the first ones arrive after the first update.")
        else:  # e.g. a sweep's trial cancelled before its turn
            st.info("No metrics: the run ended before its first update.")
        return False
    if not live:  # a caption where the live one was: the charts keep their place when a run
        # ends (Streamlit shows a moved element twice, faded, until the rerun ends)
        st.caption("Each CSV holds every point logged, smoothed like its chart.")
    else:
        metrics = views.live_snapshot(metrics)
        st.caption(
            f"While the run trains, the return redraws every {LIVE_CHARTS_EVERY_S:g} s and the "
            f"other charts at most once per {views.DIAGNOSTICS_EVERY_S:g} s of its clock; each "
            "CSV holds every point logged so far."
        )
    present = set(metrics["key"])
    shown = [m for m in M.LIVE if m.key in present]
    columns = st.columns(2)
    for i, metric in enumerate(shown):
        weight = smoothing if metric.smoothed else 0.0
        figure, _ = figures.metric_figure(
            metrics, metric.key, x=x, smoothing=weight, log_y=log_losses and metric.log_scale
        )
        with columns[i % 2]:
            st.plotly_chart(
                figure, key=f"{prefix}.chart.{metric.key}", config={"displaylogo": False}
            )
            csv_link(
                "CSV of every logged point",
                exports.run_metric_url(run_id, metric.key, smoothing=weight),
                key=f"{prefix}-csv-{metric.column}",
            )
    return M.EPISODIC_RETURN.key in present


@st.cache_resource
def lab_jobs() -> dict:
    """Lab jobs started by this server process (their threads live here), by key: the lab page
    starts and shows them, the sidebar lists those measuring and those ended whose end no
    lab page has shown yet (``LabJob.seen``)."""
    return {}


def lab_eta(job: Any) -> str:
    """A lab job's time left as its bar and the sidebar say it: none until the first rollouts
    are in (the states are sampled first)."""
    eta = job.eta
    return (
        "ETA once the first rollouts are in" if eta is None else f"ETA {views.format_duration(eta)}"
    )


@st.cache_resource
def sweeps() -> dict:
    """Sweeps started by this server process (their coordinating threads live here)."""
    return {}
