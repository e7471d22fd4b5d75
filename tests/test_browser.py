"""The dashboard in a real browser: headless Debian Chromium driven by Playwright against
``streamlit run app.py`` (fixtures in conftest.py).

Besides the assertions (loose bounds only, so a loaded CI machine does not flake), the module
measures and prints what a user feels — Start to the first reward point, the live refresh
interval, click-to-redraw latency — and writes them to ``browser_timings.json`` beside the
screenshots: a 1400x900 one of every page, in a temp folder unless ``GAE_SCREENSHOTS_DIR`` names
one (``docs/screenshots`` refreshes the README's).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import APP_READY, POINTS_JS, wait_until, write_measurements

import gae_core
from gae_core import metrics as M
from gae_core.agent.config import TrainConfig
from gae_core.agent.presets import preset_values
from gae_core.insight import figures
from gae_core.runs.manager import RunManager
from gae_core.runs.sweep import grid_of, run_sweep
from gae_core.storage.store import DB_FILENAME, RunStore

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Artifacts go to a temp folder so a test run leaves the work tree clean; refresh the README's
# images with GAE_SCREENSHOTS_DIR=docs/screenshots python -m pytest tests/test_browser.py
SHOTS = Path(
    os.environ.get("GAE_SCREENSHOTS_DIR")
    or Path(tempfile.gettempdir()) / "gae-browser-artifacts" / "screenshots"
)
TIMINGS_FILE = SHOTS.parent / "browser_timings.json"
TIMINGS: dict[str, object] = {}
TINY = {"total_steps": 1200, "num_envs": 2, "rollout_steps": 8, "checkpoint_every": 400}
REFRESH_WINDOW_S = 8
#: How long a Stop click may take to reach the store before the test clicks again (a stop
#: takes about 2 s on the page under load)
STOP_TAKEN_S = 10
#: How many more times the test clicks a Stop that was not taken (a user would click again)
STOP_RETRIES = 2
VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 1400, 900
PAGES = ["Home", "Train", "Runs", "Advantage explorer", "Estimator lab", "λ comparison"]

# Every Plotly chart on the page: title, x-axis title and per trace its name, point count,
# fill and (optionally) y values. Plotly ≥ 6 ships arrays base64-encoded in `data`; the
# decoded typed arrays live in `_fullData`.
CHARTS_JS = """(withY) => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
  const text = (t) => String((t && (t.text ?? t)) || '').replace(/<[^>]+>/g, '');
  const layout = g._fullLayout || g.layout || {};
  return {
    title: text(layout.title),
    xtitle: text(layout.xaxis && layout.xaxis.title),
    traces: (g._fullData || []).map(d => ({
      name: d.name,
      n: d._length ?? (d.x ? d.x.length : 0),
      fill: d.fill || null,
      y: withY && d.y ? Array.from(d.y, Number) : null,
    })),
  };
})"""


# [point count, last x] of the first trace of the chart titled `title` (null while none):
# the count stops at figures.MAX_POINTS, the last x (env step) keeps growing.
EXTENT_JS = """(title) => {
  for (const g of document.querySelectorAll('.js-plotly-plot')) {
    const t = g._fullLayout && g._fullLayout.title;
    const text = String((t && (t.text ?? t)) || '').replace(/<[^>]+>/g, '');
    if (text === title && g._fullData && g._fullData.length) {
      const d = g._fullData[0];
      return [d._length, d._length ? Number(d.x[d._length - 1]) : null];
    }
  }
  return null;
}"""

XTITLE_JS = """(title) => {
  for (const g of document.querySelectorAll('.js-plotly-plot')) {
    const l = g._fullLayout || {};
    const text = String((l.title && (l.title.text ?? l.title)) || '').replace(/<[^>]+>/g, '');
    if (text === title) return String(l.xaxis.title.text || '');
  }
  return null;
}"""

# Records every change of the live column's progress text and of the return chart's extent,
# with performance.now() time stamps, sampled every 50 ms.
SAMPLER_JS = (
    """(title) => {
  window.__samples = [];
  let last = null;
  const extent = """
    + EXTENT_JS
    + """;
  window.__sampler = setInterval(() => {
    const bar = document.querySelector('[data-testid="stMain"] [data-testid="stProgress"]');
    const sample = [bar ? bar.innerText : '', extent(title)];
    const key = JSON.stringify(sample);
    if (key !== last) { window.__samples.push([performance.now(), ...sample]); last = key; }
  }, 50);
}"""
)

# Arms a watch for one click: the click event's timeStamp, then (polled every 20 ms) the
# moment the chart titled title's x-axis title reads `expected`.
CLICK_WATCH_JS = (
    """([title, expected]) => {
  window.__clickAt = null;
  window.__redrawnAt = null;
  const xtitle = """
    + XTITLE_JS
    + """;
  document.addEventListener('click', (event) => { window.__clickAt = event.timeStamp; },
                            {capture: true, once: true});
  const timer = setInterval(() => {
    if (window.__clickAt !== null && xtitle(title) === expected) {
      window.__redrawnAt = performance.now();
      clearInterval(timer);
    }
  }, 20);
}"""
)

# Long tasks (> 50 ms) of the page's main thread from now on: count and total milliseconds.
LONGTASKS_JS = """() => {
  window.__busy = {since_ms: performance.now(), count: 0, total_ms: 0, longest_ms: 0};
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      window.__busy.count += 1;
      window.__busy.total_ms += Math.round(entry.duration);
      window.__busy.longest_ms = Math.max(window.__busy.longest_ms, Math.round(entry.duration));
    }
  }).observe({type: 'longtask'});
}"""


# What LONGTASKS_JS has counted so far, with the wall time since and the busy fraction.
BUSY_NOW_JS = """() => {
  const busy = {...window.__busy, wall_ms: Math.round(performance.now() - window.__busy.since_ms)};
  busy.busy_fraction = Math.round(10000 * busy.total_ms / busy.wall_ms) / 10000;
  return busy;
}"""


@pytest.fixture(scope="module", autouse=True)
def report_timings():
    """Print the measured timings and write them next to the screenshots."""
    yield
    if TIMINGS:
        write_measurements(TIMINGS_FILE, TIMINGS)


# ----------------------------------------------------------------------------- helpers


def store_of(server) -> RunStore:
    """A reader on the server's store (no crash recovery: the server owns its runs)."""
    return RunStore(server.data_dir, recover=False)


def open_page(page, server, path: str = "") -> None:
    page.goto(f"{server.url}/{path}")
    page.wait_for_selector(APP_READY)
    page.locator("h1").first.wait_for()


def wait_idle(page) -> None:
    page.wait_for_selector(APP_READY)


def expect(target, message: str | None = None):
    """Playwright's retrying ``expect`` (imported when called: without Playwright this module
    still collects and its tests skip). Use it, not a one-shot read, for what a rerun the test
    set off draws: the app can read idle (:func:`wait_idle`) before that rerun has begun, and
    a rerun sends its elements one message at a time."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target, message)


def ends_with(text: str) -> re.Pattern:
    """A value ending in ``text`` (``str.endswith``), for :func:`expect`'s ``to_have_value``."""
    return re.compile(re.escape(text) + "$")


def holds(text: str) -> re.Pattern:
    """A URL holding ``text`` (``text in page.url``), for :func:`expect`'s ``to_have_url``."""
    return re.compile(re.escape(text))


def screenshot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.locator("h1").first.scroll_into_view_if_needed()  # the main block scrolls, not window
    page.mouse.move(VIEWPORT_WIDTH - 5, VIEWPORT_HEIGHT - 5)  # no hover toolbars in view
    page.wait_for_timeout(300)  # let Plotly finish drawing
    page.screenshot(path=str(path))
    return path


def charts(page, with_y: bool = False) -> list[dict]:
    return page.evaluate(CHARTS_JS, with_y)


