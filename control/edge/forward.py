"""Forwarding one request to the server over its Unix socket, the answer streamed back
chunk by chunk as the server writes it (SSE tokens are not held).

Hop-by-hop headers (RFC 9110 7.6.1) are not forwarded either way; Host is, so the server's
origin checks see what the client sent. A client's own EDGE_ELAPSED_HEADER is dropped: only
the edge sets it. A client that disconnects closes the upstream answer, which the server
sees as that client's disconnect (its request aborted, its blocks freed).
"""

from __future__ import annotations

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from control.api.arrival import EDGE_ELAPSED_HEADER, seconds_since_arrival
from control.api.errors import APIError, retry_after

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-connection",
                        "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"})
UNAVAILABLE_RETRY_S = 1.0


class Upstream:
    """One pooled HTTP client to the server's socket; no timeouts of its own (the server
    bounds every request's time, and a stream may run for minutes)."""

    def __init__(self, uds: str):
        transport = httpx.AsyncHTTPTransport(uds=uds)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://batchpilot",
                                        timeout=httpx.Timeout(None, connect=5.0),
                                        limits=httpx.Limits(max_connections=None,
                                                            max_keepalive_connections=64))

    async def close(self) -> None:
        await self.client.aclose()

    async def forward(self, request: Request, body: bytes) -> Response:
        """`request` (its `body` already read) sent on; the server's answer streamed back,
        or 503 naming the reason when the server cannot be reached."""
        headers = [(k, v) for k, v in request.headers.raw
                   if k.decode("latin-1").lower() not in HOP_BY_HOP
                   and k.decode("latin-1").lower() != EDGE_ELAPSED_HEADER]
        headers.append((EDGE_ELAPSED_HEADER.encode(),
                        f"{seconds_since_arrival(request):.6f}".encode()))
        target = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
        if request.url.query:
            target += "?" + request.url.query
        outgoing = self.client.build_request(request.method, target, headers=headers,
                                             content=body)
        try:
            answer = await self.client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            raise APIError(503, f"the engine's process did not answer ({type(exc).__name__});"
                           " retry shortly", code="unavailable",
                           headers=retry_after(UNAVAILABLE_RETRY_S)) from None
        reply = StreamingResponse(_chunks(answer), status_code=answer.status_code,
                                  background=BackgroundTask(answer.aclose))
        reply.raw_headers = [(k, v) for k, v in answer.headers.raw  # repeated ones kept
                             if k.decode("latin-1").lower() not in HOP_BY_HOP]
        return reply


async def _chunks(answer: httpx.Response):
    """The answer's bytes as they arrive (still encoded as the server encoded them)."""
    try:
        async for chunk in answer.aiter_raw():
            yield chunk
    finally:  # a client gone mid-stream: the server hears of it at once
        await answer.aclose()
