"""Who owns an active run or sweep, and whether that process still lives.

Every ``running`` (or ``queued``) run records its owner — host, pid and a process start token
(``/proc/<pid>/stat`` start time on Linux, so a recycled pid is not mistaken for the owner) — and
a heartbeat the writer refreshes on every flush. :meth:`RunStore.recover` marks runs whose owner
is gone as ``interrupted``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HEARTBEAT_STALE_S", "OWNER_COLUMNS", "Owner", "owner_alive"]

#: The columns of an active run or sweep that name its owner, in :meth:`Owner.row`'s order (and
#: :func:`owner_alive`'s).
OWNER_COLUMNS = "owner_host, owner_pid, owner_token, heartbeat_at"
#: A heartbeat older than this marks the owner dead when its pid cannot be checked (other host).
HEARTBEAT_STALE_S = 120.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_start_token(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    state, starttime = fields[0], fields[19]
    return None if state in ("Z", "X", "x") else starttime


_HAS_PROC = Path("/proc/self/stat").exists()


@dataclass(frozen=True)
class Owner:
    """Who owns an active run: host, pid and a token that tells this process from a later one
    that reuses the pid."""

    host: str
    pid: int
    token: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        start = _proc_start_token(pid) if _HAS_PROC else None
        token = f"{_boot_id()}:{start}" if start is not None else f"nostat:{uuid.uuid4().hex}"
        return cls(socket.gethostname(), pid, token)

    def row(self, heartbeat_at: float) -> tuple[str, int, str, float]:
        """The values of :data:`OWNER_COLUMNS` for this owner, its heartbeat at ``heartbeat_at``."""
        return self.host, self.pid, self.token, heartbeat_at


def owner_alive(
    host: str | None,
    pid: int | None,
    token: str | None,
    heartbeat_at: float | None,
    now: float | None = None,
) -> bool:
    """Whether the process that owns a run still lives.

    On this host with ``/proc``: the pid exists, is not a zombie and has the recorded start token.
    Elsewhere (another host sharing the folder, or no ``/proc``): the heartbeat is fresh.
    """
    now = time.time() if now is None else now
    if host is None or pid is None:
        return False
    if host == socket.gethostname() and _HAS_PROC and token and not token.startswith("nostat:"):
        boot, _, start = token.partition(":")
        if boot != _boot_id():
            return False  # the machine rebooted since
        return _proc_start_token(pid) == start
    if host == socket.gethostname() and os.name == "posix":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
    return heartbeat_at is not None and now - heartbeat_at < HEARTBEAT_STALE_S
