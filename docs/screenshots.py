"""Screenshots of the λ comparison and the estimator lab on a real study, for the README.

The browser tests take the other screenshots on the tiny runs they train themselves; these
pages only say something on a real study, so this script points the app at a data folder that
holds one (the README's "Reproducing the figures" section has the commands that made it) and
captures, in a tall window so each page fits in one image:

- ``compare_<N>seeds.png`` for each sweep in the store (N: its seeds per λ);
- with ``--lab-run``: ``lab.png``, the lab's newest stored measurement of that run, and
  ``lab_chain.png``, the lab's exact-chain mode with its defaults.

Usage: ``python docs/screenshots.py --data-dir DIR [--lab-run RUN_ID] [--out docs/screenshots]``.
Needs Debian's Chromium and Playwright's Python package (as the browser tests do).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gae_core.storage.store import RunStore  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
READY = '[data-test-script-state="notRunning"]'


def _serve(data_dir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
               "--server.port", str(port), "--server.fileWatcherType", "none",
               "--browser.gatherUsageStats", "false"]  # fmt: skip
    env = {**os.environ, "GAE_CORE_DATA": str(data_dir)}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://localhost:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as answer:
                if answer.read().decode().strip() == "ok":
                    return process, url
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit(f"the app did not answer on {url}")


def _settle(page) -> None:
    page.wait_for_selector(READY, timeout=120_000)
    page.wait_for_timeout(1500)  # Plotly draws after the script ends
    page.wait_for_selector(READY, timeout=120_000)


def _pick(page, key: str, text: str) -> None:
    """Choose the option containing ``text`` in the selectbox keyed ``key``."""
    field = page.locator(f".st-key-{key} input")
    field.click()
    field.press_sequentially(text[:24])  # long lists are virtual: filter, then pick
    page.get_by_role("option").filter(has_text=text).first.click()
    _settle(page)


def _shot(page, path: Path) -> None:
    page.locator("h1").first.click()  # no focus ring on the last field picked
    page.mouse.move(5, 5)
    page.wait_for_timeout(300)
    page.screenshot(path=str(path))
    print(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--lab-run", help="run whose stored lab result to show (none: no lab)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with RunStore(args.data_dir, read_only=True) as store:
        sweeps = store.list_sweeps()
        seeds = {s.id: len(set(s.grid.get("seed", [0]))) for s in sweeps}

    from playwright.sync_api import sync_playwright

    process, url = _serve(args.data_dir)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            for sweep in sweeps:
                page.goto(f"{url}/compare")
                _settle(page)
                _pick(page, "cmp-sweep_pick", sweep.name)
                _shot(page, args.out / f"compare_{seeds[sweep.id]}seeds.png")
            if args.lab_run is None:
                browser.close()
                return
            page.set_viewport_size({"width": 1400, "height": 2600})
            page.goto(f"{url}/lab")
            _settle(page)
            _pick(page, "lab-run", args.lab_run)
            _shot(page, args.out / "lab.png")
            page.set_viewport_size({"width": 1400, "height": 1400})
            page.locator(".st-key-lab-mode").get_by_text("the exact chain").click()
            _settle(page)
            _shot(page, args.out / "lab_chain.png")
            browser.close()
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
