"""What the live pages send the browser: are charts whose data did not change re-sent?

Streamlit keeps a ForwardMsg cache: a ``new_element`` delta of at least
``global.minCachedMessageSize`` (10 kB by default) whose content hash the browser reports having
is sent as a small ``ref_hash`` message instead of the element
(``streamlit/runtime/scriptrunner_utils/script_run_context.py``, ``enqueue``;
``runtime/forward_msg_cache.py``). Each test opens a live page in Chromium (conftest's fixtures),
records every websocket frame the browser receives (its size, its time, the ForwardMsg's type and
hash) for :data:`WINDOW_S` seconds once the page has drawn, and finds the charts by their titles
in the raw bytes: a frame that carries a whole Plotly chart holds the chart's title text, a
``ref_hash`` frame holds only the hash (77 bytes).

Scenarios, each with another run training in a worker process: the Train page with a finished
run selected (only the sidebar's fragment has a timer), the Runs page with a finished run opened
(its fragment redraws the table and the opened run every 1.5 s while any run trains), and the
Train page with the running run (its return chart changes every flush and is re-sent each tick;
its diagnostic charts change once per 5 s of the run's clock, ``views.live_snapshot``, and go as
references between: the bytes per tick are recorded, not asserted). Measured numbers are
printed and written to ``browser_traffic.json`` in the browser tests' artifacts folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import APP_READY, POINTS_JS, VIEWPORT, wait_until, write_measurements

from gae_core import metrics as M
from gae_core.runs.manager import RunManager
from gae_core.storage.store import RunStore

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: seconds of traffic recorded once the page has drawn: four charts ticks (1.5 s) and three of
#: the sidebar's (2 s)
WINDOW_S = 6.0
#: the app's ``global.minCachedMessageSize`` (.streamlit/config.toml; Streamlit's default is
#: 10 kB): smaller elements are never sent by hash
CACHED_FROM_BYTES = tomllib.loads(
    (Path(__file__).resolve().parents[1] / ".streamlit" / "config.toml").read_text()
)["global"]["minCachedMessageSize"]
#: every chart a run's page can draw, by title (the Plotly spec holds the title as text)
TITLES = tuple(m.title for m in M.LIVE)
#: a finished run: 541 episodes and 29 rows of each update metric (log_every 1,000), so its
#: return and length charts are over 10 kB (19.1 kB) and its update-metric charts under (5.1 kB)
FINISHED = {"total_steps": 30_000, "checkpoint_every": 0, "seed": 3}
#: a run whose budget it never reaches within the module: stopped after its tests
TRAINING = {"total_steps": 100_000_000, "checkpoint_every": 0, "seed": 1}
ARTIFACTS = Path(
    os.environ.get("GAE_SCREENSHOTS_DIR")
    or Path(tempfile.gettempdir()) / "gae-browser-artifacts" / "screenshots"
).parent
MEASURED: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def report_traffic():
    """Print what was measured and write it next to the browser tests' timings."""
    yield
    if MEASURED:
        write_measurements(ARTIFACTS / "browser_traffic.json", MEASURED)


# ----------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class Frame:
    at: float  # time.monotonic() when Playwright delivered it
    size: int  # bytes of the websocket frame
    kind: str  # the ForwardMsg's type: "delta.new_element.plotly_chart", "ref_hash", …
    hash: str  # the message's content hash (what a later ref_hash names)
    ref: str  # for a ref_hash message, the hash it stands for
    titles: tuple[str, ...]  # the chart titles its raw bytes contain


def frame_of(at: float, payload) -> Frame:
    from google.protobuf.message import DecodeError
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    data = payload if isinstance(payload, bytes) else payload.encode()
    titles = tuple(title for title in TITLES if title.encode() in data)
    try:
        msg = ForwardMsg.FromString(data)
    except DecodeError:  # a frame that is not a ForwardMsg: sized, not typed
        return Frame(at, len(data), "?", "", "", titles)
    kind = msg.WhichOneof("type") or "?"
    if kind == "delta":
        kind += "." + (msg.delta.WhichOneof("type") or "?")
        if msg.delta.WhichOneof("type") == "new_element":
            kind += "." + (msg.delta.new_element.WhichOneof("type") or "?")
    return Frame(at, len(data), kind, msg.hash, msg.ref_hash, titles)


