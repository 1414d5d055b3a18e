"""The server's handle on its edge process (control/edge/process.py), against a real edge with
no server behind it: the edge listens where its ready line says, enforces the server's own
limits (not the defaults), is out of reach of a Ctrl+C meant for the server, and leaves
nothing behind once stopped; the socket behind it is in a folder only this user can enter.
The whole server with its edge: tests/security/test_edge_process.py."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from control.api.limits import RequestLimits
from control.edge.process import EdgeProcess, remove_socket, socket_path

LIMITS = RequestLimits(max_body_bytes=1000, max_messages=2)  # far below the defaults


@pytest.fixture
def edge():
    handle = EdgeProcess(socket_path(), "127.0.0.1", 0, LIMITS, "warning")
    try:
        yield handle, handle.wait_ready(30)
    finally:
        handle.stop()


def test_the_edge_enforces_the_limits_the_server_was_given(edge):
    handle, url = edge
    assert url.startswith("http://127.0.0.1:"), url
    chat = [{"role": "user", "content": "hi"}] * 3
    with httpx.Client(base_url=url, timeout=10) as client:
        big = client.post("/v1/completions", content=b" " * 2000,
                          headers={"Content-Type": "application/json"})
        many = client.post("/v1/chat/completions", json={"messages": chat})
    # refused by the edge itself (nothing listens on its socket): 2000 bytes and three
    # messages are far within the defaults, so only the server's limits refuse them
    assert big.status_code == 413, big.text
    assert big.json()["error"]["param"] == "max_body_bytes"
    assert many.status_code == 400 and many.json()["error"]["param"] == "messages", many.text


def test_the_edge_runs_on_beside_its_server_out_of_reach_of_a_ctrl_c(edge):
    """The terminal sends SIGINT to its foreground process group: the edge is in a session of
    its own, so it keeps forwarding while the server drains. It watches its server (this
    process) and stays up while it lives: an edge taken for an orphan exits in ~0.6 s."""
    handle, _ = edge
    assert os.getpgid(handle.proc.pid) != os.getpgrp()
    assert os.getsid(handle.proc.pid) == handle.proc.pid
    with pytest.raises(subprocess.TimeoutExpired):
        handle.proc.wait(1.0)


def test_a_stopped_edge_leaves_no_socket_folder_behind():
    uds = socket_path()
    folder = Path(uds).parent
    try:
        # only this user may connect to the server behind the edge (past the edge's limits)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        handle = EdgeProcess(uds, "127.0.0.1", 0, LIMITS, "warning")
        handle.wait_ready(30)
        Path(uds).touch()  # stands in for the server's socket
        handle.stop()
        assert not handle.alive() and not folder.exists()
    finally:
        if folder.exists():  # a failure above leaves nothing in /tmp either
            remove_socket(uds)


def test_an_edge_that_cannot_listen_is_reported_at_once():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    uds = socket_path()
    try:
        handle = EdgeProcess(uds, "127.0.0.1", taken.getsockname()[1], LIMITS, "critical")
        with pytest.raises(RuntimeError, match="exited .* before it listened"):
            handle.wait_ready(10)
    finally:
        taken.close()
        if Path(uds).parent.exists():
            remove_socket(uds)
