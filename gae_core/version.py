"""The package's version, its one owner (``gae_core.__version__`` reads it here; a test keeps
pyproject's copy equal), and where the running code came from (:func:`source_version`: what a
run stores when it is created, and what a comparison's provenance names)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

__version__ = "0.2.0"

#: The source tree whose uncommitted changes would change what is computed.
_SOURCE = ("gae_core", "pages", "app.py", "dashboard.py")
#: How long an answer of :func:`source_version` is reused (a sweep creates its runs at once).
_REUSE_S = 10.0
_cache: dict[str, Any] = {}
_lock = threading.Lock()


def source_version() -> dict[str, Any]:
    """``{"package", "version", "commit", "local_changes"}``: gae_core's version, the git commit
    of its checkout and whether that checkout's code (the package, the pages, the app) has
    changes not committed, untracked files included; both None where it does not run from a
    git checkout or git cannot tell. Two git commands (tens of ms), reused for 10 s: a running
    dashboard may run code edited since it started."""
    with _lock:
        if _cache and time.monotonic() - _cache["at"] < _REUSE_S:
            return dict(_cache["answer"])
        root = Path(__file__).resolve().parents[1]
        commit = changed = None
        git = shutil.which("git")
        if git is not None and (root / ".git").exists():
            try:
                commit = _git(git, root, "rev-parse", "HEAD") or None
                if commit is not None:
                    changed = bool(_git(git, root, "status", "--porcelain", "--", *_SOURCE))
            except (OSError, subprocess.SubprocessError):
                commit = changed = None
        answer = {"package": "gae_core", "version": __version__, "commit": commit,
                  "local_changes": changed}  # fmt: skip
        _cache.update(at=time.monotonic(), answer=answer)
        return dict(answer)


def _git(git: str, root: Path, *args: str) -> str:
    done = subprocess.run(
        [git, *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()
