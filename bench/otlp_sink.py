"""An OTLP/HTTP receiver in a process of its own that accepts every export and decodes
nothing: what a benchmark exports to, so the collector's cost stays off the measured
process's clock.

    with otlp_sink() as endpoint: ...   # http://127.0.0.1:PORT/v1/traces
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

SERVER = """
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        '''No access-log line per export.'''

server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_port, flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(10)
