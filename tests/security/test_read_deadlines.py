"""Slowloris: a client that trickles its headers, stops half-way, sends nothing, or declares a
body it never sends loses its connection after the read deadlines (control/serve/
read_deadlines.py; short ones here), a body that never comes gets a 408, and a client that
sent its request on time keeps its connection however long the answer takes. Bytes that are
not HTTP get a JSON 400 in the API's error shape, not uvicorn's plain text."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import uvicorn
from fixtures.http_stub import uvicorn_served

from control.serve.read_deadlines import ReadDeadlines

SHORT_S = 0.6  # both deadlines in this test


class Short(ReadDeadlines):
    headers_s = SHORT_S
    body_s = SHORT_S


async def app(scope, receive, send):
    """Reads the whole body, waits 2 deadlines (an answer that takes long), echoes its size."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    await asyncio.sleep(2 * SHORT_S)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    with uvicorn_served(uvicorn.Config(app, host="127.0.0.1", port=0, http=Short,
                                       log_level="warning", lifespan="off")) as bound:
        yield bound


def talk(port: int, pieces: list[bytes], gap_s: float = 0.0, wait_s: float = 5.0) -> bytes:
    """Send `pieces` `gap_s` apart; everything the server sends until it closes (at most
    `wait_s` after the last piece)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:  # closed on us mid-trickle: what the test looks for
                break
            time.sleep(gap_s)
        return rest(sock, wait_s)


def rest(sock: socket.socket, wait_s: float) -> bytes:
    """What the server sends until it closes; `<still open>` appended if it has not after
    `wait_s`."""
    sock.settimeout(wait_s)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return got + b"<still open>"
    except ConnectionResetError:  # a reset is a close too
        return got
    return got


def test_a_connection_that_sends_nothing_is_closed(port):
    assert talk(port, [], wait_s=5 * SHORT_S) == b""


def test_headers_trickled_past_the_deadline_are_cut(port):
    lines = [b"POST / HTTP/1.1\r\n", *[b"X-Slow-%d: 1\r\n" % i for i in range(20)]]
    started = time.monotonic()
    assert talk(port, lines, gap_s=SHORT_S / 3) == b""
    assert time.monotonic() - started < 20 * SHORT_S / 3  # before the trickle ended


def test_a_body_that_never_arrives_gets_a_408(port):
    got = talk(port, [b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx"])
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert b"request_timeout" in got


def json_error(got: bytes, status: bytes) -> dict:
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status + b" "), got[:300]
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("garbage", [
    b"GARBAGE\r\n\r\n",  # no request line
    b"GET / HTTP/1.1\r\nHost x\r\n\r\n",  # a header without its colon
])
def test_bytes_that_are_not_http_get_a_json_400(port, garbage):
    assert json_error(talk(port, [garbage]), b"400")["code"] == "invalid_http"


@pytest.mark.parametrize("head", [
    b"X-Big: " + b"a" * 200_000 + b"\r\n",  # one huge header, sent at once
    b"".join(b"X-%d: y\r\n" % i for i in range(20_000)),  # very many small ones
])
def test_headers_past_the_size_limit_get_a_431(port, head):
    pieces = [b"GET / HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n"]
    assert json_error(talk(port, pieces), b"431")["code"] == "headers_too_large"


def test_headers_under_the_limit_with_a_big_body_in_the_same_reads_pass(port):
    """Header bytes count, not the body's: 40 KiB of headers, then 1 MiB of body sent with
    them, and a request in 100-byte pieces (many reads, each counted) still answers."""
    # (Connection: close: the answer's end is the connection's, not a keep-alive timeout)
    head = b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: " + b"p" * 40_000 + b"\r\n"
    body = b"b" * (1 << 20)
    got = talk(port, [head + b"Content-Length: %d\r\n\r\n" % len(body) + body])
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(str(len(body)).encode()), got[:200]
    small = (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: " + b"p" * 3_000
             + b"\r\n\r\n")
    got = talk(port, [small[i:i + 100] for i in range(0, len(small), 100)])
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]


def test_a_request_on_time_keeps_its_connection_while_its_answer_takes_long(port):
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(2):  # keep-alive: the second request's headers get a deadline anew
            sock.sendall(request)
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"5"), reply


class Captured:
    """Stands in for the server classes: records the uvicorn config they were given."""

    configs: list = []

    def __init__(self, config, *args, **kwargs):
        self.configs.append(config)
        self.started, self.exit_code = True, 0

    def run(self) -> None:
        """Serves nothing: the test reads only the config it was given."""

    def stop_edge(self) -> None:
        """No edge was started."""


def test_the_server_and_the_edge_read_with_deadlines(monkeypatch):
    from types import SimpleNamespace

    from control.edge import __main__ as edge_main
    from control.serve import server
    from control.serve.settings import ServeSettings

    Captured.configs.clear()
    monkeypatch.setattr(server, "DrainingServer", Captured)
    monkeypatch.setattr(server, "create_app", lambda settings: SimpleNamespace(
        state=SimpleNamespace(serving=None)))
    assert server.serve(ServeSettings(model="tiny")) == 0
    monkeypatch.setattr(edge_main, "EdgeServer", Captured)
    monkeypatch.setattr(edge_main, "create_edge_app", lambda *args: app)
    assert edge_main.main(["--uds", "/tmp/none.sock", "--host", "127.0.0.1", "--port", "1",
                           "--limits", "{}", "--parent", "1"]) == 0
    assert [c.http for c in Captured.configs] == [ReadDeadlines, ReadDeadlines]


def test_headers_past_the_limit_in_many_small_reads_get_a_431(port):
    """The limit counts every read of one request's head, not each read alone."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"y" * 1000) for i in range(80))  # ~80 KiB > 64 KiB
    pieces = [head[i:i + 8192] for i in range(0, len(head), 8192)] + [b"\r\n"]
    assert json_error(talk(port, pieces, gap_s=0.01), b"431")["code"] == "headers_too_large"
