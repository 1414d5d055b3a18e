"""Request bodies bounded before anything parses them (limit max_body_bytes).

    Content-Length over the limit -> 413 at once, nothing read into memory
    no Content-Length (chunked) -> counted as it arrives; 413 once it passes the limit

A refused body is first read to its end without keeping it (at most DRAIN_BYTES), so a
client that sends its whole body before it reads an answer gets the 413 instead of a reset
connection; then the connection is closed.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.api.errors import APIError

DRAIN_BYTES = 256 * 1024 * 1024


class BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` once a body without Content-Length passes the limit. An HTTP
    exception, so that FastAPI's body parsing passes it on (it turns any other error while
    reading the body into its own 400) and the app's handler answers it."""

    def __init__(self, max_bytes: int):
        super().__init__(413, _message("more bytes", max_bytes), headers={"Connection": "close"})


class BodyLimit:
    """Pure ASGI middleware: the body of every HTTP request at most `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, declared)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    await _drain(receive)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:  # a route that read the body itself, outside FastAPI's parsing
            if not started:
                await self._refuse(scope, receive, send, None, drain=False)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send,
                      declared: int | None, *, drain: bool = True) -> None:
        if drain:
            await _drain(receive)
        size = f"{declared} bytes, more" if declared is not None else "more bytes"
        error = APIError(413, _message(size, self.max_bytes), code="body_too_large",
                         param="max_body_bytes", headers={"Connection": "close"})
        await error.response()(scope, receive, send)


def _message(size: str, max_bytes: int) -> str:
    return (f"the request body has {size} than the limit of {max_bytes} bytes"
            " (limit max_body_bytes)")


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of the body, at most DRAIN_BYTES of it."""
    drained = 0
    while drained < DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        drained += len(message.get("body", b""))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdecimal() else None
    return None