def chart(page, title: str, with_y: bool = False) -> dict:
    found = [c for c in charts(page, with_y) if c["title"] == title]
    assert found, f"no chart titled {title!r}: {[c['title'] for c in charts(page)]}"
    return found[0]


def set_number(page, key: str, value) -> None:
    """Type into the number input with this widget key and commit it (Enter reruns)."""
    field = page.locator(f".st-key-{key} input")
    field.fill(str(value))
    field.press("Enter")
    page.wait_for_function(
        "([sel, v]) => document.querySelector(sel).value == v",
        arg=[f".st-key-{key} input", str(value)],
    )
    wait_idle(page)


def download_csv(page, locator) -> tuple[str, pd.DataFrame]:
    """Click a download link or button once it is the only one matched: while a rerun draws,
    Streamlit keeps an element that moved both where it was (faded) and where it is now."""
    expect(locator).to_have_count(1)
    with page.expect_download() as info:
        locator.click()
    download = info.value
    with open(download.path(), "rb") as handle:
        return download.suggested_filename, pd.read_csv(io.BytesIO(handle.read()))


def wait_for_finished_line(page, app_server, timeout_s: float = 60) -> None:
    """Wait for the Train page's status line to say a run finished (the store already does).
    Under a loaded CI machine the page has taken more than 30 s once; a miss fails with what
    the page showed and the server's log."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    main = page.locator('[data-testid="stMain"]')
    try:
        main.get_by_text(re.compile(r"— finished")).wait_for(timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        shown = main.inner_text()[:1500]
        raise AssertionError(
            f"no '— finished' on the page in {timeout_s} s; it showed:\n{shown}\n"
            f"the server's log:\n{app_server.log_tail()}"
        ) from None


def choose_run(page, run_id: str, key: str = "train-view") -> None:
    """Pick the run in the "run" selectbox of widget key ``key`` (the Train page's by default)
    unless it is already shown."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    field = page.locator(f".st-key-{key} input")
    for _ in range(5):  # a rerun (the sidebar's timer) can close the list under the click
        if field.input_value().endswith(run_id):
            return
        page.locator(f'.st-key-{key} button[aria-label="Open"]').click()
        field.fill(run_id)  # the list filters on what is typed (a long list shows only a window)
        option = page.get_by_role("option").filter(has_text=run_id)
        try:
            option.click(timeout=5_000)
            page.wait_for_function(
                "([sel, id]) => document.querySelector(sel).value.endsWith(id)",
                arg=[f".st-key-{key} input", run_id],
                timeout=5_000,
            )
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    assert field.input_value().endswith(run_id), field.input_value()


def changes(samples: list, field: int) -> list:
    """The samples where ``field`` changed (the first sample is the starting state)."""
    return [b for a, b in itertools.pairwise(samples) if a[field] != b[field]]


def median_gap(times: list[float]) -> float | None:
    return round(float(np.median(np.diff(times))), 2) if len(times) > 1 else None


def max_gap(times: list[float]) -> float | None:
    return round(float(np.max(np.diff(times))), 2) if len(times) > 1 else None


def nav_labels(page) -> list[str]:
    """Sidebar navigation labels without their emoji icons."""
    texts = page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
    return [text.strip().split("\n")[-1].strip() for text in texts]


def start_run(page, key_values: dict) -> float:
    """Fill the Train form, click Start; returns the monotonic time of the click."""
    for key, value in key_values.items():
        set_number(page, f"train-{key}", value)
    button = page.locator(".st-key-train-start button")
    button.scroll_into_view_if_needed()
    clicked = time.monotonic()
    button.click()
    return clicked, time.time()


def click_to_redraw(page) -> tuple[list[float], list[float]]:
    """Click the x-axis radio to wall time and back; per click, the in-page latency (click
    event → the return chart's new x-axis title) and the wall time Playwright saw. A click
    not answered in 10 s is clicked once more and counted in the timings
    (``x_axis_clicks_repeated``; its latency keeps counting from the first click): on 2 busy
    cores one such click in about 17 runs of this test was not taken. A likely cause, since
    removed: the explorer and lab links appeared above with the run's first checkpoint and
    moved everything below while a forced click was on its way (they are now drawn from the
    start, closed until then); the retry stays, counted, in case it was not the only one."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    latencies, totals = [], []
    for axis in ("wall_time", "env_step"):
        title = figures.X_AXES[axis]  # the radio's label is the axis title (one owner)
        page.evaluate(CLICK_WATCH_JS, ["Episodic return", title])
        radio = page.locator(".st-key-train-x").get_by_text(title, exact=True)
        start = time.monotonic()
        radio.click(force=True)
        redrawn = "() => window.__redrawnAt !== null"
        try:
            page.wait_for_function(redrawn, polling=20, timeout=10_000)
        except PlaywrightTimeout:
            TIMINGS["x_axis_clicks_repeated"] = TIMINGS.get("x_axis_clicks_repeated", 0) + 1
            radio.click(force=True)
            page.wait_for_function(redrawn, polling=20, timeout=20_000)
        totals.append(round(time.monotonic() - start, 2))
        watch = page.evaluate("() => [window.__clickAt, window.__redrawnAt]")
        latencies.append(round((watch[1] - watch[0]) / 1000, 2))
    return latencies, totals


# ----------------------------------------------------------------------------- tests


def test_home_starts_with_an_empty_data_folder(app_page, app_server):
    page = app_page
    open_page(page, app_server)
    assert page.locator("h1").first.inner_text() == "GAE Lab"
    assert nav_labels(page) == PAGES
    # the sidebar is drawn after the page: open_page waited for the page's h1 only
    expect(
        page.get_by_text("Runs in progress: 0"), "the sidebar's 'Runs in progress: 0'"
    ).to_be_visible(timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert store_of(app_server).list_runs() == []
    # Nothing in the data folder but the (empty) store the app created.
    assert all(p.name.startswith(DB_FILENAME) for p in app_server.data_dir.iterdir())
    screenshot(page, "home")


def test_train_live_chart_refresh_click_latency_and_stop(app_page, app_server):
    """CartPole-v1 with the form's defaults (only a bigger budget, so the run is still live
    when Stop is clicked): Start → first reward point, live refresh interval, x-axis click
    latency, Stop → ``stopped`` in the store and on the page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = app_page
    open_page(page, app_server, "train")
    expect(page.get_by_text("No runs yet"), "the Train page's 'No runs yet'").to_be_visible(
        timeout=30_000
    )
    assert page.locator(".st-key-train-env_id input").input_value() == "CartPole-v1"
    start = page.locator(".st-key-train-start button").bounding_box()  # before any scrolling
    assert start["y"] + start["height"] <= VIEWPORT_HEIGHT, start  # Start is in view at 1400×900
    clicked, clicked_at = start_run(page, {"total_steps": 5_000_000})
    page.wait_for_function(
        f"() => ({POINTS_JS})('Episodic return') > 0", timeout=30_000, polling=50
    )
    first_point = time.monotonic() - clicked
    store = store_of(app_server)
    (run,) = store.list_runs()
    assert run.config["env_id"] == "CartPole-v1" and run.status == "running"
    returns = store.metrics(run.id, [M.EPISODIC_RETURN.key])
    assert len(returns) > 0
    TIMINGS["chromium"] = page.context.browser.version
    TIMINGS["start_to_first_reward_point_s"] = round(first_point, 2)
    TIMINGS["start_breakdown_s"] = {
        "run_started_in_store": round(run.started_at - clicked_at, 2),
        "first_return_stored": round(
            run.started_at + float(returns["wall_time"].min()) - clicked_at, 2
        ),
        "first_return_on_page": round(first_point, 2),
        "returns_stored_when_first_drawn": len(returns),
    }
    print(f"\nStart → first episodic-return point on the page: {first_point:.2f} s (target ≤ 1.5)")
    assert first_point < 30

    # Live refresh: every change of the progress text / the chart's extent over 8 s.
    page.evaluate(LONGTASKS_JS)
    page.evaluate(SAMPLER_JS, "Episodic return")
    page.wait_for_timeout(REFRESH_WINDOW_S * 1000)
    samples = page.evaluate("() => { clearInterval(window.__sampler); return window.__samples }")
    # the main thread over the window alone (a live view someone watches; the target ≤ 0.30)
    watched = page.evaluate(BUSY_NOW_JS)
    text_times = [t / 1000 for t, *_ in changes(samples, 1)]
    chart_times = [t / 1000 for t, *_ in changes(samples, 2)]
    last_steps = [s[2][1] for s in samples if s[2]]
    TIMINGS["live_refresh"] = {
        "window_s": REFRESH_WINDOW_S,
        "progress_text_updates": len(text_times),
        "progress_median_interval_s": median_gap(text_times),
        "progress_max_interval_s": max_gap(text_times),
        "chart_updates": len(chart_times),
        "chart_median_interval_s": median_gap(chart_times),
        "chart_max_interval_s": max_gap(chart_times),
        "chart_last_env_step": [min(last_steps), max(last_steps)],
    }
    print(f"live refresh: {TIMINGS['live_refresh']} (target: every ≤ 2 s)")
    assert len(text_times) >= 1, samples  # loose: the fragment refreshed at all
    assert max(last_steps) > min(last_steps), "the return chart did not grow while training"
    # the chart never blanks out while it refreshes: every sample (every 50 ms, a sample kept
    # whenever something changed) found it, with points
    blank = [s for s in samples if not s[2] or not s[2][0]]
    assert blank == [], blank

    # Click latency: the x-axis radio, from the click event (its timeStamp is when the input
    # arrived, so the main thread's input delay counts) to the return chart's new x-axis
    # title, both seen inside the page. force=True: no actionability wait, a user does not
    # wait for the layout to hold still.
    latencies, totals = click_to_redraw(page)
    TIMINGS["x_axis_click_to_redraw_s"] = latencies
    TIMINGS["x_axis_click_to_redraw_incl_playwright_s"] = totals
    busy = page.evaluate(BUSY_NOW_JS)  # the same window and then the two clicks' redraws
    TIMINGS["main_thread_long_tasks_during_live_view"] = watched
    TIMINGS["main_thread_long_tasks_live_view_and_two_clicks"] = busy
    print(f"x-axis radio click → redrawn axis: {latencies} s (target ≤ 1); live view {watched}; "
          f"with the clicks {busy}")  # fmt: skip
    assert max(latencies) < 30
    screenshot(page, "train")  # mid-run: the script state never rests while the timer runs

    # The same with two runs training in the server: a second Start (the view follows it).
    start_run(page, {"total_steps": 5_000_000})
    assert wait_until(lambda: len(store.list_runs()) == 2, 15)
    (second,) = [r for r in store.list_runs() if r.id != run.id]
    page.wait_for_function(
        "([sel, id]) => document.querySelector(sel).value.endsWith(id)",
        arg=[".st-key-train-view input", second.id],
        timeout=15_000,
    )
    page.wait_for_function(
        f"() => ({POINTS_JS})('Episodic return') > 0", timeout=30_000, polling=50
    )
    assert wait_until(lambda: {r.status for r in store.list_runs()} == {"running"}, 15)
    # Right after the switch the page is still creating the new run's charts; then again once
    # it has settled (the same window the one-run measurement waits), both runs still training.
    first, _ = click_to_redraw(page)
    page.wait_for_timeout(REFRESH_WINDOW_S * 1000)
    page.evaluate(LONGTASKS_JS)
    latencies, totals = click_to_redraw(page)
    steps_before = store.get_run(run.id).env_steps
    assert wait_until(lambda: store.get_run(run.id).env_steps > steps_before, 10)
    TIMINGS["x_axis_click_to_redraw_two_runs_right_after_switch_s"] = first
    TIMINGS["x_axis_click_to_redraw_two_runs_training_s"] = latencies
    TIMINGS["x_axis_click_to_redraw_two_runs_incl_playwright_s"] = totals
    TIMINGS["main_thread_long_tasks_two_runs"] = page.evaluate("() => window.__busy")
    print(
        f"two runs training: click → redrawn axis {latencies} s (target ≤ 1); {first} s "
        "right after the view switched"
    )
    assert max(latencies) < 30
    store.request_stop(run.id)  # the first run is no longer in view
    assert wait_until(lambda: store.get_run(run.id).status == "stopped", 30)
    run = second

    # Stop.
    assert store.get_run(run.id).status == "running", "the run ended before Stop was clicked"
    start = time.monotonic()
    stopped_in_store = lambda: store.get_run(run.id).status == "stopped"  # noqa: E731
    page.locator(".st-key-train-stop button").click(force=True)
    # Once in CI (915d2b6), and once in a full suite here with a second click lost too, the
    # run was still running 30 s after the click; neither reproduced alone, loaded or not (a
    # removed cause: the links row moved Stop under the forced click; since, Stop has also
    # left the 1 s fragment, so a click reruns the whole page). A user whose click
    # is not taken clicks again; the test does too, up to STOP_RETRIES times, through
    # Playwright's checks (visible, stable, not covered) where they pass, counts the misses
    # and says whether the page was still live at each; a click missed every time fails it.
    bar = page.locator('[data-testid="stMain"] [data-testid="stProgress"]').first

    def progress_text() -> str:
        try:
            return bar.inner_text(timeout=5_000)
        except PlaywrightTimeout:
            return "(no progress bar)"

    misses = []
    while not wait_until(stopped_in_store, STOP_TAKEN_S) and len(misses) < STOP_RETRIES:
        before = progress_text()
        page.wait_for_timeout(1_500)
        misses.append({"page_live": before != progress_text(), "progress": before})
        print(f"a Stop click was not taken in {STOP_TAKEN_S} s ({misses[-1]}); clicked again")
        button = page.locator(".st-key-train-stop button")
        for force in (False, True):  # (gone: the run stopped meanwhile, which is checked next)
            try:
                button.click(force=force, timeout=5_000)
                break
            except PlaywrightTimeout:
                continue
    TIMINGS["stop_clicks_not_taken"] = misses
    assert wait_until(stopped_in_store, 30), (
        f"Stop clicked {1 + len(misses)} times, the run still {store.get_run(run.id).status} "
        f"({misses}); the server's log:\n{app_server.log_tail()}"
    )
    page.get_by_text(re.compile(r"stopped at step [\d,]+")).wait_for(timeout=30_000)
    TIMINGS["stop_click_to_stopped_on_page_s"] = round(time.monotonic() - start, 2)
    stopped = store.get_run(run.id)
    # the step the store holds, not only some "stopped at step N" (a redraw may still follow)
    expect(
        page.locator('[data-testid="stMain"]'), "the Train page's stopped status line"
    ).to_contain_text(f"stopped at step {stopped.env_steps:,}", use_inner_text=True, timeout=15_000)
    # the Stop button goes with the redraw that follows (stale elements linger until then)
    page.locator(".st-key-train-stop").wait_for(state="detached", timeout=15_000)
    # Cross-check: after the final redraw the chart shows every stored point (≤ MAX_POINTS).
    stored = len(store.metrics(run.id, [M.EPISODIC_RETURN.key]))
    page.wait_for_function(
        f"() => ({POINTS_JS})('Episodic return') === {min(stored, figures.MAX_POINTS)}",
        timeout=15_000,
    )


