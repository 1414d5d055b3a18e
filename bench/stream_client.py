"""A streaming HTTP client that costs the machine almost nothing while it receives.

The serving benches run their client on the same 2 cores as the server, whose engine
runs one OpenMP thread per core: every millisecond the client holds a core stalls a
parallel region's barrier for as long. httpx spends ~100 us of Python per SSE chunk
(h11's parser, anyio, line splitting, then our json.loads); at ~1,300 chunks a second
that is a tenth of the machine, which a real deployment's clients, on other machines,
never take from the server. This client only appends the bytes it receives while the
run lasts (one `data_received` call per read); it parses the HTTP framing and the SSE
events after every stream has ended, outside the timed span.

One request per connection (`Connection: close`): the server closing the connection
marks the stream's end.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    """One request's reply: status, the SSE events' JSON objects in order, and when its
    connection closed (time.perf_counter seconds)."""

    status: int
    events: list[dict] = field(default_factory=list)
    closed_at: float = 0.0

    def completion_tokens(self) -> int:
        """The usage the stream ended with (stream_options.include_usage), 0 without."""
        usage = [e["usage"] for e in self.events if e.get("usage")]
        return usage[-1]["completion_tokens"] if usage else 0

    def errored(self) -> bool:
        """Whether any choice ended with finish_reason "error" (the server's named failure
        of a request that had already started streaming)."""
        return any(c.get("finish_reason") == "error"
                   for e in self.events for c in e.get("choices") or ())


class _Receiver(asyncio.Protocol):
    """Sends one request, then keeps every byte until the server closes."""

    def __init__(self, request: bytes, done: asyncio.Future) -> None:
        self.request, self.done, self.received = request, done, bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result((time.perf_counter(), bytes(self.received), exc))


def request_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    return head.encode() + payload


def dechunk(body: bytes) -> bytes:
    """The payload of a `Transfer-Encoding: chunked` body (RFC 9112 7.1); a body cut short
    (the server closed mid-chunk) gives what arrived."""
    out, at = bytearray(), 0
    while True:
        line_end = body.find(b"\r\n", at)
        if line_end < 0:
            return bytes(out)
        size = int(body[at:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        out += body[line_end + 2:line_end + 2 + size]
        at = line_end + 2 + size + 2


def parse_reply(raw: bytes, closed_at: float) -> StreamResult:
    """Status and SSE events of one whole HTTP/1.1 reply as received."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 "):
        raise ValueError(f"not an HTTP/1.1 reply: {raw[:80]!r}")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(b":") for line in lines[1:])}
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = dechunk(body)
    result = StreamResult(status, closed_at=closed_at)
    if status == 200:
        result.events = [json.loads(line[6:]) for line in body.split(b"\n")
                         if line.startswith(b"data: {")]
    return result


async def stream_all(url: str, path: str, bodies: list[dict]) -> tuple[float, list[StreamResult]]:
    """Every body POSTed at once, one connection each: (perf_counter when the first
    connection was asked for, the replies in the bodies' order). Raises if a connection
    broke (refused, reset) rather than counting it as a reply."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    loop = asyncio.get_running_loop()
    requests = [request_bytes(host, int(port), path, body) for body in bodies]
    futures = [loop.create_future() for _ in requests]
    start = time.perf_counter()
    await asyncio.gather(*(loop.create_connection(lambda r=r, f=f: _Receiver(r, f),
                                                  host, int(port))
                           for r, f in zip(requests, futures, strict=True)))
    replies = []
    for closed_at, raw, exc in await asyncio.gather(*futures):
        if exc is not None:
            raise ConnectionError(f"a stream broke: {exc!r}")
        replies.append(parse_reply(raw, closed_at))
    return start, replies
