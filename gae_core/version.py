"""The package's version, its one owner (``gae_core.__version__`` reads it here; a test keeps
pyproject's copy equal), and where code came from: :func:`source_version` (the checkout on
disk now: what a run stores when it is created, since its worker imports the code then) and
:func:`loaded_version` (what this process imported: what a comparison's statistics were
computed with)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gae_core.env_modules import named_modules

__version__ = "0.2.0"

#: The source tree whose uncommitted changes would change what is computed.
_SOURCE = ("gae_core", "pages", "app.py", "dashboard.py")
#: How long an answer of :func:`source_version` is reused (a sweep creates its runs at once).
_REUSE_S = 10.0
_cache: dict[str, Any] = {}
_lock = threading.Lock()


def source_version() -> dict[str, Any]:
    """``{"package", "version", "commit", "local_changes", "env_modules"}``: gae_core's version,
    the git commit of its checkout and whether that checkout's code (the package, the pages, the
    app) has changes not committed, untracked files included (both None where it does not run
    from a git checkout or git cannot tell), and the env modules named for this process
    (:mod:`gae_core.env_modules`). Two git commands (tens of ms), reused for 10 s: a running
    dashboard may run code edited since it started."""
    with _lock:
        if _cache and time.monotonic() - _cache["at"] < _REUSE_S:
            return {**_cache["answer"], "env_modules": list(named_modules())}
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
        return {**answer, "env_modules": list(named_modules())}


def _git(git: str, root: Path, *args: str) -> str:
    done = subprocess.run(
        [git, *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()


#: :func:`source_version` when this process imported gae_core (``gae_core/__init__`` imports
#: this module): modules load once per process, so a dashboard started before a
#: commit keeps computing with the code it loaded then.
LOADED = source_version()


def loaded_version() -> dict[str, Any]:
    """The code this process computes with: :data:`LOADED`, plus ``checkout_changed``, whether
    the checkout on disk has moved on since (another commit, or uncommitted changes appearing or
    going away; None where git cannot tell): then a restart computes with what is there."""
    now = source_version()
    changed = None
    if LOADED["commit"] is not None and now["commit"] is not None:
        changed = (now["commit"], now["local_changes"]) != (
            LOADED["commit"], LOADED["local_changes"])  # fmt: skip
    return {**LOADED, "checkout_changed": changed}
