"""`batchpilot ctl`'s fixtures: the stand-in control API (fake_control.py) it is pointed at,
and a runner that returns (exit code, stdout, stderr)."""

from __future__ import annotations

import threading

import pytest
from fake_control import FakeControl

from control.cli.main import main


@pytest.fixture
def fake(monkeypatch):
    server = FakeControl()
    thread = threading.Thread(target=server.server.serve_forever, args=(0.05,),
                              daemon=True)
    thread.start()
    monkeypatch.setenv("BATCHPILOT_URL", server.url)
    monkeypatch.delenv("BATCHPILOT_TOKEN", raising=False)
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def ctl(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["ctl", *argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run