@contextlib.contextmanager
def recording(browser, server, path: str):
    """A fresh browser context at ``path``; yields the page and the list its websocket frames
    are appended to as they arrive."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    frames: list[Frame] = []

    def on_websocket(ws) -> None:
        ws.on("framereceived", lambda payload: frames.append(frame_of(time.monotonic(), payload)))

    page.on("websocket", on_websocket)
    try:
        page.goto(f"{server.url}/{path}")
        page.wait_for_selector(APP_READY)
        yield page, frames
    finally:
        context.close()


def pump_until(page, predicate, timeout: float = 60.0) -> bool:
    """Like conftest.wait_until, but waiting in Playwright, so its events (frames) arrive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        page.wait_for_timeout(100)
    return bool(predicate())


def chart_titles(store, run_id: str) -> list[str]:
    """The titles of the charts a run's page draws (its metrics among the live ones)."""
    present = set(store.metrics(run_id)["key"])
    return [m.title for m in M.LIVE if m.key in present]


def full_chart_frames(frames: list[Frame], title: str) -> list[Frame]:
    """The frames that carry the whole chart titled ``title`` (its spec, with its title)."""
    return [f for f in frames if title in f.titles and f.kind.endswith("plotly_chart")]


def record_live_view(page, frames: list[Frame], titles: list[str]) -> dict:
    """Wait for the first draw of every chart in ``titles``, record :data:`WINDOW_S` seconds,
    and summarise: per chart, its first draw's bytes, how often it was received again in full
    (over the whole visit) and by reference (in the window); the window's bytes and runs."""
    assert pump_until(page, lambda: all(full_chart_frames(frames, t) for t in titles)), (
        f"not every chart was drawn: {[t for t in titles if not full_chart_frames(frames, t)]}"
    )
    page.wait_for_function(f"() => ({POINTS_JS})('Episodic return') > 0", polling=100)
    start = time.monotonic()
    page.wait_for_timeout(WINDOW_S * 1000)
    end = time.monotonic()
    window = [f for f in frames if start <= f.at < end]
    title_of = {}  # content hash → chart title, from the charts' full frames
    charts = {}
    for title in titles:
        full = full_chart_frames(frames, title)
        title_of.update({f.hash: title for f in full})
        charts[title] = {"first_draw_bytes": full[0].size}
    for title in titles:
        full = full_chart_frames(frames, title)
        resent = full_chart_frames(window, title)
        refs = [f for f in window if f.kind == "ref_hash" and title_of.get(f.ref) == title]
        charts[title].update(
            received_in_full_during_visit=len(full),
            resent_in_full_in_window=len(resent),
            resent_bytes_in_window=sum(f.size for f in resent),
            sent_as_ref_hash_in_window=len(refs),
        )
    chart_frames = [
        f for f in window if f.kind.endswith("plotly_chart") or title_of.get(f.ref) is not None
    ]
    ticks = len(
        full_chart_frames(window, "Episodic return")
        + [f for f in window if title_of.get(f.ref) == "Episodic return"]
    )
    chart_bytes = sum(f.size for f in chart_frames)
    return {
        "drawn_after_s": round(start - frames[0].at, 2),  # first frame to the window's start
        "window_s": round(end - start, 2),
        "frames": len(window),
        "bytes": sum(f.size for f in window),
        "bytes_per_s": round(sum(f.size for f in window) / (end - start)),
        "script_runs": sum(f.kind == "script_finished" for f in window),
        "chart_ticks": ticks,
        "chart_bytes": chart_bytes,
        "chart_bytes_per_tick": round(chart_bytes / ticks) if ticks else None,
        "ref_hash_frames": sum(f.kind == "ref_hash" for f in window),
        "charts": charts,
    }


def resent(summary: dict) -> dict[str, int]:
    """Per chart re-sent in full after its first draw: how many times."""
    return {
        title: chart["received_in_full_during_visit"] - 1
        for title, chart in summary["charts"].items()
        if chart["received_in_full_during_visit"] > 1
    }


def report(name: str, summary: dict) -> None:
    MEASURED[name] = summary
    print(f"\n{name}: {json.dumps(summary, indent=2)}")


# ----------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def live_runs(app_server):
    """``(finished, training, store)``: a short run trained to the end, then a long one left
    training in a worker process (as the dashboard trains them) for the module's tests."""
    manager = RunManager(RunStore(app_server.data_dir, recover=False), processes=True)
    try:
        finished = manager.start(dict(FINISHED))
        assert manager.wait(finished, 300)
        assert manager.store.get_run(finished).status == "finished"
        training = manager.start(dict(TRAINING))
        store = RunStore(app_server.data_dir, recover=False)
        assert wait_until(lambda: store.get_run(training).env_steps > 0, 60)
        yield finished, training, store
    finally:
        for run_id in manager.store.list_runs(status=["queued", "running"]):
            manager.stop(run_id.id)
        manager.shutdown(timeout=30)


