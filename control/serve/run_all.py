"""`make run`: the server on the default model with a trace, and the dashboard beside it.

Starts `batchpilot serve --trace-db FILE`, waits for its ready line, starts `batchpilot
dashboard --url ...`, prints both URLs, and stops both (server first drains) on Ctrl+C
or when either exits; a second Ctrl+C stops the server without waiting for its drain.

    python -m control.serve.run_all [--port 8000] [--dashboard-port 8501] [--trace-db FILE]

--host binds the server only: the dashboard stays on 127.0.0.1 (--dashboard-host), since
whoever opens it acts with the operator's token; a public --dashboard-host is refused
before anything starts, unless --allow-public-dashboard (control/cli/dashboard.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from control.cli.dashboard import public_host_refusal
from control.serve.server import READY_LINE
from control.serve.stop_signals import stop_on_signals, wait_for_stop


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "control.cli.main", "serve", "--model", args.model,
           "--host", args.host, "--port", str(args.port), "--trace-db", args.trace_db]
    # NOTE: a session of its own, so a terminal's Ctrl+C reaches only run_all, which passes
    # each one on: in the terminal's process group the server got the key's SIGINT and then
    # run_all's, and took the second for "exit without waiting", cutting streams mid-drain
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # echo the server's start-up; its ready line carries the URL
        sys.stdout.write(line)
        if line.startswith(READY_LINE):
            return proc, line.rsplit(" at ", 1)[1].strip()
    raise SystemExit(f"the server exited ({proc.wait()}) before it was ready")


def _pump(proc: subprocess.Popen) -> None:
    """The server's log, as it comes."""
    for line in proc.stdout:
        sys.stdout.write(line)


STOP_TIMEOUT_S = 60.0  # Ctrl+C: both processes' drain, then they are killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dashboard-host", default="127.0.0.1")
    parser.add_argument("--dashboard-port", type=int, default=8501)
    parser.add_argument("--allow-public-dashboard", action="store_true")
    parser.add_argument("--trace-db", default="batchpilot-trace.duckdb")
    args = parser.parse_args(argv)
    refusal = public_host_refusal(args.dashboard_host, args.allow_public_dashboard,
                                  "--dashboard-host")
    if refusal is not None:  # before the server loads a model only to be stopped
        print(f"run_all: {refusal}", file=sys.stderr)
        return 2
    server, url = start_server(args)
    public = ["--allow-public-dashboard"] if args.allow_public_dashboard else []
    # NOTE: its own process group, signalled whole: `batchpilot dashboard` runs Streamlit
    # as its child, which a signal to the dashboard's pid alone could leave running
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "control.cli.main", "dashboard", "--url", url,
         "--host", args.dashboard_host, "--port", str(args.dashboard_port), *public],
        stdout=subprocess.DEVNULL, start_new_session=True)
    # SIGHUP: the terminal closed (the server, in a session of its own, does not get it);
    # before the URLs are printed: a signal sent on reading them must stop both, cleanly
    stop = stop_on_signals((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    print(f"\n  API        {url}   (OpenAI-compatible; /metrics; /control)\n"
          f"  dashboard  http://{args.dashboard_host}:{args.dashboard_port}\n"
          f"  trace      {args.trace_db}\n\nCtrl+C stops both.", flush=True)
    threading.Thread(target=_pump, args=(server,), name="server-log", daemon=True).start()
    try:
        wait_for_stop(stop, lambda: server.poll() is None and dashboard.poll() is None)
    finally:  # (Ctrl+C sets `stop`: its handler replaces KeyboardInterrupt)
        _signal_group(dashboard, signal.SIGINT)
        if server.poll() is None:
            server.send_signal(signal.SIGINT)  # it drains
        # a second Ctrl+C is the server's too: it stops without waiting for the drain
        signal.signal(signal.SIGINT, lambda *_: _signal_group(server, signal.SIGINT))
        deadline = time.monotonic() + STOP_TIMEOUT_S  # one deadline for both, not one each
        for proc in (dashboard, server):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _signal_group(dashboard, signal.SIGKILL)  # whatever of its group outlived it
    return server.returncode or 0


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to every process of proc's group (its own: start_new_session), if any is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


if __name__ == "__main__":
    sys.exit(main())
