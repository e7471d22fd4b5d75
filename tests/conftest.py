"""Shared fixtures and helpers; no test module imports another.

* ``data_dir`` and :func:`app`: an empty store per AppTest and the app at a page.
* :func:`wait_until`: poll a condition with a deadline; :func:`set_field`: type into a form field;
  :func:`said`: what the page's errors read as.
* :func:`cli` and :data:`TINY_FLAGS`: the CLI as a subprocess, and a run it trains in a second.
* :func:`trajectory_steps`: what the store file holds, for tests that check what was removed.
* :func:`stored_update_metric`: the rows a run stores of one update metric, worked out from its
  updates independently of the code that writes them (``log_every`` windows).
* The browser fixtures (docs/DESIGN.md, "Testing in a real browser"): Debian's Chromium driven by
  Playwright, and one Streamlit server per session on a free port with an empty data folder.
  Without Chromium or Playwright the browser tests skip, except under ``CI=true`` where they
  fail: CI must run them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Files whose tests share one server, cluster or store through session and module fixtures and
#: build on each other's runs: each such family runs in one xdist worker, in file order.
SERIAL_FAMILIES = {"test_browser": "browser", "test_browser_traffic": "traffic",
                   "test_ray": "ray", "test_ray_address": "ray"}  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups for pytest-xdist's ``--dist loadgroup`` (pyproject's ``addopts``): the
    :data:`SERIAL_FAMILIES` stay together (two local Ray clusters would also compete for the
    same two cores); every other test goes to whichever worker is free."""
    for item in items:
        family = SERIAL_FAMILIES.get(item.path.stem)
        if family is not None:
            item.add_marker(pytest.mark.xdist_group(family))


#: A run that trains in about a second: the pages' AppTests and the browser tests use it.
TINY = {"total_steps": 600, "num_envs": 2, "rollout_steps": 8, "checkpoint_every": 0}
#: The CLI flags of a small, fast run (the CLI subprocess tests add --total-steps).
TINY_FLAGS = ["--num-envs", "4", "--rollout-steps", "16", "--hidden-sizes", "16"]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 900}
#: the app's root element once its script has run and the websocket is up
APP_READY = (
    '[data-testid="stApp"][data-test-script-state="notRunning"]'
    '[data-test-connection-state="CONNECTED"]'
)


def _missing_browser() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "the playwright Python package is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (apt-get install chromium; never `playwright install`)"
    return None


@pytest.fixture(scope="session")
def chromium_browser():
    """Headless Debian Chromium; skips without it, fails under CI=true."""
    problem = _missing_browser()
    if problem:
        message = f"browser tests need Chromium and Playwright: {problem}"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@dataclass
class AppServer:
    url: str
    data_dir: Path
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class _PortTaken(RuntimeError):
    """The free port was bound by another process before this server bound it."""


