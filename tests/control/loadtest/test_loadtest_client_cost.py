"""The load test's note on its own CPU, and when it warns."""

import os
import socket

import pytest

from control.loadtest.client_cost import ClientCost, cost_notes, same_machine, usable_cores


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", True), ("http://127.5.0.1:8000", True),
    ("http://[::1]:8000/v1", True), ("http://localhost:8000", True),
    ("http://api.localhost", True), (f"http://{socket.gethostname()}:80", True),
    ("http://10.0.0.7:8000", False), ("https://serving.example.com", False),
    ("http://[2001:db8::1]:8000", False), ("not a url", False),
])
def test_same_machine_knows_loopback_and_own_name(url, expected):
    assert same_machine(url) is expected


def test_a_loopback_run_that_took_a_share_of_the_cores_warns():
    cost = ClientCost(cpu_s=0.5, wall_s=5.0, cores=2)  # 5% of the machine
    note, warning = cost_notes(cost, "http://127.0.0.1:8000")
    assert note == ("load generator: 0.50 CPU s over 5.0 s of runs, 5.0% of this machine's"
                    " 2 cores")
    assert warning is not None and "5.0% of its 2 cores" in warning


def test_no_warning_for_a_remote_server_or_an_idle_client():
    busy = ClientCost(cpu_s=5.0, wall_s=5.0, cores=2)
    assert cost_notes(busy, "http://10.0.0.7:8000")[1] is None
    idle = ClientCost(cpu_s=0.1, wall_s=5.0, cores=2)  # 1%
    assert cost_notes(idle, "http://127.0.0.1:8000")[1] is None
    assert ClientCost(cpu_s=0.0, wall_s=0.0, cores=2).machine_share == 0.0


def test_cores_are_those_this_process_may_run_on_not_the_machines(monkeypatch):
    """In a container pinned to 1 of 64 CPUs the client's share is of that one core."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 1
