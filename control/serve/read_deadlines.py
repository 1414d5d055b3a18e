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
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("batchpilot.http")

HEADERS_S = 20.0
BODY_S = 60.0


class ReadDeadlines(HttpToolsProtocol):
    """uvicorn's httptools protocol with HEADERS_S and BODY_S (pass as Config(http=...))."""

    headers_s = HEADERS_S
    body_s = BODY_S
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.headers_s, self._headers_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.headers_s, self._headers_late)

    def on_headers_complete(self) -> None:
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

    def _body_late(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the route's response, if any, goes nowhere
            self.transport.write(_request_timeout(self.body_s))
        log.info("closed a connection whose request body took over %g s", self.body_s)
        self.transport.close()


def _request_timeout(seconds: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request body did not arrive within {seconds:g} s",
        "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body)
