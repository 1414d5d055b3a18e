"""The server's handle on its edge process (control/edge/__main__.py): start it once the
server listens on its socket, learn its URL from its ready line, stop it after the server
has drained.

The edge runs in a session of its own, so a Ctrl+C at the terminal reaches only the server,
which drains first (the edge keeps forwarding meanwhile) and then stops the edge.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from control.api.limits import RequestLimits

EDGE_READY_LINE = "batchpilot-edge: listening"
PARENT_POLL_S = 1.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def socket_path() -> str:
    """A fresh Unix socket path in a folder only this user can enter."""
    folder = tempfile.mkdtemp(prefix="batchpilot-")  # mode 0700
    return str(Path(folder) / "server.sock")


class EdgeProcess:
    def __init__(self, uds: str, host: str, port: int, limits: RequestLimits, log_level: str):
        cmd = [sys.executable, "-m", "control.edge", "--uds", uds, "--host", host,
               "--port", str(port), "--limits", json.dumps(dataclasses.asdict(limits)),
               "--parent", str(os.getpid()), "--log-level", log_level]
        self.uds = uds
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        """The edge's stdout: to ours, and to wait_ready() until it has seen the URL."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
            if not line.startswith(EDGE_READY_LINE):
                sys.stdout.write(line)
        self._lines.put(None)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Blocks until the edge listens -> its URL; RuntimeError if it exits first."""
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"the edge process did not listen within {timeout_s:.0f}s"
                                   ) from None
            if line is None:
                raise RuntimeError(f"the edge process exited ({self.proc.wait()}) before it"
                                   " listened; its log is above")
            if line.startswith(EDGE_READY_LINE):
                return line.rsplit(" at ", 1)[1].strip()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        remove_socket(self.uds)


def remove_socket(uds: str) -> None:
    """The socket and the private folder socket_path() made for it."""
    path = Path(uds)
    path.unlink(missing_ok=True)
    if path.parent.name.startswith("batchpilot-") and not any(path.parent.iterdir()):
        path.parent.rmdir()
