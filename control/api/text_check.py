"""JSON bodies whose text is not valid Unicode, or that spell a number JSON has not,
refused with a 400, before any route sees them.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`), and Python's parser turns it into a
str that cannot be encoded: the tokenizer, the prefix hash of a `cache_salt` (in the engine
thread, inside a step), a header that names an ignored field, all raise on it. Python's
parser also takes `NaN`, `Infinity` and `-Infinity`, which JSON (RFC 8259) has not: a
field's range check then said `temperature: Input should be less than or equal to 2` for a
NaN, and an ignored field kept one silently. One check at the door, for every route of
every app (server, edge, fleet ingress), instead of one per field. Cost on ordinary bodies:
one regex scan; only a body with a surrogate escape or one of those words is parsed and
walked.
"""

from __future__ import annotations

import json
import math
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.api.errors import APIError

# a surrogate's escape (\ud800-\udfff), or an escaped backslash before "ud8..", and the
# words Python's parser reads as numbers, or the same in a string: the parse tells them apart
_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|NaN|Infinity")


def lone_surrogate_at(value: object) -> str | None:
    """The path (`body.messages.0.content`) of the first str in `value` (keys included)
    that is not valid Unicode; None when all are."""
    found = _first_bad(value, numbers=False)
    return None if found is None else found[0]


def _first_bad(value: object, numbers: bool = True) -> tuple[str, str] | None:
    """(path, "text" | "number") of the first str that is not valid Unicode, or (with
    `numbers`) float that is not finite, in `value`, keys included; None: there is none."""
    stack: list[tuple[object, str]] = [(value, "body")]
    while stack:  # not recursive: a body may nest thousands deep
        item, path = stack.pop()
        if numbers and isinstance(item, float) and not math.isfinite(item):
            return path, "number"
        if isinstance(item, str):
            if not _encodes(item):
                return path, "text"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not _encodes(key):
                    return f"{path} (a key)", "text"
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
        error = _refusal(body)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)


def _refusal(body: bytes) -> APIError | None:
    if _SUSPECT.search(body) is None:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the route answers that in its own words
    found = _first_bad(parsed)
    if found is None:
        return None
    path, kind = found
    if kind == "text":
        return APIError(400, f"{path} is not valid Unicode text: it holds a lone UTF-16"
                        " surrogate (a \\ud800-\\udfff escape without its pair)",
                        code="invalid_text", param=path)
    return APIError(400, f"{path} is not a JSON number: JSON has no NaN or Infinity; send a"
                    " finite number", code="invalid_value", param=path)


def _replay(body: bytes, receive: Receive, last: Message | None = None) -> Receive:
    """A receive that gives the whole body once, then `last` (a disconnect met while
    reading), then whatever the server sends next (a disconnect, for a route watching)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if last is not None:
        pending.append(last)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