def test_train_csv_download_matches_the_store(app_page, app_server):
    page = app_page
    open_page(page, app_server, "train")
    store = store_of(app_server)
    known = {r.id for r in store.list_runs()}
    start_run(page, {"total_steps": 10_000})
    assert wait_until(lambda: len(store.list_runs()) == len(known) + 1, 15)
    (run_id,) = {r.id for r in store.list_runs()} - known
    assert wait_until(lambda: store.get_run(run_id).status == "finished", 60)
    choose_run(page, run_id)
    wait_for_finished_line(page, app_server)
    wait_idle(page)
    name, frame = download_csv(page, page.locator(".st-key-train-csv-episodic_return a"))
    assert name == f"{run_id}_episodic_return.csv"
    stored = store.metrics(run_id, [M.EPISODIC_RETURN.key])
    stored = stored.sort_values(["env_step", "wall_time"], kind="stable")
    assert 0 < len(stored) <= figures.MAX_POINTS, len(stored)  # short: every point is plotted
    assert len(frame) == len(stored)
    np.testing.assert_array_equal(frame["env_step"].to_numpy(), stored["env_step"].to_numpy())
    np.testing.assert_allclose(
        frame["episodic_return"].to_numpy(), stored["value"].to_numpy(), rtol=1e-12
    )
    # the page's last redraw (the status line's end-of-run rerun may still be on its way)
    # shows every stored point
    page.wait_for_function(
        f"() => ({POINTS_JS})('Episodic return') === {len(stored)}", timeout=15_000
    )


