"""How a replica serves what the ingress forwards (control/fleet/asgi_call.py), over a small
ASGI app instead of the server's: the query reaches the app, and a consumer that stops early
is a client that left (the app sees http.disconnect, as under uvicorn)."""

from __future__ import annotations

import asyncio

from control.fleet import asgi_call
from control.fleet.asgi_call import call_asgi


def test_the_query_string_reaches_the_app():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["query_string"]})

    async def go():
        return [m async for m in call_asgi(app, "GET", "/v1/trace/slow", b"limit=3&by=ttft_s",
                                           [], b"")]
    assert asyncio.run(go()) == [{"status": 200, "headers": []},
                                 {"body": b"limit=3&by=ttft_s"}]


def test_a_consumer_that_stops_early_is_a_disconnect_the_app_sees(monkeypatch):
    """The ingress's client left mid-stream: the app (generation.py) must see the disconnect
    to abort the request and free its KV blocks; never just be cancelled after a grace."""
    monkeypatch.setattr(asgi_call, "DISCONNECT_GRACE_S", 2.0)
    seen: list[str] = []

    async def app(scope, receive, send):
        await receive()  # the body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"chunk", "more_body": True})
        seen.append((await receive())["type"])  # what the client did next

    async def go():
        stream = call_asgi(app, "POST", "/v1/completions", b"", [], b"{}")
        assert (await stream.__anext__())["status"] == 200
        assert await stream.__anext__() == {"body": b"chunk"}
        await stream.aclose()  # the consumer stops: the client left

    asyncio.run(go())
    assert seen == ["http.disconnect"]
