"""A Ray address is checked before a sweep exists: an address where nothing answers, a malformed
one, ``auto`` with no cluster here, or a cluster that wants a token the client lacks is one line
naming ``--address`` (exit 2) within seconds, and nothing is stored. Before the check, such a
sweep retried for minutes, deaf to SIGTERM, then failed with a traceback, leaving a failed sweep
and an interrupted trial.

Ray is an optional extra for users but part of the test requirements: without it these tests
skip, except under ``CI=true`` where they fail."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_FLAGS, cli_env

from gae_core.errors import ConfigError

if os.environ.get("CI", "").strip().lower() == "true":
    import ray  # a missing ray is a failure in CI, not a skip
else:
    ray = pytest.importorskip("ray", reason="pip install -r requirements-ray.txt")

#: The variables a client's Ray reads for its address and token authentication.
RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
#: Far more than the check takes (a few seconds), far less than Ray's own retries (minutes).
BOUND_S = 30


def _ray_env(**env: str) -> dict[str, str]:
    """A CLI subprocess's environment with no Ray address or auth variables but ``env``."""
    clean = {k: v for k, v in cli_env().items() if k not in RAY_VARS}
    return {**clean, **env}


def _sweep(
    data: Path, address: str | None, **env: str
) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI's Ray sweep on ``address`` (None: no flag) with :func:`_ray_env` (``env``); how
    long it took."""
    flags = [] if address is None else ["--address", address]
    command = [sys.executable, "-m", "gae_core", "--data-dir", str(data), "sweep", "--backend",
               "ray", *flags, "--lambdas", "0.9", "--total-steps", "2000", *TINY_FLAGS]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=90,
                          cwd=data.parent, env=_ray_env(**env))  # fmt: skip
    return done, time.monotonic() - start


def _one_address_line(done: subprocess.CompletedProcess, elapsed: float, data: Path) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert elapsed < BOUND_S
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("error: --address: "), lines[0]
    assert not data.exists()  # no store, no sweep, no trial
    return lines[0]


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("127.0.0.1:1", "nothing answers at 127.0.0.1:1: connection refused"),
        ("ray://127.0.0.1:1", "nothing answers at ray://127.0.0.1:1: connection refused"),
        ("not a host", "expected HOST:PORT"),
        ("127.0.0.1:99999", "expected HOST:PORT"),
        ("no-such-host.invalid:6379", "nothing answers at no-such-host.invalid:6379"),
    ],
)
def test_a_bad_address_is_one_line_before_a_sweep_exists(tmp_path, address, says):
    done, elapsed = _sweep(tmp_path / "data", address)
    assert says in _one_address_line(done, elapsed, tmp_path / "data")


def test_a_bad_ray_address_variable_is_checked_like_the_flag(tmp_path):
    """No --address (or auto): ray.init would join RAY_ADDRESS, so that is what is checked."""
    for address in (None, "auto"):
        done, elapsed = _sweep(tmp_path / "data", address, RAY_ADDRESS="127.0.0.1:1")
        line = _one_address_line(done, elapsed, tmp_path / "data")
        assert "127.0.0.1:1 (from RAY_ADDRESS): connection refused" in line


def test_auto_with_no_cluster_here_is_one_line(tmp_path):
    from ray._private.services import find_gcs_addresses
    from ray._private.utils import read_ray_address

    if find_gcs_addresses() or read_ray_address():  # (another test's or session's Ray)
        pytest.skip("a Ray cluster runs on this machine: auto would join it")
    done, elapsed = _sweep(tmp_path / "data", "auto")
    line = _one_address_line(done, elapsed, tmp_path / "data")
    assert "auto found no running Ray cluster on this machine" in line


_CLUSTER = """
import sys, ray
ray.init(num_cpus=0, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_a_token_cluster_asks_for_the_token_in_one_line(tmp_path, monkeypatch):
    """A local cluster with token authentication (Ray 2.60's default for a new cluster; here
    with a token of its own, so no file is written): a client without RAY_AUTH_MODE=token, or
    with another token, is told which variable to set; with the token, the check passes."""
    token = secrets.token_hex(16)
    env = _ray_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    cluster = subprocess.Popen(
        [sys.executable, "-c", _CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        address = cluster.stdout.readline().strip()
        assert address, "the token cluster did not start"
        done, elapsed = _sweep(tmp_path / "data", address)
        line = _one_address_line(done, elapsed, tmp_path / "data")
        assert "uses token authentication: set RAY_AUTH_MODE=token" in line
        assert "RAY_AUTH_TOKEN" in line

        done, elapsed = _sweep(tmp_path / "data", address, RAY_AUTH_MODE="token",
                               RAY_AUTH_TOKEN=secrets.token_hex(16))  # fmt: skip
        line = _one_address_line(done, elapsed, tmp_path / "data")
        assert "refused this client's token: set RAY_AUTH_TOKEN" in line

        from gae_core.runs.ray_pool import check_address

        if ray.is_initialized():  # connected, a process checks only that it is the same Ray
            pytest.skip(
                "this test process holds a Ray connection: the in-process token checks "
                "need a process without one (the CLI checks above ran)"
            )
        for name in RAY_VARS:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        check_address(address)  # the right token: no error
        monkeypatch.delenv("RAY_AUTH_MODE")
        with pytest.raises(ConfigError, match=r"^address: .*set RAY_AUTH_MODE=token"):
            check_address(address)
        monkeypatch.setenv("RAY_AUTH_MODE", "token")  # and no token anywhere
        monkeypatch.delenv("RAY_AUTH_TOKEN")
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
        with pytest.raises(ConfigError, match=r"^address: RAY_AUTH_MODE=token, but no token"):
            check_address(address)
    finally:
        cluster.stdin.close()  # the child ends, and ray.shutdown ends its cluster
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