def test_start_switches_the_live_view_to_the_new_run(app_page, app_server):
    """With a run already in view, Start shows the new run (the keyed 'run' selectbox used to
    keep the old one)."""
    page = app_page
    open_page(page, app_server, "train")
    store = store_of(app_server)
    known = {r.id for r in store.list_runs()}
    assert known, "needs an earlier run in the store"
    active = len(store.list_runs(status=["queued", "running"]))
    clicked = start_run(page, {"total_steps": 50_000})[0]
    # the sidebar lists it with the Start's own rerun (it is drawn after the page), not on its
    # next 2 s tick
    page.get_by_text(f"Runs in progress: {active + 1}").wait_for(timeout=10_000)
    TIMINGS["start_to_sidebar_listing_s"] = round(time.monotonic() - clicked, 2)
    assert wait_until(lambda: len(store.list_runs()) == len(known) + 1, 15)
    (run_id,) = {r.id for r in store.list_runs()} - known
    page.wait_for_function(
        "([sel, id]) => document.querySelector(sel).value.endsWith(id)",
        arg=[".st-key-train-view input", run_id],
        timeout=3_000,
    )


def test_the_forms_advanced_section_opens_as_it_was_left_on_another_page(app_page, app_server):
    """Open "Advanced" on Train, visit Runs, come back: it is still open (a widget's own state
    goes with its page); closed, it comes back closed."""
    page = app_page
    open_page(page, app_server, "train")
    advanced = page.locator(".st-key-train-advanced details")

    def visit_runs_and_come_back() -> None:
        wait_idle(page)
        page.locator('[data-testid="stSidebarNav"] a', has_text="Runs").click()
        expect(page).to_have_url(holds("/runs"))
        page.locator('[data-testid="stSidebarNav"] a', has_text="Train").click()
        expect(page).to_have_url(holds("/train"))
        page.locator(".st-key-train-advanced").wait_for()

    expect(advanced).not_to_have_attribute("open", "")
    page.locator(".st-key-train-advanced summary").click()
    expect(advanced).to_have_attribute("open", "")
    visit_runs_and_come_back()
    expect(advanced).to_have_attribute("open", "")
    page.locator(".st-key-train-advanced summary").click()
    expect(advanced).not_to_have_attribute("open", "")
    visit_runs_and_come_back()
    expect(advanced).not_to_have_attribute("open", "")


def test_runs_page_lists_the_runs_and_opens_one(app_page, app_server):
    page = app_page
    open_page(page, app_server, "runs")
    store = store_of(app_server)
    runs = store.list_runs()
    assert len(runs) >= 2
    # The dataframe is a canvas; its accessible grid and the CSV carry the ids.
    grid = page.locator('[data-testid="stDataFrame"] table[role="grid"]')
    grid.wait_for(state="attached")
    grid_text = grid.inner_text()
    for run in runs:
        assert run.id in grid_text and run.name in grid_text
    name, table = download_csv(page, page.get_by_role("link", name=re.compile("Runs table CSV")))
    after = {r.id: r.status for r in store.list_runs()}
    assert name == "runs.csv"
    assert table["run_id"].astype(str).tolist() == [r.id for r in runs]
    # read from the store at the click: each status is the one before or the one after it (a
    # run of an earlier test may end meanwhile)
    for run, status in zip(runs, table["status"], strict=True):
        assert status in {run.status, after[run.id]}, (run.id, status)
    # Select the first row by its checkbox in the canvas (row markers: first 35 px column,
    # header and rows 35 px high).
    box = page.locator('[data-testid="stDataFrame"]').bounding_box()
    page.mouse.click(box["x"] + 17, box["y"] + 35 + 17)
    page.locator(".st-key-runs-x").wait_for(timeout=15_000)
    # the opened run's rename field is keyed by its id: the first row (newest run) is open
    page.locator(f".st-key-runs-name-{runs[0].id}").wait_for()
    page.wait_for_function(f"() => ({POINTS_JS})('Episodic return') > 0", timeout=15_000)
    wait_idle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot(page, "runs")
    # one click on Rename right after typing opens its dialog (the box sends its value as it
    # loses focus: a button disabled until then took that first click and did nothing)
    page.locator(f".st-key-runs-name-{runs[0].id} input").fill("a name typed just now")
    page.locator(".st-key-runs-rename button").click()
    dialog = page.get_by_role("dialog")
    expect(dialog, "the Rename dialog after one click").to_contain_text(
        "a name typed just now", timeout=15_000
    )
    page.keyboard.press("Escape")  # dismissed: nothing renamed
    dialog.wait_for(state="detached", timeout=15_000)
    assert store.get_run(runs[0].id).name == runs[0].name


def test_csv_downloads_are_not_lost_to_live_refreshes(app_page, app_server):
    """While a run trains, the Runs page and the Train page's charts redraw every 1.5 s. A
    Streamlit download button hands out a file that the next redraws delete: on a loaded CI
    machine 1 click in 30 downloaded nothing. Store CSVs are links to the server's export route
    now, read from the store when clicked, so clicks at every phase of the timers all land."""
    manager = RunManager(RunStore(app_server.data_dir, recover=False))
    run_id = manager.start({"total_steps": 5_000_000, "checkpoint_every": 0})
    try:
        assert wait_until(lambda: manager.store.get_run(run_id).status == "running", 30)
        page = app_page
        open_page(page, app_server, "runs")
        link = page.get_by_role("link", name=re.compile("Runs table CSV"))
        link.wait_for()
        for i in range(8):  # clicks at phases across the 1.5 s refresh timer (0 to 1.4 s)
            name, table = download_csv(page, link)
            assert name == "runs.csv" and run_id in table["run_id"].astype(str).tolist()
            page.wait_for_timeout(200 * i)
        # The Train page: each live chart's link sits in the fragment that redraws the chart.
        open_page(page, app_server, "train")
        choose_run(page, run_id)
        link = page.locator(".st-key-train-csv-episodic_return a")
        for i in range(5):
            before = len(manager.store.metrics(run_id, [M.EPISODIC_RETURN.key]))
            name, frame = download_csv(page, link)
            assert name == f"{run_id}_episodic_return.csv"
            assert len(frame) >= before > 0  # every point logged by the click, and more
            assert "episodic_return_smoothed" in frame  # smoothed like the chart
            page.wait_for_timeout(300 * i)  # 0 to 1.2 s: across the 1.5 s chart timer
    finally:
        manager.stop(run_id)
        manager.wait(run_id, 60)
        manager.shutdown(timeout=10)


