"""BodyLimit (control/api/body_limit.py) on a body sent without Content-Length: the limit
itself is taken, one byte more is a 413, whatever the chunks' sizes."""

from __future__ import annotations

import asyncio

import httpx

from control.api.body_limit import BodyLimit


async def echo_size(scope, receive, send):
    """An app that reads the whole body itself and answers its size."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def post_chunked(total: int, limit: int = 1000) -> httpx.Response:
    async def chunks():  # no Content-Length: counted as it arrives
        yield b"x" * (total - 1)
        yield b"x"

    async def send():
        transport = httpx.ASGITransport(app=BodyLimit(echo_size, max_bytes=limit))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/", content=chunks())

    return asyncio.run(send())


def test_a_chunked_body_at_the_limit_is_taken_and_one_byte_over_is_a_413():
    at, over = post_chunked(1000), post_chunked(1001)
    assert (at.status_code, at.text) == (200, "1000")
    assert over.status_code == 413 and over.json()["error"]["code"] == "body_too_large"
