"""Run one HTTP request through an ASGI app in-process, as a stream of messages: how a
replica serves what the ingress forwards, through the very app `batchpilot serve` runs.

    {"status": 200, "headers": [[name, value], ...]}   once, first
    {"body": b"..."}                                    then each chunk as the app sends it

When the consumer stops early (the ingress's client left, so Serve cancelled the call), the
app sees `http.disconnect`, exactly as under uvicorn: control/api/generation.py aborts the
request and the engine frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message

DISCONNECT_GRACE_S = 5.0  # after a disconnect, time for the app to abort and return


async def call_asgi(app: ASGIApp, method: str, path: str, query: bytes,
                    headers: list[tuple[bytes, bytes]], body: bytes,
                    ) -> AsyncIterator[dict[str, Any]]:
    messages: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_taken = False

    async def receive() -> Message:
        nonlocal body_taken
        if not body_taken:
            body_taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()  # every later receive: the disconnect, once it happens
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        messages.put_nowait(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query, "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("fleet-replica", 0)}
    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    complete = False  # the whole response was handed out
    try:
        while True:
            message = await messages.get()
            if message is None:
                task.result()  # the app returned (or raised) without finishing a response
                return
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [[k.decode("latin-1"), v.decode("latin-1")]
                                   for k, v in message.get("headers", [])]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield {"body": bytes(message["body"])}
                if not message.get("more_body", False):
                    complete = True
                    return
    finally:
        if not task.done():
            if not complete:
                gone.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), DISCONNECT_GRACE_S)
            task.cancel()
