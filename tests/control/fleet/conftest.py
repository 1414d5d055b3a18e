"""The Ray fleet shared by the Ray tests of this folder (test_fleet_ray.py,
test_fleet_canary_ray.py, test_fleet_restart_ray.py, test_fleet_trace_ray.py and the
newcomer's test_fleet_newcomer_ray.py): `batchpilot fleet --replicas 2` started as a user
starts it, in a process of its own, once a session (Ray ~6-10 s, Serve and the replicas
~10-30 s on the shared 2-core VM). Its modules skip without Ray Serve, except under CI
(`make test` installs the `fleet` extra)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fixtures.ports import listen_port
from fixtures.process_log import log_tail, wait_for_line
from fixtures.requires import require_module

from control.fleet.app import READY_LINE

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    return listen_port()  # outside the ephemeral range (tests/fixtures/ports.py)


def _healthy_replicas(url: str) -> int:
    try:
        return sum(r["healthy"] for r in httpx.get(f"{url}/readyz", timeout=10)
                   .json()["replicas"])
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


@pytest.fixture(scope="session")
def fleet_trace_dir(tmp_path_factory):
    """Where the Ray fleet's replicas write their traces (replica-<id>.duckdb); a folder
    that does not exist yet, as a newcomer's (the fleet creates it)."""
    return tmp_path_factory.mktemp("fleet") / "traces" / "not-yet"


# NOTE: session-scoped so the Ray test modules share one fleet, but stopped after the last
# test that uses it, not at the session's end: a live Ray (replicas, raylet, the ingress's
# polls) took CPU from every later test on a 2-core machine, and `make run`'s test timed out.
_LAST_USER: list = []
_STOPS: list = []


def pytest_collection_modifyitems(session, config, items):
    users = [item for item in items if "fleet" in getattr(item, "fixturenames", ())]
    _LAST_USER[:] = users[-1:]


def pytest_runtest_teardown(item, nextitem):
    if _LAST_USER and item is _LAST_USER[0]:
        _stop_fleet()


def _stop_fleet() -> None:
    while _STOPS:
        _STOPS.pop()()


@dataclass
class FleetProcess:
    """`batchpilot fleet` running in a process of its own: its URL and the line it
    printed when ready."""

    url: str
    ready_line: str


@pytest.fixture(scope="session")
def fleet_process(tiny_llama_dir, fleet_trace_dir, tmp_path_factory):
    """`batchpilot fleet --replicas 2` as docs/fleet.md gives it, with its defaults on
    this machine (0.75 CPU a replica and 0.5 for the ingress on 2 cores), the tiny model,
    precise routing (KV events and the ingress's index; a new prefix still goes by
    affinity's hash, so what the affinity tests hold holds here too) and a trace folder
    that does not exist yet. Stopped with SIGTERM, as a user stops it: it must exit 0."""
    require_module("ray", "pip install -e '.[fleet]'")
    require_module("ray.serve", "pip install -e '.[fleet]'")
    log = tmp_path_factory.mktemp("fleet-log") / "fleet.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control.cli.main", "fleet", "--replicas", "2",
             "--model", str(tiny_llama_dir), "--port", str(_free_port()), "--routing",
             "precise", "--trace-dir", str(fleet_trace_dir), "--shutdown-grace-s", "2"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _STOPS.append(lambda: _sigterm(proc, log))
    try:
        ready = wait_for_line(proc, log, READY_LINE, 240, what="batchpilot fleet")
        url = ready.rsplit(" at ", 1)[1].strip()
        deadline = time.monotonic() + 60
        while _healthy_replicas(url) != 2:
            assert time.monotonic() < deadline, "timed out waiting for both replicas healthy"
            time.sleep(0.1)
        yield FleetProcess(url, ready)
    finally:
        _stop_fleet()  # unless pytest_runtest_teardown did, after the fleet's last user


@pytest.fixture(scope="session")
def fleet(fleet_process):
    """The fleet's ingress URL."""
    return fleet_process.url


def _sigterm(proc: subprocess.Popen, log: Path) -> None:
    """SIGTERM, as a user stops it: it drains and exits 0 within the wait."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise
    assert code == 0, f"batchpilot fleet exited {code} on SIGTERM:\n{log_tail(log)}"
