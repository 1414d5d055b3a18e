"""The read deadlines' edges (control/serve/read_deadlines.py) on a kept-alive connection and
after a 408: each request's head gets its own deadline and its own byte count, and a body
that never came closes the connection after its 408. A quick app (it answers at once) and
short deadlines keep each test around a second."""

from __future__ import annotations

import socket
import time

import pytest
import uvicorn
from fixtures.http_stub import uvicorn_served

from control.serve.read_deadlines import ReadDeadlines
from tests.security.test_read_deadlines import rest

SHORT_S = 0.4  # both deadlines here
HEAD_BYTES = 2048  # the head limit here


class Short(ReadDeadlines):
    headers_s = SHORT_S
    body_s = SHORT_S
    max_head_bytes = HEAD_BYTES


async def app(scope, receive, send):
    """Reads the whole body and answers `ok` at once."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port():
    with uvicorn_served(uvicorn.Config(app, host="127.0.0.1", port=0, http=Short,
                                       log_level="warning", lifespan="off",
                                       timeout_keep_alive=60)) as bound:
        yield bound


def answer(sock: socket.socket) -> bytes:
    """One whole `ok` answer on a kept-alive connection."""
    sock.settimeout(5)
    got = b""
    while not got.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {got!r}"
        got += chunk
    return got


def test_a_kept_alive_connections_next_request_gets_a_header_deadline(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and the rest never comes
        assert rest(sock, wait_s=5 * SHORT_S) == b""  # closed after SHORT_S


def test_each_request_on_a_kept_alive_connection_has_its_own_head_limit(port):
    """Five heads of ~1.2 KiB on one connection, 6 KiB in all, under a 2 KiB limit: each
    sent in two reads (a read that ends the head is not counted), each served; then one
    head over the limit gets its 431."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 1200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(5):
            sock.sendall(head[:-10])
            time.sleep(0.02)  # two reads
            sock.sendall(head[-10:])
            assert answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * HEAD_BYTES + b"\r\n")
        assert rest(sock, wait_s=2).startswith(b"HTTP/1.1 431 ")


def test_a_body_that_never_arrives_gets_a_408_and_the_connection_closes(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx")
        got = rest(sock, wait_s=5 * SHORT_S)
    assert got.startswith(b"HTTP/1.1 408 ") and got.endswith(b"}"), got
