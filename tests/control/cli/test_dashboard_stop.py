"""`batchpilot dashboard` stops when its process is sent SIGTERM, as a supervisor or `make
screenshots` stops it: the command is Streamlit itself (exec), where it once waited on
Streamlit as a child, died alone and left Streamlit serving on its port."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fixtures.ports import listen_port
from fixtures.trace_data import fill_trace

ROOT = Path(__file__).resolve().parents[3]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def test_sigterm_to_batchpilot_dashboard_stops_streamlit(tmp_path):
    db = str(tmp_path / "trace.duckdb")
    fill_trace(db).stop()
    port = listen_port()
    health = f"http://127.0.0.1:{port}/_stcore/health"
    proc = subprocess.Popen([sys.executable, "-m", "control.cli.main", "dashboard",
                             "--trace-db", db, "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not answers(health):
            assert proc.poll() is None and time.monotonic() < deadline, "never served"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        deadline = time.monotonic() + 10
        while answers(health) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not answers(health), "Streamlit outlived batchpilot dashboard"
    finally:
        if proc.poll() is None:
            proc.kill()