@pytest.fixture(scope="module")
def recorded_run(app_server):
    """A tiny run with checkpoints and recorded trajectories, trained through the library on
    the server's data folder."""
    manager = RunManager(RunStore(app_server.data_dir, recover=False))
    run_id = manager.start(dict(TINY))
    assert manager.wait(run_id, 120)
    manager.shutdown(timeout=10)
    return run_id


# The name of the explorer chart's GAE trace at the slider's λ (solid, width 3.5), or null.
SLIDER_GAE_JS = """() => {
  const g = document.querySelector('.st-key-ex-main .js-plotly-plot');
  const d = g && (g._fullData || []).find(d => d.line && d.line.width === 3.5);
  return d ? d.name : null;
}"""


@contextlib.contextmanager
def two_runs_training(server):
    """Two long CartPole runs training in worker processes of this test (as the dashboard
    trains them) while the body times the page; stopped after."""
    manager = RunManager(RunStore(server.data_dir, recover=False), processes=True)
    busy = [manager.start({"total_steps": 5_000_000, "checkpoint_every": 0, "seed": s})
            for s in (1, 2)]  # fmt: skip
    try:
        store = store_of(server)
        assert wait_until(lambda: all(store.get_run(r).env_steps > 0 for r in busy), timeout=60)
        yield busy
    finally:
        for run_id in busy:
            manager.stop(run_id)
        manager.shutdown(timeout=30)


def slider_lambda(page) -> float:
    return float(page.evaluate(SLIDER_GAE_JS).rsplit("=", 1)[1])


