"""Forward one HTTP request from the ingress to a replica and relay its answer, turning a
replica that dies under it into an error the client can act on.

    before the replica accepted it     -> the caller may retry on another replica
    accepted, no response started      -> 502 {"error": {..., "code": "replica_failed"}}
    a stream already under way         -> a final chunk, finish_reason "error" + the error,
                                          then `data: [DONE]` (as one server ends a stream
                                          whose engine failed)
A client that leaves cancels the replica call: the replica's app sees a disconnect and
aborts the request (its KV is freed before the next step).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.responses import StreamingResponse

from control.api.errors import APIError, retry_after
from control.api.routed import ROUTED_HEADER

ACCEPT_TIMEOUT_S = 3.0  # a replica that has not taken a request by then: late (loads.py)
# the routing header is the ingress's to write (control/api/routed.py): a client's copy goes
HOP_HEADERS = {b"host", b"content-length", b"connection", b"transfer-encoding",
               ROUTED_HEADER.encode()}
DROP_REPLY_HEADERS = {"content-length", "transfer-encoding", "connection"}


class NotAccepted(Exception):
    """The replica never took the request: nothing ran, another replica may take it.
    `late`: it did not answer within ACCEPT_TIMEOUT_S (busy, or gone), rather than fail."""

    def __init__(self, message: str, late: bool = False):
        super().__init__(message)
        self.late = late


def replica_failed(replica_id: int, exc: BaseException) -> APIError:
    return APIError(502, f"replica {replica_id} failed while running this request"
                    f" ({type(exc).__name__}); it is being restarted, retry the request",
                    code="replica_failed", headers=retry_after(1.0))


async def open_call(gen: Any, replica_id: int) -> dict[str, Any]:
    """Wait for the replica to accept, then for its response start. Raises NotAccepted, or
    APIError(502) when it fails after accepting."""
    try:
        first = await asyncio.wait_for(gen.__anext__(), ACCEPT_TIMEOUT_S)
    except (asyncio.CancelledError, GeneratorExit):
        gen.cancel()
        raise
    except asyncio.TimeoutError:
        gen.cancel()
        raise NotAccepted(f"not accepted within {ACCEPT_TIMEOUT_S:g} s", late=True) from None
    except Exception as exc:
        gen.cancel()
        raise NotAccepted(f"{type(exc).__name__}: {exc}") from None
    if "accepted" not in first:
        raise NotAccepted(f"unexpected first message {sorted(first)}")
    try:
        return await gen.__anext__()
    except (asyncio.CancelledError, GeneratorExit):
        gen.cancel()
        raise
    except Exception as exc:
        gen.cancel()
        raise replica_failed(replica_id, exc) from None


def relay(gen: Any, start: dict[str, Any], replica_id: int, path: str,
          on_close: Any, on_failure: Any) -> StreamingResponse:
    """The client's response: the replica's status and headers, its body chunks as they come."""
    headers = [(k, v) for k, v in start["headers"] if k.lower() not in DROP_REPLY_HEADERS]
    sse = any(k.lower() == "content-type" and v.startswith("text/event-stream")
              for k, v in headers)
    response = StreamingResponse(_body(gen, replica_id, path, sse, on_close, on_failure),
                                 status_code=start["status"])
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    response.raw_headers.append((b"x-batchpilot-replica", str(replica_id).encode()))
    return response


async def _body(gen: Any, replica_id: int, path: str, sse: bool, on_close: Any,
                on_failure: Any) -> AsyncIterator[bytes]:
    last_data: bytes | None = None
    ended = False
    try:
        async for message in gen:
            chunk = message.get("body", b"")
            if sse:
                last_data = _last_data(chunk) or last_data
            yield chunk
        ended = True
    except Exception as exc:
        ended = True
        on_failure(exc)
        if sse:
            error = replica_failed(replica_id, exc)
            yield _error_chunk(last_data, path, error.body()["error"])
            yield b"data: [DONE]\n\n"
    finally:
        if not ended:  # the client left (cancelled): the replica aborts the request
            gen.cancel()
        on_close()


def _last_data(chunk: bytes) -> bytes | None:
    found = None
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: {"):
            found = event[len(b"data: "):]
    return found


def _error_chunk(last_data: bytes | None, path: str, error: dict[str, Any]) -> bytes:
    """A final chunk in the stream's own shape (id, object, model from its last chunk)."""
    try:
        last = json.loads(last_data) if last_data else {}
    except ValueError:
        last = {}
    chat = path.endswith("/chat/completions")
    obj = last.get("object") or ("chat.completion.chunk" if chat else "text_completion")
    if obj == "chat.completion.chunk":
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "error"}
    else:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "error"}
    data = {"id": last.get("id") or f"fleet-{uuid.uuid4().hex}", "object": obj,
            "created": last.get("created") or int(time.time()), "model": last.get("model", ""),
            "choices": [choice], "error": error}
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def upstream_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers as the replica's app should see them (routing headers such as
    X-Tenant, X-Lane, X-Priority, X-Deadline-Ms and Authorization pass through)."""
    return [(k, v) for k, v in raw if k.lower() not in HOP_HEADERS]



async def fan_out(handles: Sequence[Any], ids: Sequence[int], method: str, path: str,
                  body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
                  ) -> list[tuple[int, int, bytes]]:
    """Send one request to each replica of `ids` (those that may be called) -> [(replica
    id, status, body)]; a replica that fails reads as status 0 (/metrics, a config
    change)."""
    async def one(i: int) -> tuple[int, int, bytes]:
        try:
            return (i, *await _collect(handles[i], method, path, body, headers))
        except Exception as exc:  # down or restarting
            return i, 0, repr(exc).encode()

    return list(await asyncio.gather(*(one(i) for i in ids)))


async def _collect(handle: Any, method: str, path: str, body: bytes,
                   headers: list[tuple[bytes, bytes]] | None) -> tuple[int, bytes]:
    status, chunks = 0, []
    async for message in handle.options(stream=True).http.remote(
            method, path, b"", headers or [], body):
        status = message.get("status", status)
        chunks.append(message.get("body", b""))
    return status, b"".join(chunks)
