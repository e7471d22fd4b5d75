"""Run a benchmark on the code of another git revision, side by side with today's: a detached
worktree of that revision in a temporary folder, the same script run there, its output
returned. Used by the scripts' ``--baseline REV`` option (``bench_study.py``), so "no slower
than the commit before" is measured in one script run on one machine, never quoted from
another sitting."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["run_at"]


def run_at(revision: str, script: str, args: list[str]) -> str:
    """``python SCRIPT ARGS`` in a worktree of ``revision``; its stdout (stderr on failure)."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree),
                        revision], check=True)  # fmt: skip
        try:
            done = subprocess.run([sys.executable, str(tree / script), *args], cwd=tree,
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{script} at {revision} failed:\n{done.stderr[-3000:]}")
            return done.stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)  # fmt: skip
