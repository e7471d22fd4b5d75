"""Whether a sweep can join the Ray cluster an address names (:func:`check_address`), checked in
bounded time before the sweep exists: ``ray.init`` retries a bad address for minutes, deaf to
SIGTERM, and refuses a client without a token the cluster wants after 20 s with a traceback.
Used by :func:`gae_core.runs.backends.backend_factory` and :class:`~gae_core.runs.ray_pool.RayPool`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import socket
import subprocess
import sys
import threading
import time

import ray

from gae_core.errors import ConfigError

__all__ = ["check_address"]

#: The address this process passed to ``ray.init`` → the GCS address that connection reported
#: (its own form of the same address; a later connection to another Ray does not match it).
_JOINED: dict[str, str] = {}
#: How long :func:`check_address` waits for a TCP connection (name lookup included), and for a
#: cluster's GCS to answer the probe a client makes first (which imports Ray: about 1 s).
_CONNECT_S = 3.0
_PROBE_S = 10.0
#: Addresses whose GCS answered the probe → when (the compare page checks on every rerun).
_ANSWERED: dict[tuple, float] = {}
_ANSWERED_S = 60.0
#: Ray's token authentication (Ray >= 2.60 turns it on for new clusters): a client sets
#: RAY_AUTH_MODE=token and finds the token in RAY_AUTH_TOKEN, or in the file RAY_AUTH_TOKEN_PATH
#: names (default ``~/.ray/auth_token``); ``ray.init`` with no address or ``auto`` turns it on
#: by itself when that token exists (``authentication_token_setup.py``).
_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
#: Run in a child process (a C++ call that cannot be interrupted, and a RAY_CHECK that aborts
#: when RAY_AUTH_MODE=token finds no token): what ``ray.init`` does first when it joins a
#: cluster, against ``argv[1]``; ``argv[2] == "found"`` for a local cluster found as ray.init
#: finds it (which turns token auth on when a token exists). Prints ok, auth-needed,
#: auth-missing, auth-refused, or skip (this Ray has none of these helpers: nothing is checked).
_PROBE = """
import sys
try:
    from ray._private.authentication.authentication_token_setup import (
        ensure_token_if_auth_enabled, maybe_enable_token_auth_if_token_available)
    from ray._raylet import AuthenticationMode, GcsClient, get_authentication_mode
    from ray.exceptions import AuthenticationError
except ImportError:
    print("skip")
    sys.exit()
if sys.argv[2] == "found":
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
try:
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
except AuthenticationError:
    print("auth-missing")
    sys.exit()
try:
    GcsClient(address=sys.argv[1])
except AuthenticationError:
    token = get_authentication_mode() == AuthenticationMode.TOKEN
    print("auth-refused" if token else "auth-needed")
else:
    print("ok")