def test_explorer_lambda_slider_moves_gae_in_the_browser_and_csv_matches_gae_core(
    app_page, app_server, recorded_run
):
    """The chart's own λ slider redraws GAE, the heat map's marker and the weights without a
    server round trip: a click on its rail → the new λ drawn, timed (recorded, not asserted)
    with two runs training; the drawn GAE equals gae_core's at that λ and the CSV's column."""
    page = app_page
    with two_runs_training(app_server):
        open_page(page, app_server, f"explorer?run={recorded_run}")
        page.locator(".st-key-ex-main .js-plotly-plot").wait_for()
        wait_idle(page)
        assert page.locator(".st-key-ex-run input").input_value().endswith(recorded_run)
        gamma = float(page.locator(".st-key-ex-gamma input").input_value())
        start = slider_lambda(page)
        rail = page.locator(".st-key-ex-main .slider-rail-touch-rect").bounding_box()
        timings = []
        for fraction in (0.3, 0.6, 0.45):
            before = slider_lambda(page)
            page.mouse.move(rail["x"] + fraction * rail["width"], rail["y"] + rail["height"] / 2)
            clicked = time.monotonic()
            page.mouse.down()
            page.mouse.up()
            page.wait_for_function(f"() => ({SLIDER_GAE_JS})() !== 'GAE λ = {before:g}'",
                                   timeout=5_000, polling=5)  # fmt: skip
            timings.append(time.monotonic() - clicked)
        TIMINGS["explorer_lambda_slider_to_redraw_s"] = round(sorted(timings)[1], 3)
        moved = slider_lambda(page)
        assert moved != start and 0.3 < moved < 0.6
        traces = chart(page, "Advantage estimates along the trajectory", with_y=True)["traces"]
        drawn = next(t for t in traces if t["name"] == f"GAE λ = {moved:g}")
        marker = next(t for t in traces if t["name"] == "the slider's λ")
        assert marker["y"] == [moved, moved]  # the heat map's line moved with it

        name, frame = download_csv(page, page.locator(".st-key-ex-csv button"))
        assert name == f"{recorded_run}_advantages.csv"
        arrays = (
            frame["reward"].to_numpy(np.float32),  # the page computes in float32
            frame["value"].to_numpy(np.float32),
            frame["next_value"].to_numpy(np.float32),
            frame["terminated"].to_numpy(bool),
            frame["truncated"].to_numpy(bool),
        )
        gae_columns = [c for c in frame.columns if c.startswith("gae[lambda=")]
        assert len(gae_columns) == 101  # every λ the slider can show
        for column in gae_columns[::10]:
            lam = float(column[len("gae[lambda=") : -1])
            expected = np.asarray(gae_core.gae(*arrays, gamma=gamma, lambda_=lam), dtype=float)
            atol = 1e-5 * max(1.0, float(np.abs(expected).max()))  # float32 rounding
            np.testing.assert_allclose(frame[column].to_numpy(), expected, rtol=1e-5, atol=atol)
        expected = gae_core.gae(*arrays, gamma=gamma, lambda_=moved)
        np.testing.assert_allclose(drawn["y"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(drawn["y"], frame[f"gae[lambda={moved:g}]"], rtol=1e-6,
                                   atol=1e-6)  # fmt: skip
        screenshot(page, "explorer")


def test_a_pasted_link_opens_the_same_view_and_measure_carries_it_to_the_lab(
    chromium_browser, app_server, recorded_run
):
    """A link with ``?run=&policy=&lambda=`` opened in a new tab (no session) shows that run,
    checkpoint and λ, through the navigation hand-over of a direct link; "Measure this
    checkpoint" opens the lab with the run and checkpoints in its URL; Back returns to the
    explorer's view."""
    steps = store_of(app_server).checkpoint_steps(recorded_run)
    assert len(steps) >= 2
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        link = f"{app_server.url}/explorer?run={recorded_run}&policy={steps[0]}&lambda=0.3"
        page.goto(link)
        page.locator(".st-key-ex-main .js-plotly-plot").wait_for(timeout=60_000)
        wait_idle(page)
        assert page.locator(".st-key-ex-run input").input_value().endswith(recorded_run)
        assert page.locator(".st-key-ex-policy input").input_value() == f"{steps[0]:,}"
        assert slider_lambda(page) == pytest.approx(0.3)
        assert f"run={recorded_run}" in page.url and "lambda=0.3" in page.url

        page.get_by_role("button", name="Measure this checkpoint in the Estimator lab").click()
        page.wait_for_function("() => location.pathname.endsWith('/lab')", timeout=30_000)
        page.locator(".st-key-lab-policy").wait_for(timeout=30_000)
        wait_idle(page)
        for part in (f"run={recorded_run}", f"policy={steps[0]}"):
            expect(page, f"the lab's URL holds {part}").to_have_url(holds(part), timeout=30_000)
        expect(
            page.locator(".st-key-lab-run input"), f"the lab's run box: {recorded_run}"
        ).to_have_value(ends_with(recorded_run), timeout=30_000)
        expect(
            page.locator(".st-key-lab-policy input"), f"the lab's policy box: {steps[0]:,}"
        ).to_have_value(f"{steps[0]:,}", timeout=30_000)

        page.go_back()
        page.wait_for_function("() => location.pathname.endsWith('/explorer')", timeout=30_000)
        page.locator(".st-key-ex-main .js-plotly-plot").wait_for(timeout=30_000)
        wait_idle(page)
        expect(
            page.locator(".st-key-ex-policy input"), f"the explorer's policy box: {steps[0]:,}"
        ).to_have_value(f"{steps[0]:,}", timeout=30_000)

        # the sidebar's way to the lab adds two history entries (the page, then its whole
        # selection in one write), not one per parameter: Back leaves the lab in two steps
        # (it took five when run, policy, critic and view were written one by one)
        before = page.evaluate("history.length")
        page.locator('[data-testid="stSidebarNav"] a', has_text="Estimator lab").first.click()
        for part in (f"run={recorded_run}", "critic=", "view="):
            expect(page, f"the lab's URL holds {part}").to_have_url(holds(part), timeout=30_000)
        page.locator(".st-key-lab-policy").wait_for(timeout=30_000)
        wait_idle(page)
        assert page.evaluate("history.length") - before <= 2
    finally:
        context.close()


def test_a_lab_job_left_running_shows_in_the_sidebar_with_a_way_back(
    app_page, app_server, recorded_run
):
    page = app_page
    open_page(page, app_server, f"lab?run={recorded_run}")
    page.locator(".st-key-lab-start button").wait_for(timeout=30_000)
    wait_idle(page)
    page.locator(".st-key-lab-start button").click()
    page.get_by_text("measuring…").first.wait_for(timeout=30_000)
    page.locator('[data-testid="stSidebarNav"] a', has_text="Runs").first.click()
    page.wait_for_function("() => location.pathname.endsWith('/runs')", timeout=30_000)
    shown = page.get_by_text(f"lab (per state): run {recorded_run}")
    shown.wait_for(timeout=10_000)  # the sidebar lists the measurement, running or done
    link = page.get_by_role("link", name="open in the lab")
    assert f"run={recorded_run}" in link.get_attribute("href")
    link.click()
    page.wait_for_function("() => location.pathname.endsWith('/lab')", timeout=30_000)
    page.locator(".st-key-lab-run").wait_for(timeout=30_000)
    wait_idle(page)
    expect(
        page.locator(".st-key-lab-run input"), f"the lab's run box: {recorded_run}"
    ).to_have_value(ends_with(recorded_run), timeout=30_000)
    # let it finish before the next test (it is stored with the run)
    store = store_of(app_server)
    assert wait_until(lambda: len(store.lab_records(recorded_run)) >= 1, 120)
    # once the lab page has shown its end, the sidebar no longer offers the way back
    expect(page.get_by_text(f"lab (per state): run {recorded_run}")).to_have_count(
        0, timeout=30_000
    )


# Text the page cuts off: widget labels, button labels (an ellipsis), formulas and captions
# whose content is wider than their box by more than KaTeX's sub- and superscript overhang
# (3 px), each with its widths; and download links broken over two lines.
CUT_OFF_JS = r"""() => {
  const sel = '[data-testid="stWidgetLabel"] p, [data-testid="stWidgetLabel"] div, ' +
              '.katex-display, [data-testid="stCaptionContainer"], ' +
              '[data-testid="stMarkdownContainer"] p, button [data-testid="stMarkdownContainer"]';
  const cut = Array.from(document.querySelectorAll(sel))
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 3)
    .map(e => `${e.innerText.replace(/\s+/g, ' ').slice(0, 60)} ` +
              `(${e.scrollWidth} > ${e.clientWidth})`);
  const wrapped = Array.from(document.querySelectorAll('a[download]'))
    .filter(e => e.offsetParent !== null && e.getClientRects().length > 1)
    .map(e => `${e.innerText} (a link on ${e.getClientRects().length} lines)`);
  return cut.concat(wrapped);
}"""


def test_no_label_formula_or_caption_is_cut_off_at_1400_by_900(app_page, app_server, recorded_run):
    page = app_page
    found = {}
    for path in ("", "train", "runs", f"explorer?run={recorded_run}", f"lab?run={recorded_run}",
                 "compare"):  # fmt: skip
        open_page(page, app_server, path)
        wait_idle(page)
        page.wait_for_timeout(500)
        for expander in page.locator('[data-testid="stExpander"] summary').all():
            expander.click()  # formulas and explanations sit in expanders
        wait_idle(page)
        cut = page.evaluate(CUT_OFF_JS)
        if cut:
            found[path or "home"] = cut
    assert found == {}


def test_compare_launch_button_runs_a_sweep_in_worker_processes(app_page, app_server):
    """The page's own Launch button: spawned workers from the Streamlit server process."""
    page = app_page
    open_page(page, app_server, "compare")
    store = store_of(app_server)
    before = {s.id for s in store.list_sweeps()}
    log_before = app_server.log_path.read_text(errors="replace")
    page.locator(".st-key-cmp-view").get_by_text("Launch a sweep", exact=True).click()
    field = page.locator(".st-key-cmp-lambdas input")
    # a bad value: what is wrong and the (disabled) Launch are in view under the boxes, and
    # Launch does not count trials from the half-read list
    field.fill("0.9, 1.5")
    field.press("Enter")
    message = page.get_by_text("λ values must be in [0, 1], got 1.5")
    message.wait_for()
    launch = page.locator(".st-key-cmp-launch button")
    # in view where the error shows, whole: retried, since the rerun that draws the message
    # sends Launch in a later message (a one-shot read once found it not drawn yet)
    expect(message, "the λ error in view").to_be_in_viewport(ratio=1.0, timeout=30_000)
    expect(launch, "Launch in view under it").to_be_in_viewport(ratio=1.0, timeout=30_000)
    # Launch is drawn after the message, in a later message of the same rerun: wait for it
    expect(launch, "Launch disabled by the bad λ").to_be_disabled(timeout=30_000)
    expect(launch, "Launch's label: fix …").to_contain_text(
        "fix", use_inner_text=True, timeout=30_000
    )
    field.fill("0.5, 1")
    field.press("Enter")
    wait_idle(page)
    set_number(page, "cmp-seeds", 1)
    set_number(page, "cmp-workers", 1)
    set_number(page, "cmp-total_steps", 1500)
    # a committed value's rerun may not have begun when wait_idle looks (the app reads idle
    # until it does), so wait for the label rather than read it once
    expect(launch).to_have_text(
        "Launch 2 runs (2 λ × 1 seed), 1,500 env steps each", timeout=30_000
    )
    # back up to the study's boxes, as a user who set the budget far down the form does: the
    # fills above scrolled the page by however far the form reached at that moment (once in a
    # full run it left the progress panel's row above the viewport)
    field.scroll_into_view_if_needed()
    launch.click()
    assert wait_until(lambda: len({s.id for s in store.list_sweeps()} - before) == 1, 30)
    sweep_id = ({s.id for s in store.list_sweeps()} - before).pop()
    # the progress panel (the other column's top) is in view beside Launch
    progress = page.get_by_text(re.compile(r"\d+/2 trials ended"))
    progress.wait_for(timeout=30_000)
    expect(progress, "the progress beside Launch").to_be_in_viewport(ratio=1.0, timeout=30_000)
    assert wait_until(lambda: store.get_sweep(sweep_id).status == "finished", 120), store.get_sweep(
        sweep_id
    ).status
    runs = store.list_runs(sweep_id=sweep_id)
    assert sorted(r.config["lambda_"] for r in runs) == [0.5, 1.0]
    assert {r.status for r in runs} == {"finished"}
    page.get_by_text("2/2 trials ended").wait_for(timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    # the spawned workers do not re-run Streamlit's launcher: no context warnings in the log
    new_log = app_server.log_path.read_text(errors="replace")[len(log_before) :]
    assert "missing ScriptRunContext" not in new_log, new_log[-2000:]


@pytest.fixture(scope="module")
def lambda_sweep(app_server):
    """A 2 λ × 2 seed sweep of tiny runs, through the library on the server's data folder."""
    store = RunStore(app_server.data_dir, recover=False)
    base = TrainConfig(**{**TINY, "total_steps": 1500, "checkpoint_every": 0})
    sweep = run_sweep(store, base, grid_of(lambdas=[0.8, 1.0], seeds=[0, 1]), workers=2)
    return sweep


def test_compare_draws_one_band_per_lambda(app_page, app_server, lambda_sweep):
    page = app_page
    open_page(page, app_server, "compare")  # the Compare view is the default
    page.locator(".st-key-cmp-curves .js-plotly-plot").wait_for(timeout=30_000)
    wait_idle(page)
    spec = page.evaluate(
        """() => document.querySelector('.st-key-cmp-curves .js-plotly-plot').data
                 .map(d => ({name: d.name, fill: d.fill || null}))"""
    )
    bands = [t for t in spec if t["fill"] == "tonexty"]
    assert len(bands) == 2, spec
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot(page, "compare")


def test_a_direct_link_on_a_fresh_server_gets_the_apps_navigation(
    chromium_browser, fresh_app_server
):
    """pages/ is also Streamlit's legacy multipage folder: before app.py has run once, a
    direct link to /runs would run pages/runs.py alone (legacy sidebar listing 'app' and
    'ui', no wide layout). The page must hand over to app.py's navigation and come back."""
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{fresh_app_server.url}/runs")
        page.wait_for_function(
            """() => document.querySelector('h1')?.innerText === 'Runs' &&
                     Array.from(document.querySelectorAll('[data-testid="stSidebarNav"] a'))
                       .some(a => a.innerText.includes('Advantage explorer'))""",
            timeout=30_000,
        )
        page.wait_for_selector(APP_READY)
        assert nav_labels(page) == PAGES
        assert page.url.rstrip("/").endswith("/runs")
        expect(
            page.get_by_text("No runs in the store yet"), "the Runs page's empty-store note"
        ).to_be_visible(timeout=30_000)
    finally:
        context.close()


# The heat map's title and its first trace's z (decoded, row by row) on the compare page.
HEATMAP_JS = """() => {
  const g = document.querySelector('.st-key-cmp-grid .js-plotly-plot');
  if (!g || !g._fullData || !g._fullData.length) return null;
  const l = g._fullLayout || {};
  const d = g._fullData[0];
  return {title: String((l.title && (l.title.text ?? l.title)) || '').replace(/<[^>]+>/g, ''),
          x: Array.from(d.x, String), y: Array.from(d.y, String),
          z: Array.from(d.z, row => Array.from(row, v => (v === null ? NaN : Number(v))))};
}"""


@pytest.fixture(scope="module")
def grid_sweep(app_server):
    """A 5 λ × 4 γ study of one seed each (20 cells), the newest sweep on the server."""
    store = RunStore(app_server.data_dir, recover=False)
    base = TrainConfig(**{**TINY, "total_steps": 800, "checkpoint_every": 0})
    grid = grid_of(lambdas=[0.8, 0.9, 0.96, 0.99, 1.0], seeds=[0], gamma=[0.96, 0.98, 0.99, 0.995])
    return run_sweep(store, base, grid, workers=2)


def test_compare_draws_a_gamma_by_lambda_study_as_a_heat_map(app_page, app_server, grid_sweep):
    from gae_core.insight import compare
    from gae_core.insight.grid import cell_table
    from gae_core.labels import format_value

    page = app_page
    open_page(page, app_server, "compare")
    page.locator(".st-key-cmp-grid .js-plotly-plot").wait_for(timeout=60_000)
    wait_idle(page)
    drawn = page.evaluate(HEATMAP_JS)
    store = store_of(app_server)
    runs = store.list_runs(sweep_id=grid_sweep.sweep_id)
    episodes = compare.episodes_frame(store, [r.id for r in runs], "lambda_", also=("gamma",))
    threshold = runs[0].summary.reward_threshold
    expected = cell_table(episodes, "lambda_", "gamma", threshold=threshold)
    assert drawn["x"] == [format_value(v) for v in (0.8, 0.9, 0.96, 0.99, 1.0)]
    assert drawn["y"] == [format_value(v) for v in (0.96, 0.98, 0.99, 0.995)]
    z = np.array(drawn["z"])
    for row in expected.itertuples():
        i = [0.96, 0.98, 0.99, 0.995].index(row.gamma)
        j = [0.8, 0.9, 0.96, 0.99, 1.0].index(row.lambda_)
        assert z[i, j] == pytest.approx(row.iqm, rel=1e-6)
    # the CSV holds the cells drawn, as the store gives them
    name, frame = download_csv(page, page.locator(".st-key-cmp-grid_csv button"))
    assert name == f"sweep-{grid_sweep.sweep_id}_grid.csv" and len(frame) == 20
    order = ["gamma", "lambda_"]
    np.testing.assert_allclose(
        frame.sort_values(order)["iqm"], expected.sort_values(order)["iqm"], rtol=1e-9
    )
    # a click on the score redraws the heat map (AUC, final return, AUC) with two runs
    # training: time each, record the median
    timings = []
    with two_runs_training(app_server):
        for score in ("AUC", "final return", "AUC"):
            before = page.evaluate(HEATMAP_JS)["title"]
            button = page.locator(".st-key-cmp-grid_score").get_by_text(score, exact=True)
            start = time.monotonic()
            button.click()
            page.wait_for_function(
                f"() => {{ const d = ({HEATMAP_JS})(); return d && d.title !== "
                f"{json.dumps(before)}; }}", polling=20, timeout=30_000,
            )  # fmt: skip
            timings.append(round(time.monotonic() - start, 2))
            wait_idle(page)
    TIMINGS["compare_heatmap_click_to_redraw_two_runs_training_s"] = sorted(timings)[1]
    TIMINGS["compare_heatmap_click_to_redraw_each_s"] = timings
    assert "AUC" in page.evaluate(HEATMAP_JS)["title"]
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot(page, "compare_grid")


# A value no label column may hold: a Python object's repr (the lab's critic column once read
# "<function label at 0x7ff8…>").
OBJECT_REPR = re.compile(r"<[^>]* at 0x[0-9a-f]+>")


def says_what_it_holds(frame: pd.DataFrame, **made_by) -> None:
    """``frame`` (a downloaded CSV) names what made it in its own columns, and no text column
    holds an object's repr instead of a label."""
    for column, value in made_by.items():
        assert column in frame, (column, list(frame.columns)[:12])
        assert set(frame[column].astype(str)) == {str(value)}, (column, set(frame[column]))
    for column in [c for c in frame if pd.api.types.is_string_dtype(frame[c])]:
        bad = frame[column].astype(str).str.contains(OBJECT_REPR)
        assert not bad.any(), (column, frame[column][bad].iloc[0])


def test_a_new_users_journey_keeps_its_context_and_every_csv_says_what_it_holds(
    app_page, app_server
):
    """One task end to end, as a new user does it: train CartPole (a double-click on Start
    starts one run), explore it from the Train page's link, measure its checkpoint in the lab
    from the explorer, launch a λ sweep (a double-click on Launch launches one) and compare it,
    then train a MuJoCo env. Every page opens on what it was sent from; every CSV on the way
    names its run (or sweep) and settings and its label columns hold labels; no text on any of
    these pages is cut off at 1400 × 900."""
    page, store = app_page, store_of(app_server)
    cut: dict[str, list] = {}

    def look_for_cut_text(where: str) -> None:
        page.wait_for_timeout(300)
        if found := page.evaluate(CUT_OFF_JS):
            cut[where] = found

    def no_exception() -> None:
        assert page.locator('[data-testid="stException"]').count() == 0

    # Train, double-clicking Start
    open_page(page, app_server, "train")
    known = {r.id for r in store.list_runs()}
    set_number(page, "train-total_steps", 3000)  # a checkpoint at its end
    page.locator(".st-key-train-start button").dblclick()
    assert wait_until(lambda: len(store.list_runs()) > len(known), 15)
    page.wait_for_timeout(2_000)  # a second run would be stored by now
    (run_id,) = {r.id for r in store.list_runs()} - known
    assert wait_until(lambda: store.get_run(run_id).status == "finished", 120)
    wait_for_finished_line(page, app_server)
    wait_idle(page)
    expect(page, f"the Train page's URL holds run={run_id}").to_have_url(
        holds(f"run={run_id}"), timeout=30_000
    )
    config = store.get_run(run_id).config
    _, frame = download_csv(page, page.locator(".st-key-train-csv-episodic_return a"))
    says_what_it_holds(frame, run_id=run_id, lambda_=config["lambda_"], seed=config["seed"])
    look_for_cut_text("train")

    # Explore this run: the explorer opens on it
    page.get_by_role("link", name="Explore this run").click()
    page.wait_for_function("() => location.pathname.endsWith('/explorer')", timeout=30_000)
    page.locator(".st-key-ex-main .js-plotly-plot").wait_for(timeout=60_000)
    wait_idle(page)
    expect(page.locator(".st-key-ex-run input"), f"the explorer's run box: {run_id}").to_have_value(
        ends_with(run_id), timeout=30_000
    )
    policy = store.checkpoint_steps(run_id)[-1]
    for key in ("ex-csv", "ex-heat_csv", "ex-weights_csv"):
        _, frame = download_csv(page, page.locator(f".st-key-{key} button"))
        says_what_it_holds(frame, run_id=run_id, policy_step=policy, gamma=config["gamma"])
    look_for_cut_text("explorer")
    no_exception()

    # Measure this checkpoint: the lab opens on the run and checkpoint
    page.get_by_role("button", name="Measure this checkpoint in the Estimator lab").click()
    page.wait_for_function("() => location.pathname.endsWith('/lab')", timeout=30_000)
    page.locator(".st-key-lab-start button").wait_for(timeout=30_000)
    wait_idle(page)
    for part in (f"run={run_id}", f"policy={policy}"):
        expect(page, f"the lab's URL holds {part}").to_have_url(holds(part), timeout=30_000)
    expect(page.locator(".st-key-lab-run input"), f"the lab's run box: {run_id}").to_have_value(
        ends_with(run_id), timeout=30_000
    )
    expect(
        page.locator(".st-key-lab-policy input"), f"the lab's policy box: {policy:,}"
    ).to_have_value(f"{policy:,}", timeout=30_000)
    for key, value in {"states": 4, "rollouts": 4, "k": 4, "segment": 20}.items():
        set_number(page, f"lab-{key}", value)
    page.locator(".st-key-lab-start button").click()
    page.locator(".st-key-lab-result-gae_csv button").wait_for(timeout=180_000)
    wait_idle(page)
    page.get_by_text(re.compile(r"Least MSE at λ = [0-9.]+:")).first.wait_for()
    for key in ("gae_csv", "k_csv", "one_csv", "ps", "st"):
        _, frame = download_csv(page, page.locator(f".st-key-lab-result-{key} button"))
        says_what_it_holds(frame, run_id=run_id, policy_step=policy)
        if "critic" in frame:  # every critic's rows, each named by its label
            assert frame["critic"].astype(str).str.fullmatch(r"critic [0-9,]+").all()
    look_for_cut_text("lab")
    no_exception()

    # A λ sweep, double-clicking Launch, then compared
    open_page(page, app_server, "compare")
    sweeps = {s.id for s in store.list_sweeps()}
    page.locator(".st-key-cmp-view").get_by_text("Launch a sweep", exact=True).click()
    field = page.locator(".st-key-cmp-lambdas input")
    field.fill("0.5, 1")
    field.press("Enter")
    wait_idle(page)
    for key, value in {"seeds": 2, "workers": 2, "total_steps": 1500}.items():
        set_number(page, f"cmp-{key}", value)
    page.locator(".st-key-cmp-launch button").dblclick()
    assert wait_until(lambda: len({s.id for s in store.list_sweeps()} - sweeps) >= 1, 30)
    page.wait_for_timeout(2_000)
    (sweep_id,) = {s.id for s in store.list_sweeps()} - sweeps
    assert wait_until(lambda: store.get_sweep(sweep_id).status == "finished", 180)
    page.locator(".st-key-cmp-go_compare button").click(timeout=60_000)
    page.locator(".st-key-cmp-curves .js-plotly-plot").wait_for(timeout=60_000)
    wait_idle(page)
    expect(page, f"the Compare page's URL holds sweep={sweep_id}").to_have_url(
        holds(f"sweep={sweep_id}"), timeout=30_000
    )
    for key in ("curves_csv", "bands_csv", "summary_csv"):
        _, frame = download_csv(page, page.locator(f".st-key-cmp-{key} button"))
        says_what_it_holds(frame, sweep_id=sweep_id)
    look_for_cut_text("compare")
    no_exception()

    # A MuJoCo env from the same form
    open_page(page, app_server, "train")
    wait_idle(page)
    env_box = page.locator(".st-key-train-env_id input")
    env_box.click()  # the selectbox filters what is typed; Enter takes the one left
    env_box.fill("InvertedPendulum-v5")
    page.get_by_role("option", name="InvertedPendulum-v5", exact=True).wait_for()
    env_box.press("Enter")
    page.wait_for_function(
        "(sel) => document.querySelector(sel).value === 'InvertedPendulum-v5'",
        arg=".st-key-train-env_id input",
    )
    # the env's preset has loaded (its budget replaced the 3,000 typed above) before a budget
    # is typed: typed sooner, the preset's rerun could land after it and write its own back
    budget = str(preset_values("InvertedPendulum-v5")["total_steps"])
    expect(page.locator(".st-key-train-total_steps input"), "the preset's budget").to_have_value(
        budget, timeout=30_000
    )
    wait_idle(page)
    set_number(page, "train-total_steps", 2000)
    known = {r.id for r in store.list_runs()}
    page.locator(".st-key-train-start button").click()
    assert wait_until(lambda: len(store.list_runs()) > len(known), 15)
    (mujoco,) = {r.id for r in store.list_runs()} - known
    assert store.get_run(mujoco).config["env_id"] == "InvertedPendulum-v5"
    assert wait_until(lambda: store.get_run(mujoco).status == "finished", 120)
    wait_for_finished_line(page, app_server)
    look_for_cut_text("train (MuJoCo)")
    no_exception()
    assert cut == {}


@pytest.fixture(scope="module")
def other_recorded_run(app_server):
    """A second recorded run whose checkpoints and γ differ from ``recorded_run``'s."""
    manager = RunManager(RunStore(app_server.data_dir, recover=False))
    run_id = manager.start({**TINY, "total_steps": 900, "checkpoint_every": 300, "gamma": 0.9})
    assert manager.wait(run_id, 120)
    manager.shutdown(timeout=10)
    return run_id


def test_explorer_boxes_show_the_picked_runs_own_checkpoints_and_gamma(
    app_page, app_server, recorded_run, other_recorded_run
):
    """After another run is picked, the checkpoint boxes and γ show that run's own values, as
    the chart uses them (the browser keeps a keyed widget's value by its key: the boxes used to
    show the previous run's checkpoints and γ, and the γ stepper stepped from the stale one)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    store = store_of(app_server)
    page = app_page
    open_page(page, app_server, f"explorer?run={recorded_run}")
    page.locator(".st-key-ex-main .js-plotly-plot").wait_for()
    wait_idle(page)
    for run_id in (other_recorded_run, recorded_run, other_recorded_run):
        choose_run(page, run_id, key="ex-run")
        wait_idle(page)
        last = f"{store.checkpoint_steps(run_id)[-1]:,}"
        gamma = store.get_run(run_id).config["gamma"]
        for box in ("policy", "critic"):
            page.wait_for_function(
                "([sel, v]) => document.querySelector(sel).value == v",
                arg=[f".st-key-ex-{box} input", last], timeout=10_000,
            )  # fmt: skip
        # γ's box comes later in the script than the checkpoints (after the trajectory is
        # loaded), so its value can arrive in a later message of the same rerun: wait for it too
        try:
            page.wait_for_function(
                "([sel, v]) => Math.abs(parseFloat(document.querySelector(sel).value) - v) < 1e-6",
                arg=[".st-key-ex-gamma input", gamma], timeout=10_000,
            )  # fmt: skip
        except PlaywrightTimeout:
            pass  # the assertion below names the value shown
        shown = page.locator(".st-key-ex-gamma input").input_value()
        assert float(shown) == pytest.approx(gamma), (run_id, shown)
