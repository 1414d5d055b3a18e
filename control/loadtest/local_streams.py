"""Streams to a server on this machine over control/loadtest/sse_transport.py: each reply
kept with its reads' arrival times and parsed when it ends, where httpx's parsing of each
chunk as it comes would take a tenth of a 2-core machine from the server
(control/loadtest/client_cost.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from control.loadtest import sse_transport
from control.loadtest.client_cost import same_machine
from control.loadtest.records import RequestResult
from control.loadtest.wire import (
    body_for,
    headers_for,
    json_object,
    refused,
    stream_ended,
    take_event,
)


@dataclass(frozen=True)
class LocalStreams:
    """Where streamed requests go over sse_transport: a plain-HTTP server on this machine."""

    host: str
    port: int
    path: str  # the completions route, under the URL's own path
    headers: dict[str, str]  # sent with every request (the token)
    timeout_s: float  # between reads


def local_streams(url: str, headers: dict[str, str], timeout_s: float) -> LocalStreams | None:
    """A LocalStreams for `url` when it is plain HTTP on this machine, else None."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not same_machine(url):
        return None
    return LocalStreams(parts.hostname or "", parts.port or 80,
                        parts.path.rstrip("/") + "/v1/completions", headers, timeout_s)


async def stream_local(streams: LocalStreams, p, prompt, model, result: RequestResult,
                        t0: float) -> None:
    payload = json.dumps(body_for(p, prompt, model)).encode()
    request = sse_transport.request_bytes(
        streams.host, streams.port, streams.path, payload,
        {**streams.headers, **headers_for(p, result.sends - 1)})
    reads: list[tuple[float, bytes]] = []
    try:
        await sse_transport.post(streams.host, streams.port, request, streams.timeout_s,
                                 reads=reads)
    except (asyncio.CancelledError, sse_transport.ReplyTimeout):
        take_partial(result, reads, t0)  # the chunks that came before the client gave up
        raise
    reply = sse_transport.parse(reads)
    reason = _take_reply(result, reply, t0)
    if reply.status != 200:
        refused(result, reply.status, reply.headers, json_object(reply.body))
        result.e2e_s = reply.ended_at - t0
        return
    if not reply.complete:  # as httpx, which raises on a body cut short
        raise sse_transport.ReplyError("the server closed the stream before its end")
    stream_ended(result, reply.ended_at - t0, reason)


def take_partial(result: RequestResult, reads: list[tuple[float, bytes]], t0: float) -> None:
    """The events of a reply cut off by the client, as httpx's client had them by then."""
    with contextlib.suppress(sse_transport.ReplyError):  # (not even the head came)
        _take_reply(result, sse_transport.parse(reads), t0)


def _take_reply(result: RequestResult, reply: sse_transport.RawReply, t0: float,
                ) -> str | None:
    """The reply's status, id and (on a 200) its events into `result`; the finish reason."""
    result.http_status = reply.status
    result.request_id = reply.headers.get("x-batchpilot-request-id", "")
    reason = None
    if reply.status == 200:
        for arrived, data in reply.data_lines:
            if data != b"[DONE]":
                reason = take_event(result, json_object(data), arrived - t0, reason)
    return reason
