"""Deadlines on reading a request, for the HTTP servers batchpilot runs (the server, the
edge process): uvicorn times a connection only while it idles between requests
(timeout_keep_alive), so a client that sends its headers a line every few seconds, stops
half-way, or declares a body it never sends held its connection (and a file descriptor)
for as long as it liked: slowloris.

    connection made, or a request begins     HEADERS_S to finish its headers, else closed
    headers done                             BODY_S to finish its body, else a 408 (when
                                             no response has started) and closed

A request whose body arrived is not timed here: the route's own request timeout runs from
its arrival. BODY_S is generous for a body of max_body_bytes (4 MiB in 60 s: ~70 KB/s).

Sizes: a request's line and headers may take MAX_HEAD_BYTES; past that the client gets a
431 and the connection closes (uvicorn's httptools parser took 8 MB of headers, or 100,000
header lines, and kept them in memory). Bytes that are not an HTTP/1.1 request (a bad
request line, a header without a colon) get a JSON 400 with code `invalid_http`, where
uvicorn answers "Invalid HTTP request received." as plain text: an OpenAI client parses
every error's body as JSON. Both in the API's error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("batchpilot.http")

HEADERS_S = 20.0
BODY_S = 60.0
# the request line and headers, bytes: a bearer token, a traceparent and a browser's cookies
# fit many times over (nginx reads 32 KiB by default, Node 16 KiB)
MAX_HEAD_BYTES = 64 * 1024


class ReadDeadlines(HttpToolsProtocol):
    """uvicorn's httptools protocol with HEADERS_S and BODY_S (pass as Config(http=...))."""

    headers_s = HEADERS_S
    body_s = BODY_S
    max_head_bytes = MAX_HEAD_BYTES
    _timer: asyncio.TimerHandle | None = None
    _in_head = True  # reading a request's line and headers (or waiting for the next one)
    _head_bytes = 0  # bytes received while in the head, at least those the head took

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.headers_s, self._headers_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # counted after parsing, so that a chunk ending the headers (and carrying the body's
        # start) does not count; what the parser holds stays under the limit plus one read
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._disarm()
                self.transport.write(_error_response(
                    b"431 Request Header Fields Too Large", f"the request line and headers"
                    f" took over {self.max_head_bytes} bytes", "headers_too_large"))
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        self._arm(self.headers_s, self._headers_late)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._arm(self.body_s, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, late) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            log.info("closed a connection whose request headers took over %g s", self.headers_s)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refused, as JSON; the connection closes."""
        self._disarm()
        self.transport.write(_error_response(
            b"400 Bad Request", "the request is not valid HTTP/1.1 (its request line, a"
            " header, or the headers' size)", "invalid_http"))
        self.transport.close()

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the route's response, if any, goes nowhere
            self.transport.write(_error_response(
                b"408 Request Timeout",
                f"the request body did not arrive within {self.body_s:g} s", "request_timeout"))
        log.info("closed a connection whose request body took over %g s", self.body_s)
        self.transport.close()


def _error_response(status: bytes, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response in the API's error shape (control/api/errors.py), closing."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body)
