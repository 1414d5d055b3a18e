"""The Ray fleet shared by the Ray tests of this folder (test_fleet_ray.py,
test_fleet_canary_ray.py, test_fleet_restart_ray.py): one local Ray and one 2-replica fleet
of the tiny model for the whole session (Ray ~6-10 s, Serve and the replicas ~10-30 s on
the shared 2-core VM; a Ray cannot be started twice in one process cheaply). Its modules
skip without Ray Serve, except under CI (`make test` installs the `fleet` extra)."""

from __future__ import annotations

import time

import httpx
import pytest
from fixtures.ports import listen_port
from fixtures.requires import require_module


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
    """Where the Ray fleet's replicas write their traces (replica-<id>.duckdb)."""
    return tmp_path_factory.mktemp("fleet-trace")


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


@pytest.fixture(scope="session")
def fleet(tiny_llama_dir, fleet_trace_dir):
    """The fleet's ingress URL."""
    ray = require_module("ray", "pip install -e '.[fleet]'")
    serve = require_module("ray.serve", "pip install -e '.[fleet]'")
    from control.fleet.app import FleetSettings, start
    from control.fleet.router import RoutingPolicy
    from control.serve.settings import ServeSettings

    port = _free_port()
    settings = FleetSettings(
        ServeSettings(model=str(tiny_llama_dir), port=port, shutdown_grace_s=2.0,
                      engine_overrides={"num_kv_blocks": 256}),
        replicas=2, num_cpus=2, replica_cpus=0.5, ingress_cpus=0.25,
        trace_dir=str(fleet_trace_dir),
        # precise: KV events and the ingress's index on Ray (a new prefix still goes by
        # affinity's hash, so what the affinity tests hold holds here too)
        policy=RoutingPolicy(mode="precise"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    _STOPS.append(lambda: (serve.shutdown(), ray.shutdown()))
    try:
        start(settings)  # Serve's proxy dying at start-up under load: start retries it
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while _healthy_replicas(url) != 2:
            assert time.monotonic() < deadline, "timed out waiting for both replicas healthy"
            time.sleep(0.1)
        yield url
    finally:
        _stop_fleet()  # unless pytest_runtest_teardown did, after the fleet's last user
