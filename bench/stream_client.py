"""Many streams at once from a client that costs the machine almost nothing meanwhile.

The serving benches run their client on the same 2 cores as the server, whose engine
runs one OpenMP thread per core: every millisecond the client holds a core stalls a
parallel region's barrier for as long. The streams go over control/loadtest/sse_transport
(the load tester's transport for a server on its own machine): it keeps the bytes of each
read while the run lasts and parses the HTTP framing and SSE events after the connection
closes; this module waits for every stream before parsing any, so no parsing falls inside
the timed span.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from control.loadtest import sse_transport


@dataclass
class StreamResult:
    """One request's reply: status, the SSE events' JSON objects in order, and when its
    last byte arrived (time.monotonic seconds)."""

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


def stream_result(reads: list[tuple[float, bytes]]) -> StreamResult:
    """Status and SSE events of one whole reply as sse_transport.post received it."""
    reply = sse_transport.parse(reads)
    if not reply.complete:
        raise ConnectionError("a stream broke before its end")
    result = StreamResult(reply.status, closed_at=reply.ended_at)
    if reply.status == 200:
        result.events = [json.loads(data) for _, data in reply.data_lines
                         if data.startswith(b"{")]
    return result


async def stream_all(url: str, path: str, bodies: list[dict],
                     timeout_s: float = 600.0) -> tuple[float, list[StreamResult]]:
    """Every body POSTed at once, one connection each: (time.monotonic when the first
    connection was asked for, the replies in the bodies' order). Raises if a connection
    broke (refused, reset) rather than counting it as a reply."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    requests = [sse_transport.request_bytes(host, int(port), path, json.dumps(body).encode(),
                                            {}) for body in bodies]
    start = time.monotonic()
    received = await asyncio.gather(*(sse_transport.post(host, int(port), r, timeout_s)
                                      for r in requests))
    return start, [stream_result(reads) for reads in received]
