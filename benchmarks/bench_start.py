"""How fast a dashboard run starts and stops, through the run manager the dashboard uses
(``RunManager(store, processes=True)`` with its warm spare), optionally beside another git
revision's code in the same script run.

    python benchmarks/bench_start.py [--repeats 5] [--baseline REV]

For each repeat (CartPole's A2C preset, a budget it never reaches): Start → the run is claimed,
→ its first metric row is stored, → its first episodic return is stored; then Stop → the run is
``stopped`` in the store. Between repeats the script waits until the next spare worker has had
time to warm up (as a user's next click would). Prints each median; with ``--baseline REV`` the
same measurement on revision REV's code (a detached worktree, ``benchmarks/baseline.py``) and
the ratio today / baseline for each (target: ≤ 1.10, "no worse" within noise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 1.10
POLL_S = 0.005
#: How long the script waits after each Start before the next (the spare starts 3 s after a
#: Start and imports torch in about 2 s).
SETTLE_S = 8.0


def _until(predicate, timeout: float = 60.0) -> float:
    """Seconds until ``predicate()`` holds (polled every 5 ms)."""
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("the run did not get there within 60 s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def _cycle(manager, store, config, rows: dict[str, list[float]]) -> None:
    """One Start, the waits, one Stop."""
    from gae_core import metrics as M

    started = time.perf_counter()
    run = manager.start(config)
    _until(lambda: store.get_run(run).status == "running")
    rows["claimed"].append(time.perf_counter() - started)
    _until(lambda: len(store.metrics(run)) > 0)
    rows["first_metric"].append(time.perf_counter() - started)
    _until(lambda: len(store.metrics(run, [M.EPISODIC_RETURN.key])) > 0)
    rows["first_return"].append(time.perf_counter() - started)
    time.sleep(1.0)
    stopping = time.perf_counter()
    manager.stop(run)
    _until(lambda: store.get_run(run).status == "stopped")
    rows["stop"].append(time.perf_counter() - stopping)


def measure(repeats: int) -> dict[str, float]:
    """Medians over ``repeats`` Start/Stop cycles with the code this process imports."""
    from gae_core.agent.presets import preset_config
    from gae_core.runs.manager import RunManager
    from gae_core.storage.store import RunStore

    config = dataclasses.replace(preset_config("CartPole-v1"), total_steps=10**8)
    rows: dict[str, list[float]] = {"claimed": [], "first_metric": [], "first_return": [],
                                    "stop": []}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        store = RunStore(folder)
        manager = RunManager(store, processes=True)
        manager.warm_up()
        time.sleep(SETTLE_S)
        for _ in range(repeats):
            _cycle(manager, store, config, rows)
            time.sleep(SETTLE_S)
        manager.shutdown()
        store.close()
    return {name: statistics.median(values) for name, values in rows.items()}


def _at_revision(revision: str, repeats: int) -> dict[str, float]:
    """:func:`measure` on revision ``revision``'s package: this script, run in a worktree of it."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(tree),
                        revision], check=True)  # fmt: skip
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--repeats", str(repeats), "--tree", str(tree),
                 "--json"], capture_output=True, text=True, check=True, cwd=tree,
            )  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", metavar="REV", help="also measure git revision REV's code")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the package to import (a worktree)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, args.tree or str(Path(__file__).resolve().parents[1]))
    if args.json:
        print(json.dumps(measure(args.repeats)))
        return 0
    baseline = _at_revision(args.baseline, args.repeats) if args.baseline else {}
    today = measure(args.repeats)
    failed = False
    for name, value in today.items():
        line = f"{name:>13}: {value:.3f} s (median of {args.repeats})"
        if name in baseline:
            ratio = value / baseline[name]
            ok = ratio <= TARGET_RATIO
            failed |= not ok
            verdict = "PASS" if ok else "FAIL"
            line += (f"; baseline {args.baseline} {baseline[name]:.3f} s; today/baseline "
                     f"{ratio:.4f} (target ≤ {TARGET_RATIO:.2f}: {verdict})")  # fmt: skip
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
