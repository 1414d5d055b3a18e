"""JSON bodies whose text is not valid Unicode refused with a 400, before any route sees
them.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`), and Python's parser turns it into a
str that cannot be encoded: the tokenizer, the prefix hash of a `cache_salt` (in the engine
thread, inside a step), a header that names an ignored field, all raise on it. One check at
the door, for every route of every app (server, edge, fleet ingress), instead of one per
field. Cost on ordinary bodies: one regex scan for a surrogate escape; only a body with one
is parsed and walked.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.api.errors import APIError

# a surrogate's escape (\ud800-\udfff), or an escaped backslash before "ud8..": the parse
# below tells them apart
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate_at(value: object) -> str | None:
    """The path (`body.messages.0.content`) of the first str in `value` (keys included)
    that is not valid Unicode; None when all are."""
    stack: list[tuple[object, str]] = [(value, "body")]
    while stack:  # not recursive: a body may nest thousands deep
        item, path = stack.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return path
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not _encodes(key):
                    return f"{path} (a key)"
                stack.append((inner, f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((inner, f"{path}.{i}") for i, inner in enumerate(item))
    return None


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class UnicodeBody:
    """Pure ASGI middleware: an HTTP body that is JSON with a lone surrogate in any string
    gets a 400 naming where; every other body passes unchanged (read once, replayed)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:  # the size is bounded by BodyLimit, outside this middleware
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay(b"".join(chunks), receive, message), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        path = _bad_text(body)
        if path is not None:
            error = APIError(400, f"{path} is not valid Unicode text: it holds a lone UTF-16"
                             " surrogate (a \\ud800-\\udfff escape without its pair)",
                             code="invalid_text", param=path)
            await error.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


def _bad_text(body: bytes) -> str | None:
    if _SURROGATE_ESCAPE.search(body) is None:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the route answers that in its own words
    return lone_surrogate_at(parsed)


def _replay(body: bytes, receive: Receive, last: Message | None = None) -> Receive:
    """A receive that gives the whole body once, then `last` (a disconnect met while
    reading), then whatever the server sends next (a disconnect, for a route watching)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