"""
#: What the probe's token answers tell the user (``{where}``: the address and where it came from).
_AUTH_PROBLEMS = {
    "auth-needed": "the Ray cluster at {where} uses token authentication: set RAY_AUTH_MODE=token,"
    " with its token (the head node's ~/.ray/auth_token) in RAY_AUTH_TOKEN or in ~/.ray/auth_token"
    " (RAY_AUTH_TOKEN_PATH names another file)",
    "auth-missing": "RAY_AUTH_MODE=token, but no token to give the Ray cluster at {where}: set "
    "RAY_AUTH_TOKEN to its token (the head node's ~/.ray/auth_token), or put it in "
    "~/.ray/auth_token (RAY_AUTH_TOKEN_PATH names another file)",
    "auth-refused": "the Ray cluster at {where} refused this client's token: set RAY_AUTH_TOKEN "
    "(or RAY_AUTH_TOKEN_PATH, default ~/.ray/auth_token) to the cluster's token, its head node's "
    "~/.ray/auth_token",
}


def check_address(address: str | None) -> None:
    """Whether a sweep can join the Ray that ``address`` names, checked in bounded time (a few
    seconds) before a sweep exists: ``ConfigError`` (``address: …``, one line) otherwise.

    Connected already (one Ray per process): an address of another cluster must not quietly run
    the sweep on this one. The address is compared as Ray itself resolves it
    (``localhost:6379`` and ``127.0.0.1:6379`` are this node's IP, which the connection
    reports), and the address this process joined with is always accepted. A ``ray://`` client
    address cannot be compared with the connection's GCS address and counts as another unless
    it is the one joined with.

    Not connected: the address ``ray.init`` would join (:func:`_to_join`) must take a TCP
    connection within :data:`_CONNECT_S`, and a cluster's GCS must answer the probe ``ray.init``
    makes first, token authentication included, within :data:`_PROBE_S`. None with no cluster
    to join starts a local Ray: nothing to check."""
    if ray.is_initialized():
        if address is None or address == "auto":
            return
        current = ray.get_runtime_context().gcs_address
        if _JOINED.get(address) != current and _canonical(address) != _canonical(current):
            raise ConfigError(
                f"address: this process is already connected to the Ray at {current}; a sweep "
                f"on {address} needs a new process (or no address, to use the one it has)"
            )
        return
    target, origin, found = _to_join(address)
    if target is None or target == "local":
        return
    scheme, _, rest = target.rpartition("://")
    if scheme not in ("", "ray"):  # a client plugin's own scheme: Ray's to check
        return
    from_where = f" ({origin})" if origin else ""
    where = f"{target}{from_where}"
    host, port = _host_port(rest)
    if host is None:
        raise ConfigError(
            "address: expected HOST:PORT (head-node:6379), ray://HOST:PORT (a Ray Client "
            f"server, usually port 10001) or auto, got {target!r}{from_where}"
        )
    why = _unreachable(host, port)
    if why:
        hint = "is the cluster running (`ray start --head` on its head node)?"
        raise ConfigError(f"address: nothing answers at {where}: {why}; {hint}")
    if scheme:  # the Ray Client server: it answers over gRPC, which ray[client] brings
        if importlib.util.find_spec("grpc") is None:
            raise ConfigError(
                f"address: {where} is a Ray Client address, which needs ray[client] "
                "(pip install 'ray[client]'), or give the cluster's HOST:6379 instead"
            )
        return
    _probe(target, where, found=found)


def _to_join(address: str | None) -> tuple[str | None, str, bool]:
    """The address ``ray.init(address)`` would join (None: it starts a local Ray), where it came
    from ("" when given), and whether it was found on this machine (which makes ``ray.init``
    turn token auth on when a token exists). ``ConfigError`` for ``auto`` with nothing to
    join."""
    if address not in (None, "auto"):
        return address, "", False
    env = os.environ.get("RAY_ADDRESS", "")
    if env:  # ray.init's own first choice for None and auto
        return env, "from RAY_ADDRESS", False
    try:  # Ray's own lookup (private helpers; without them, ray.init decides)
        from ray._private.services import get_ray_address_from_environment
        from ray._private.utils import read_ray_address
    except ImportError:
        return None, "", False
    if address is None:  # the cluster `ray start` last started here, or none: a new local Ray
        return read_ray_address(), "the cluster `ray start` last started here", True
    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise ConfigError(
            "address: auto found no running Ray cluster on this machine (start one with `ray "
            "start --head`, set RAY_ADDRESS, or give the head node's HOST:PORT)"
        ) from None
    return found, "found by auto", True


def _host_port(address: str) -> tuple[str, int] | tuple[None, None]:
    """``HOST:PORT`` (``[::1]:6379`` too) as host and port; (None, None) when it is not one."""
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")
    if colon and host and port.isdigit() and 0 < int(port) < 65536:
        return host, int(port)
    return None, None


def _unreachable(host: str, port: int) -> str | None:
    """Why no TCP connection to ``host:port`` was made within :data:`_CONNECT_S`, or None.
    In a thread: the name lookup has no timeout of its own."""
    outcome: list[OSError | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=_CONNECT_S).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=connect, name="gae-ray-address", daemon=True)
    thread.start()
    thread.join(_CONNECT_S + 0.5)
    if not outcome or isinstance(outcome[0], TimeoutError):
        return f"no answer within {_CONNECT_S:g} s"
    error = outcome[0]
    if error is None:
        return None
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host name {host!r}"
    return (error.strerror or type(error).__name__).lower()


def _probe(address: str, where: str, *, found: bool) -> None:
    """Ask the GCS at ``address`` for the cluster's id as ``ray.init`` does first (a child
    process, killed after :data:`_PROBE_S`): ``ConfigError`` for a refused token or no answer.
    A recent answer from the same address with the same auth variables and token file is
    reused."""
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    with contextlib.suppress(OSError):
        token_file += f"@{os.stat(token_file).st_mtime_ns}"  # a token written since
    key = (address, found, token_file, *(os.environ.get(name) for name in _AUTH_VARS))
    if time.monotonic() - _ANSWERED.get(key, -math.inf) < _ANSWERED_S:
        return
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, address, "found" if found else "given"],
            capture_output=True, text=True, timeout=_PROBE_S, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"address: {where} takes connections but no Ray GCS answered there within "
            f"{_PROBE_S:g} s (is it the head node's GCS port, 6379 by default?)"
        ) from None
    answer = (done.stdout.split() or ["none"])[-1]
    if answer in _AUTH_PROBLEMS:
        raise ConfigError("address: " + _AUTH_PROBLEMS[answer].format(where=where))
    if answer == "ok":
        _ANSWERED[key] = time.monotonic()
    # anything else (skip: this Ray lacks the helpers; a probe that crashed) is ray.init's to say


def _canonical(address: str) -> str:
    """``host:port`` with a local host name resolved to this node's IP, as ``ray.init`` does
    (Ray's own helper; a private module, so any failure leaves the address as given)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address) or address
    except Exception:
        return address
