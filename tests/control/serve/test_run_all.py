"""`make run` (control/serve/run_all.py): the server and the dashboard start together, both URLs
are printed, both answer, and Ctrl+C stops both, as a terminal sends it (to the whole
foreground process group), the server draining a stream in flight rather than cutting it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest

from control.serve import run_all
from engine.calibration.step_law import StepLaw, chunk_pairs

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.5)


def test_run_all_starts_server_and_dashboard_and_stops_both(tiny_llama_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "control.serve.run_all", "--model", str(tiny_llama_dir), "--port",
         "0", "--dashboard-port", str(port), "--trace-db", str(tmp_path / "t.duckdb")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # its own process group, as a terminal's foreground job
    lines: list[str] = []
    stream: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.strip().startswith("dashboard"):
                break
        # keep reading: run_all copies the server's log to its stdout, and a pipe nobody
        # reads fills, blocks that copy and then run_all's own exit (its flush)
        rest: list[str] = []
        threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True).start()
        text = "".join(lines)
        api = next(w for w in text.split() if w.startswith("http://") and ":" + str(port)
                   not in w)
        assert f"dashboard  http://127.0.0.1:{port}" in text, text
        assert wait_for(api + "/healthz") == 200
        # the server's ready banner (echoed after the URLs) says how steps are sized: the
        # default is the goodput policy
        deadline = time.monotonic() + 30
        while not any("steps:" in line for line in rest):
            assert time.monotonic() < deadline, text + "".join(rest)
            time.sleep(0.1)
        said = next(line for line in rest if "steps:" in line)
        assert "steps: goodput policy from 250 ms up to 8x for the lanes' SLOs" in said, said
        assert "interactive TTFT 5 s/TPOT 0.5 s" in said and "slo_unreachable shed" in said, said
        assert wait_for(f"http://127.0.0.1:{port}/_stcore/health") == 200
        reader = start_stream(api, stream)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C: every process of the group gets it
        try:
            code = proc.wait(120)  # run_all's own deadline for both children is 60 s
        except subprocess.TimeoutExpired:  # say where it hung (once: CI under load)
            proc.kill()
            tail = "".join(lines + rest)[-4000:] if "rest" in locals() else "".join(lines)
            pytest.fail(f"run_all did not stop within 120 s of Ctrl+C; its output:\n{tail}")
    assert code == 0
    reader.join(30)
    output = "".join(lines + rest)
    assert "second interrupt" not in output and "Traceback" not in output, output[-3000:]
    # the stream that was running at Ctrl+C ended as streams end, not cut off
    assert stream[-1] == "data: [DONE]", stream[-3:]
    # Streamlit, the dashboard's own child, goes too: none left serving the port
    assert processes_with(f"--server.port\0{port}\0") == [], "the dashboard outlived run_all"
    assert (tmp_path / "t.duckdb").exists()
    con = duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)
    try:
        (settings,), = con.execute("SELECT settings FROM runs").fetchall()
    finally:
        con.close()
    # the default config fits its budgets: the step law is in the run's settings, and a
    # big step costs more than a small one (which term carries the growth is the fit's
    # choice: on a fast CPU the tiny model's per-token term fitted to 0, its attention not)
    law = StepLaw.from_dict(json.loads(settings)["step_law"])
    # and the budgets fitted with it, which a what-if replay starts from (no YAML has them)
    assert set(json.loads(settings)["fitted_budgets"]) == {"prefill_chunk_size",
                                                           "max_num_batched_tokens"}
    assert law.step_s(512, 0, chunk_pairs(0, 512), 0) > law.step_s(16, 0, chunk_pairs(0, 16), 0)


def start_stream(api: str, lines: list[str]) -> threading.Thread:
    """A long stream read in a thread into `lines`; returns once its first chunk came."""
    with urllib.request.urlopen(api + "/v1/models", timeout=10) as resp:
        model = json.load(resp)["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 480, "stream": True,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(api + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
    first = threading.Event()

    def read() -> None:
        with urllib.request.urlopen(request, timeout=60) as resp:
            for raw in resp:
                if raw.strip():
                    lines.append(raw.decode().strip())
                    first.set()
        first.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert first.wait(30), "the stream never started"
    return thread


def processes_with(needle: str) -> list[str]:
    """Command lines (NUL-separated, as /proc has them) of live processes containing
    `needle`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if needle in text:
            found.append(text.replace("\0", " "))
    return found


class FakeProc:
    """A child process of run_all that has already exited with `returncode`; `stdout`: its
    log, the server's ending with its ready line."""

    pid = 2**22 + 1  # above Linux's largest pid: run_all's killpg finds no such group

    def __init__(self, cmd, *args, returncode=0, lines=(), **kwargs):
        self.cmd, self.returncode, self.stdout = list(cmd), returncode, iter(lines)

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


def test_make_run_starts_the_server_on_its_host_and_port(monkeypatch):
    """--host and --port reach `batchpilot serve`; the API's URL is read from its ready
    line."""
    started: list[FakeProc] = []

    def popen(cmd, *args, **kwargs):
        started.append(FakeProc(cmd, lines=[
            "loading\n", "batchpilot: ready: serving tiny at http://0.0.0.0:8123\n"]))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    args = run_all.argparse.Namespace(model="tiny", host="0.0.0.0", port=8123,
                                      trace_db="t.duckdb")
    _, url = run_all.start_server(args)
    cmd = started[0].cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--trace-db") + 1] == "t.duckdb"
    assert url == "http://0.0.0.0:8123"


def test_make_run_exits_with_the_servers_failure(monkeypatch):
    """The server exited 3 (a bad config, a port taken): `make run` exits 3 too, not 0."""
    server = FakeProc(["serve"], returncode=3)
    monkeypatch.setattr(run_all, "start_server", lambda args: (server, "http://127.0.0.1:1"))
    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    monkeypatch.setattr(run_all, "_pump", lambda proc: None)
    monkeypatch.setattr(run_all.signal, "signal", lambda *args: None)  # pytest keeps its own
    assert run_all.main([]) == 3
