"""`batchpilot fleet` as a new user runs it on this machine kind (2 cores): the documented
`--replicas 2` with its defaults becomes ready (it once waited forever: two 1-CPU replicas
and the ingress's 0.5 CPU could not fit 2), a --trace-dir that does not exist yet is
created (conftest.py's shared fleet is that run), and a placement that cannot fit fails at
once with the arithmetic, before Ray starts. Without Ray
Serve installed these fail (the CLI says to install the `fleet` extra): `make test` has it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures.ports import listen_port

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    return listen_port()  # outside the ephemeral range (tests/fixtures/ports.py)


def fleet_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "control.cli.main", "fleet", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_fleet_that_cannot_fit_fails_at_once_saying_why(tiny_llama_dir):
    started = time.monotonic()
    proc = fleet_cli("--replicas", "2", "--replica-cpus", "1.0", "--num-cpus", "2",
                     "--model", str(tiny_llama_dir), "--port", str(free_port()))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "2 replicas x 1 CPU + the ingress's 0.5 CPU = 2.5 CPUs, but Ray has 2" in out
    assert time.monotonic() - started < 60, "it waited for resources that never come"
    assert "Started a local Ray instance" not in out, "it started Ray to find out"


def test_joining_a_ray_cluster_that_is_not_there_is_one_line(tiny_llama_dir, tmp_path):
    """docs/fleet.md's `--address auto` with no cluster started: Ray's own message and
    what to do, not its traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "control.cli.main", "fleet", "--address", "auto",
         "--model", str(tiny_llama_dir), "--port", str(free_port())],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_ADDRESS": "", "TMPDIR": str(tmp_path),  # no session there
             "RAY_TMPDIR": str(tmp_path)})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "batchpilot fleet: error: --address auto: Could not find any running Ray" in out
    assert "ray start --head" in out and "Traceback" not in out, out


# NOTE: last in this file: `--address auto` above finds a running Ray by its processes,
# and would deploy onto the shared fleet's cluster once this test has started it
def test_the_documented_two_replica_fleet_starts_with_its_defaults(fleet_process,
                                                                   fleet_trace_dir):
    """conftest.py's fleet is `batchpilot fleet --replicas 2` with its defaults: it became
    ready with room for both replicas, created the trace folder that did not exist, and
    serves (its SIGTERM exit, 0, is checked when the session's last fleet test ends)."""
    line = fleet_process.ready_line
    assert "2 replicas (0.75 CPU each)" in line or os.cpu_count() != 2, line
    done = httpx.post(f"{fleet_process.url}/v1/completions", timeout=60,
                      json={"prompt": "Hello", "max_tokens": 4})
    assert done.status_code == 200, done.text
    assert {p.name for p in fleet_trace_dir.glob("*.duckdb")} == {"replica-0.duckdb",
                                                                  "replica-1.duckdb"}