@pytest.fixture(scope="module")
def runs_page_traffic(chromium_browser, app_server, live_runs):
    """The Runs page with the finished run opened (``?run=ID`` selects its row), recorded."""
    finished, training, store = live_runs
    with recording(chromium_browser, app_server, f"runs?run={finished}") as (page, frames):
        page.locator(f".st-key-runs-name-{finished}").wait_for()  # the finished run is open
        summary = record_live_view(page, frames, chart_titles(store, finished))
        assert store.get_run(training).active, "the background run ended during the window"
    report("runs_page_finished_run_opened", summary)
    return summary


# ----------------------------------------------------------------------------- tests


def test_train_page_does_not_resend_a_finished_runs_charts(chromium_browser, app_server, live_runs):
    """A finished run's charts on the Train page: drawn once; the sidebar's 2 s fragment keeps
    rerunning (another run trains) and the page's fragments have no timer, so no chart comes
    again, in full or by reference."""
    finished, training, store = live_runs
    with recording(chromium_browser, app_server, f"train?run={finished}") as (page, frames):
        assert page.locator(".st-key-train-view input").input_value().endswith(finished)
        summary = record_live_view(page, frames, chart_titles(store, finished))
        assert store.get_run(training).active, "the background run ended during the window"
    report("train_page_finished_run", summary)
    assert summary["script_runs"] >= 1, summary  # the sidebar's fragment reran meanwhile
    assert resent(summary) == {}, summary


def test_runs_page_sends_large_unchanged_charts_by_reference(runs_page_traffic):
    """The Runs page's fragment redraws the opened finished run every tick; once the page has
    drawn, each chart of at least minCachedMessageSize comes as a ref_hash, never again in
    full. (While the page loads, a second script run that starts before the first one's last
    charts reach the browser can send those once more in full: the browser had not yet said
    it holds them. On a slow machine that race is common, so the page's load is not held to
    one copy; the window after it is.)"""
    large = {
        title: chart
        for title, chart in runs_page_traffic["charts"].items()
        if chart["first_draw_bytes"] >= CACHED_FROM_BYTES
    }
    assert "Episodic return" in large, runs_page_traffic  # the run is long enough for one
    for title, chart in large.items():
        assert chart["resent_in_full_in_window"] == 0, (title, chart)
        assert chart["received_in_full_during_visit"] <= 2, (title, chart)  # the load's race
        assert chart["sent_as_ref_hash_in_window"] >= 1, (title, chart)  # the fragment ticked


def test_runs_page_does_not_resend_unchanged_charts(runs_page_traffic):
    """No chart of the opened finished run comes again in full once the page has drawn,
    whatever its size (the load's race: the test above)."""
    again = {t: c["resent_in_full_in_window"] for t, c in runs_page_traffic["charts"].items()
             if c["resent_in_full_in_window"]}  # fmt: skip
    assert again == {}, runs_page_traffic


def test_train_page_running_run_resends_its_charts_each_tick(
    chromium_browser, app_server, live_runs
):
    """A running run's return chart changes every flush, so each charts tick (1.5 s) sends it
    in full; its diagnostics change once per 5 s of the run's clock, so some ticks send them as
    references. The bytes per tick are recorded, not asserted."""
    _, training, store = live_runs
    with recording(chromium_browser, app_server, f"train?run={training}") as (page, frames):
        assert page.locator(".st-key-train-view input").input_value().endswith(training)
        summary = record_live_view(page, frames, chart_titles(store, training))
        assert store.get_run(training).active, "the run ended during the window"
    report("train_page_running_run", summary)
    # the return chart changed between ticks, so it came again in full
    assert summary["charts"]["Episodic return"]["resent_in_full_in_window"] >= 2, summary
    # the diagnostics change at most twice in the window and the tick before it (under 10 s):
    # with three ticks or more, each went as a reference at least once
    diagnostics = {title: chart for title, chart in summary["charts"].items()
                   if title.startswith(("Policy loss", "Value loss", "Entropy"))}  # fmt: skip
    assert len(diagnostics) == 3, summary
    if summary["chart_ticks"] >= 3:
        assert all(c["sent_as_ref_hash_in_window"] >= 1 for c in diagnostics.values()), summary
