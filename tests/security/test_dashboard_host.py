"""Issue #29 (8): the dashboard has no login and acts with the operator's token, so
`batchpilot dashboard` and `make run` (control/serve/run_all.py) refuse a non-loopback
address unless --allow-public-dashboard, with exit code 2 and the reason, before anything
starts."""

from __future__ import annotations

import os
import subprocess

import pytest

from control.cli.main import main
from control.serve import run_all

URL = ["--url", "http://127.0.0.1:8000"]


@pytest.fixture
def launches(monkeypatch) -> list[list[str]]:
    """The commands that would have been started (Streamlit, the server): none run."""
    started: list[list[str]] = []

    def record(cmd, *args, **kwargs):
        started.append(list(cmd))
        return 0

    monkeypatch.setattr(subprocess, "Popen", record)
    monkeypatch.setattr(os, "execv", lambda path, cmd: record(cmd))  # batchpilot dashboard
    return started


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.com"])
def test_a_public_host_is_refused_with_the_reason(host, launches, capsys):
    code = main(["dashboard", *URL, "--host", host])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--host {host} is not a loopback address" in err
    assert "acts with the operator's token" in err
    assert "authenticating proxy" in err and "--allow-public-dashboard" in err
    assert launches == []  # Streamlit never started


def test_the_refusal_comes_before_other_checks(launches, capsys):
    assert main(["dashboard", "--trace-db", "/no/such.duckdb", "--host", "0.0.0.0"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_starts_streamlit_there(host, launches):
    assert main(["dashboard", *URL, "--host", host]) == 0
    (cmd,) = launches
    assert cmd[cmd.index("--server.address") + 1] == host


def test_the_flag_lets_the_operator_bind_a_public_host(launches, capsys):
    assert main(["dashboard", *URL, "--host", "0.0.0.0", "--allow-public-dashboard"]) == 0
    (cmd,) = launches
    assert cmd[cmd.index("--server.address") + 1] == "0.0.0.0"
    assert "not a loopback address" not in capsys.readouterr().err


def test_make_run_refuses_a_public_dashboard_before_starting_the_server(launches, capsys):
    assert run_all.main(["--dashboard-host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--dashboard-host 0.0.0.0 is not a loopback address" in err
    assert launches == []  # no server loaded a model only to be stopped


def test_make_run_keeps_the_dashboard_on_loopback_when_the_server_is_public(monkeypatch):
    """--host 0.0.0.0 exposes the API; the dashboard stays on 127.0.0.1 unless asked."""
    started: list[list[str]] = []

    class Proc:
        returncode = 0
        pid = 2**22 + 1  # above Linux's largest pid: run_all's killpg finds no such group

        def __init__(self, cmd, *args, **kwargs):
            started.append(list(cmd))

        def poll(self):
            return 0  # "exited": run_all's wait loop ends at once

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(run_all, "start_server", lambda args: (Proc(["server"]),
                                                               "http://0.0.0.0:8000"))
    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setattr(run_all, "_pump", lambda proc: None)
    monkeypatch.setattr(run_all.signal, "signal", lambda *args: None)  # pytest keeps its own
    assert run_all.main(["--host", "0.0.0.0"]) == 0
    dashboard = started[-1]
    assert dashboard[dashboard.index("--host") + 1] == "127.0.0.1"
    assert "--allow-public-dashboard" not in dashboard
    started.clear()
    assert run_all.main(["--dashboard-host", "0.0.0.0", "--allow-public-dashboard"]) == 0
    dashboard = started[-1]
    assert dashboard[dashboard.index("--host") + 1] == "0.0.0.0"
    assert "--allow-public-dashboard" in dashboard


def test_streamlit_gets_the_token_variable_and_the_replica(launches):
    """The Control page reads the token from the variable the operator named, and a fleet's
    dashboard opens on the replica asked for."""
    assert main(["dashboard", *URL, "--token-env", "OPS_TOKEN", "--replica", "1"]) == 0
    (cmd,) = launches
    app_args = cmd[cmd.index("--") + 1:]
    assert app_args[app_args.index("--token-env") + 1] == "OPS_TOKEN"
    assert app_args[app_args.index("--replica") + 1] == "1"