def _wait_healthy(server: AppServer, timeout: float) -> None:
    """Until the server answers ``ok`` on /_stcore/health and its own log names its URL (a
    health check alone could be answered by another test worker's server that took the port
    between ``_free_port`` and this server's bind)."""
    deadline = time.monotonic() + timeout
    port = server.url.rsplit(":", 1)[1]
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log_tail()
            if any(
                f"Port {port} is {words}" in tail for words in ("not available", "already in use")
            ):
                raise _PortTaken(tail)
            raise RuntimeError(f"streamlit exited early:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=2) as answer:
                if answer.read().decode().strip() == "ok" and f":{port}" in server.log_tail():
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no 'ok' from {server.url}/_stcore/health in {timeout} s")


def _stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()  # SIGTERM to this PID; streamlit shuts down cleanly
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


@contextmanager
def running_app(data_dir: Path, log_path: Path, *, timeout: float = 60.0):
    """``streamlit run app.py`` on a free port, repo root as cwd, ``GAE_CORE_DATA=data_dir``;
    yields once /_stcore/health says ok; stops the server by its PID on exit. A port taken by
    another process before the server bound it is replaced by another (three tries)."""
    for attempt in range(3):
        try:
            server = _start_app(data_dir, log_path, timeout)
            break
        except _PortTaken:
            if attempt == 2:
                raise
    try:
        yield server
    finally:
        _stop(server.process)


def _start_app(data_dir: Path, log_path: Path, timeout: float) -> AppServer:
    port = _free_port()
    env = {**os.environ, "GAE_CORE_DATA": str(data_dir), "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
        "--server.port", str(port), "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = AppServer(f"http://localhost:{port}", Path(data_dir), process, Path(log_path))
    try:
        _wait_healthy(server, timeout)
    except BaseException:
        _stop(process)
        raise
    return server


@pytest.fixture(scope="session")
def app_server(chromium_browser, tmp_path_factory):
    """The session's app server on an empty data folder, ready once /_stcore/health says ok
    and the home page's script has run (``data-test-script-state`` is ``notRunning``)."""
    data_dir = tmp_path_factory.mktemp("gae_core_data")
    log_path = tmp_path_factory.mktemp("streamlit_log") / "server.log"
    with running_app(data_dir, log_path) as server:
        context = chromium_browser.new_context(viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.goto(server.url)
            page.wait_for_selector(APP_READY, timeout=60_000)
        finally:
            context.close()
        yield server


@pytest.fixture
def fresh_app_server(chromium_browser, tmp_path):
    """A server of its own that no browser has opened yet (for first-request behaviour)."""
    (tmp_path / "data").mkdir()
    with running_app(tmp_path / "data", tmp_path / "server.log") as server:
        yield server


@pytest.fixture
def app_page(chromium_browser, app_server):
    """A fresh browser context (1400x900, downloads accepted) per test."""
    context = chromium_browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(30_000)
    page = context.new_page()
    yield page
    context.close()


# Point count of the first trace of the Plotly chart titled `title` (-1 while there is none):
# what the browser tests wait on for a chart's first points.
POINTS_JS = """(title) => {
  for (const g of document.querySelectorAll('.js-plotly-plot')) {
    const t = g._fullLayout && g._fullLayout.title;
    const text = String((t && (t.text ?? t)) || '').replace(/<[^>]+>/g, '');
    if (text === title && g._fullData && g._fullData.length) return g._fullData[0]._length;
  }
  return -1;
}"""


def write_measurements(path: Path, measured: dict) -> None:
    """What a browser test module measured, with the machine it ran on, as JSON at ``path``
    (beside the screenshots), and printed."""
    import json
    import platform

    measured["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "platform": platform.platform()}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured, indent=2, ensure_ascii=False) + "\n")
    print(f"\n{path}:\n{json.dumps(measured, indent=2)}")


# ----------------------------------------------------------------------------- helpers


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def cli_env(**extra: str) -> dict[str, str]:
    """A CLI subprocess's environment: this checkout importable, no ``GAE_CORE_DATA``, plus
    ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("GAE_CORE_DATA", None)
    env.update(extra)
    return env


def cli(data: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """``python -m gae_core --data-dir DATA ARGS…`` run in DATA's parent folder; ``env`` adds
    environment variables."""
    return subprocess.run(
        [sys.executable, "-m", "gae_core", "--data-dir", str(data), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(data).parent,
        env=cli_env(**env),
    )


def cli_in_process(data: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI's ``main`` in this process (for argument errors, which exit before anything
    heavy starts: 0.01 s where a subprocess costs a second or two of imports)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from gae_core.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["--data-dir", str(data), *args])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def stored_update_metric(
    updates: list[tuple[int, float | None]], every: int, also: int = 0
) -> list[tuple[int, float]]:
    """``(env_step, value)`` rows of an update metric whose updates, in order, ended at the
    given env steps with the given values (None: the update did not report it, as one without
    a step reports no loss): a row (the mean of the values since the last row, at the step of
    the last update) at each update that crossed a multiple of ``every`` (each update for 0)
    or of ``also`` (a checkpoint's), if any was reported, and one for any left at the end."""
    rows, window, before = [], [], 0
    for step, value in updates:
        if value is not None:
            window.append(value)
        crossed = every == 0 or any(
            before < m <= step
            for period in (every, also) if period
            for m in range(period, step + 1, period)
        )  # fmt: skip
        if crossed and window:
            rows.append((step, sum(window) / len(window)))
            window = []
        before = step
    if window:
        rows.append((updates[-1][0], sum(window) / len(window)))
    return rows


class StoreSink:
    """A run sink that applies every report to a store at once, in the caller's thread: the
    run loop (``execute_run``) trained synchronously in a test, through ``sinks.apply`` as the
    coordinator would."""

    def __init__(self, store, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def claim(self) -> bool:
        return self.store.claim_run(self.run_id)

    def flush(self, rows, env_steps: int, summary) -> bool:
        from gae_core.runs.sinks import Report, apply

        return apply(self.store, self.run_id, Report.flush(0, rows, env_steps, summary))

    def checkpoint(self, env_step: int, blob: bytes, trajectories) -> None:
        from gae_core.runs.sinks import Report, apply

        apply(self.store, self.run_id, Report.checkpoint(0, env_step, blob, trajectories))

    def finish(self, status: str, error: str | None) -> None:
        from gae_core.runs.sinks import Report, apply

        apply(self.store, self.run_id, Report.finish(0, status, error))


def stored_and_stepped(tmp_path, config) -> tuple:
    """``(store, run_id, updates)``: the run of ``config`` trained into a fresh store in
    ``tmp_path`` (``execute_run``), and the ``(env_steps, metrics)`` of each update of the same
    config trained again in a Trainer (deterministic per seed), to compute the stored rows
    from."""
    from gae_core.agent.trainer import Trainer
    from gae_core.runs.execute import execute_run
    from gae_core.storage.store import RunStore

    store = RunStore(tmp_path)
    run_id = store.create_run(config.to_dict())
    (outcome,) = execute_run([StoreSink(store, run_id)], [run_id], [config], [threading.Event()])
    assert outcome.status == "finished"
    trainer = Trainer(config)
    updates = []
    try:
        while not trainer.done:
            result = trainer.step()[0]
            updates.append((result.env_steps, result.metrics))
    finally:
        trainer.close()
    return store, run_id, updates


def runs_of_three_widths(store) -> list[str]:
    """Runs whose hidden_sizes differ (a list field), two seeds each, the widest first, each
    with five episodes of return width + seed: grouping by a list without training."""
    from gae_core import metrics as M
    from gae_core.agent.config import TrainConfig

    ids = []
    for sizes in ([128, 128], [16, 16], [64, 64]):
        for seed in (0, 1):
            run_id = store.create_run(TrainConfig(seed=seed, hidden_sizes=tuple(sizes)).to_dict())
            rows = [(M.EPISODIC_RETURN.key, 10 * k, 0.0, float(sizes[0] + seed)) for k in range(5)]
            store.flush(run_id, rows, env_steps=50)
            ids.append(run_id)
    return ids


def trajectory_steps(store, run_id: str) -> list[int]:
    """The env steps at which the store's file holds trajectories of the run (read with SQL: the
    library has no use for this list)."""
    with contextlib.closing(sqlite3.connect(store.path)) as raw:
        rows = raw.execute(
            "SELECT DISTINCT env_step FROM trajectories WHERE run_id = ? ORDER BY env_step",
            (run_id,),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture(autouse=True)
def _default_store_outside_the_checkout(monkeypatch, tmp_path_factory):
    """Every test's default store (``GAE_CORE_DATA``) is a fresh temporary folder, never
    ``./runs`` in the checkout, where a page or a command a test runs without a folder of its
    own would otherwise leave one; a test that needs its own sets or removes it."""
    monkeypatch.setenv("GAE_CORE_DATA", str(tmp_path_factory.mktemp("default-store")))


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty store per test, and a fresh process-wide manager (cache_resource is global)."""
    import streamlit as st

    from pages import _ui

    monkeypatch.setenv("GAE_CORE_DATA", str(tmp_path))
    st.cache_resource.clear()
    yield tmp_path
    _ui.manager().shutdown(timeout=10)
    st.cache_resource.clear()


def said_plain(text: str) -> str:
    """Markdown text as the page shows it: its escapes (and the word joiners that keep a
    link-like text from being linked) taken off."""
    return re.sub(r"\\(.)", r"\1", text).replace("\u2060", "")


def app(page: str | None = None):
    """The app (``app.py``) run once under AppTest, switched to ``page`` if given."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file("../dashboard.py", default_timeout=60).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


@contextlib.contextmanager
def read_only_folder(folder: Path):
    """Make ``folder`` refuse new files, also for root: chattr +i where we are root (root
    ignores permission bits), chmod otherwise."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            message = f"cannot make {folder} immutable: {done.stderr.strip()}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


class FullOnCommit:
    """A connection whose COMMIT fails as SQLite's does when the disk is full (the write-ahead
    log cannot grow): the transaction is left open, nothing is written."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args):
        if sql.strip().upper() == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def set_field(at, key: str, value):
    """Type ``value`` into the form's field ``key`` (``train.seed``, ``cmp.workers``) and return
    the widget (``.run()`` it): an int field of the config form, and the sweep's seeds per λ,
    first seed and workers, is a text box that takes the value as text; other numbers are number
    boxes."""
    from gae_core.agent.config import FIELD_SPECS

    name = key.split(".", 1)[1]
    spec = FIELD_SPECS.get(name)
    if name in ("first_seed", "seeds", "workers") or (spec is not None and spec.kind == "int"):
        return at.text_input(key=key).set_value(str(value))
    return at.number_input(key=key).set_value(value)


def said(alerts) -> list[str]:
    """What a page's alerts (``at.error``) read as on the page: their markdown escapes (which
    keep typed text from acting as markdown) taken off."""
    return [re.sub(r"\\(.)", r"\1", alert.value) for alert in alerts]


def handing_to(handed: dict):
    """A stand-in for ``pages._ui.csv_button`` that keeps, by the file name it is saved under,
    the frame the button would hand out (provenance columns included)."""
    from gae_core.insight.exports import download_name, with_provenance

    def button(_label, frame, name, _key, made_by=None):
        handed[download_name(name, made_by)] = with_provenance(frame, **(made_by or {}))

    return button
