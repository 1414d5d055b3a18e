"""The fleet's ingress is a front door like a single server's: a body over the limit is a
413 before the ingress buffers it to forward, and a page in the operator's browser cannot
steer a tokenless fleet on loopback (foreign Origin, non-JSON change, rebound Host)."""

from __future__ import annotations

import asyncio

import httpx
from fixtures.fleet_fakes import FakeReplica

from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.router import RoutingPolicy


def ask(calls, **ingress) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        fleet = FleetIngress([LocalHandle(FakeReplica(i)) for i in range(2)],
                             RoutingPolicy(), poll_s=0.02, **ingress)
        fleet.start_polls()
        await wait_healthy(lambda: all(v.healthy for v in fleet.table.views))
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://127.0.0.1") as c:
                return [await c.request(method, path, **kw) for method, path, kw in calls]
        finally:
            await fleet.stop_polls()
    return asyncio.run(main())


def test_a_body_over_the_limit_never_reaches_a_replica():
    replies = ask([("POST", "/v1/completions", {"content": b"x" * 2001, "headers": {
        "Content-Type": "application/json"}})], max_body_bytes=2000)
    assert replies[0].status_code == 413, replies[0].text
    assert "max_body_bytes" in replies[0].json()["error"]["message"]


def test_a_page_in_the_browser_cannot_steer_a_tokenless_fleet():
    replies = ask([
        ("POST", "/control/drain", {"json": {}, "headers": {"Origin": "http://evil.example"}}),
        ("POST", "/control/drain", {"content": b"{}", "headers": {
            "Content-Type": "text/plain"}}),
        ("GET", "/readyz", {"headers": {"Host": "rebound.example"}}),
        ("GET", "/healthz", {}),
    ], loopback=True)
    assert [r.status_code for r in replies] == [403, 415, 421, 200], [r.text for r in replies]
