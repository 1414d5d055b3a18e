"""Streamed POSTs over plain asyncio connections, parsed once the reply has ended.

httpx spends ~100 us of Python on each SSE chunk (h11's parser, anyio, line splitting);
at a loaded server's ~1,300 chunks a second that is a tenth of a 2-core machine, which a
client on the server's own machine takes from the server. This transport only keeps each
read with its arrival time (time.monotonic seconds) while the reply streams; the HTTP
framing and the SSE lines are parsed after the connection closes, and each `data:` line is
timed by the read that completed it, as a client parsing on arrival would time it.

One request per connection (`Connection: close`): the server closing it ends the reply.
A connect costs ~0.1 ms on loopback; across a network it would add a round trip to each
TTFT, so callers use this for servers on their own machine (client_cost.same_machine).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from dataclasses import dataclass


class ReplyError(Exception):
    """The server's reply could not be read: no HTTP/1.1 head, or a connection that broke."""


class ReplyTimeout(Exception):
    """No connection, or no byte of the reply, within the timeout."""


@dataclass
class RawReply:
    status: int
    headers: dict[str, str]  # names lower-case
    body: bytes  # the payload, chunked framing removed
    data_lines: list[tuple[float, bytes]]  # (arrival, payload after "data: ") in order
    ended_at: float  # arrival of the last byte (time.monotonic)
    complete: bool  # the body's framing ended (last chunk, or Content-Length reached)


MAX_REPLY_BYTES = 64 * 2**20  # a reply kept whole until it ends: bounded, as a client must be


class _Recorder(asyncio.Protocol):
    """Writes one request, then keeps every read with its arrival time until the close
    (or until the reply passes max_bytes: then it closes the connection itself)."""

    def __init__(self, request: bytes, closed: asyncio.Future,
                 reads: list[tuple[float, bytes]], max_bytes: int) -> None:
        self.request, self.closed, self.reads = request, closed, reads
        self.max_bytes, self.size = max_bytes, 0
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.monotonic(), data))
        self.size += len(data)
        if self.size > self.max_bytes and not self.closed.done():
            self.closed.set_result(ReplyError(f"the reply passed {self.max_bytes} bytes"))
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)


def request_bytes(host: str, port: int, path: str, payload: bytes,
                  headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 POST of a JSON `payload`. Raises ValueError on a header that would
    split the request (CR or LF in a name or value)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address
    lines = [f"POST {path} HTTP/1.1", f"Host: {authority}",
             "Content-Type: application/json", "Accept: text/event-stream",
             f"Content-Length: {len(payload)}", "Connection: close"]
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n"):
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


async def post(host: str, port: int, request: bytes, timeout_s: float,
               connect_timeout_s: float = 30.0,
               reads: list[tuple[float, bytes]] | None = None,
               max_bytes: int = MAX_REPLY_BYTES) -> list[tuple[float, bytes]]:
    """Send `request` and wait for the server to close: every read with its arrival, into
    `reads` when given (so a caller that gives up still has what arrived). ReplyTimeout
    when no read came for `timeout_s` (between reads, as httpx's read timeout).
    ReplyError when the reply passes `max_bytes` (the connection is closed). Cancelling the
    wait closes the connection (a client giving up: the server aborts the request)."""
    loop = asyncio.get_running_loop()
    closed: asyncio.Future = loop.create_future()
    recorder = _Recorder(request, closed, [] if reads is None else reads, max_bytes)
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: recorder, host, port), connect_timeout_s)
    except TimeoutError:
        raise ReplyTimeout(f"no connection within {connect_timeout_s:g} s") from None
    sent_at = time.monotonic()
    try:
        while not closed.done():
            last = recorder.reads[-1][0] if recorder.reads else sent_at
            left = last + timeout_s - time.monotonic()
            if left <= 0:
                raise ReplyTimeout(f"no answer within {timeout_s:g} s")
            await asyncio.wait([closed], timeout=left)
        exc = closed.result()
    finally:
        transport.close()
    if isinstance(exc, ReplyError):  # over max_bytes
        raise exc
    if exc is not None and not recorder.reads:
        raise ReplyError(f"the connection broke before any reply: {exc!r}")
    return recorder.reads


def dechunk(body: bytes) -> tuple[list[tuple[int, int, int]], bool]:
    """The chunks of a `Transfer-Encoding: chunked` body (RFC 9112 7.1) as (offset in
    `body`, offset in the payload, length), and whether the last chunk arrived; a body cut
    short gives what arrived. Chunk extensions are ignored."""
    spans, at, done = [], 0, 0
    while True:
        line_end = body.find(b"\r\n", at)
        if line_end < 0:
            return spans, False
        size = int(body[at:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return spans, True
        size = min(size, len(body) - line_end - 2)
        spans.append((line_end + 2, done, size))
        done += size
        at = line_end + 2 + size + 2


def parse(reads: list[tuple[float, bytes]]) -> RawReply:
    """The reply that `reads` (post()'s) carried. Raises ReplyError on one that is not
    HTTP/1.1 (no head, a malformed status line, chunk size or Content-Length)."""
    try:
        return _parse(reads)
    except (ValueError, IndexError) as exc:
        raise ReplyError(f"a malformed reply ({exc})") from None


def _parse(reads: list[tuple[float, bytes]]) -> RawReply:
    raw = b"".join(data for _, data in reads)
    ends = list(itertools.accumulate(len(data) for _, data in reads))
    head_end = raw.find(b"\r\n\r\n")
    lines = raw[:max(head_end, 0)].split(b"\r\n")
    if head_end < 0 or not lines[0].startswith(b"HTTP/1."):
        raise ReplyError(f"not an HTTP/1.1 reply: {raw[:80]!r}")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower().decode("latin-1"): v.strip().decode("latin-1")
               for k, _, v in (line.partition(b":") for line in lines[1:])}
    at = head_end + 4
    if headers.get("transfer-encoding", "").lower() == "chunked":
        spans, complete = dechunk(raw[at:])
        spans = [(at + start, done, size) for start, done, size in spans]
    else:
        length = int(headers.get("content-length", len(raw) - at))
        spans, complete = [(at, 0, len(raw) - at)], len(raw) - at >= length
    body = b"".join(raw[start:start + size] for start, _, size in spans)

    span_starts = [done for _, done, _ in spans]

    def arrival(offset: int) -> float:  # of the payload byte at `offset`
        start, done, _ = spans[bisect.bisect_right(span_starts, offset) - 1]
        return reads[bisect.bisect_right(ends, start + offset - done)][0]

    lines_at, data_lines = 0, []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):  # timed by its line end (or last byte, if cut short)
            end = min(lines_at + len(line), len(body) - 1)
            data_lines.append((arrival(end), line[6:].rstrip(b"\r")))
        lines_at += len(line) + 1
    return RawReply(status, headers, body, data_lines, reads[-1][0], complete)
