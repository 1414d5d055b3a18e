"""GET /v1/trace/series/{kind} (control/trace/routes.py): `by=` groups the latency series
only; on any other series it is a 400 naming it, never silently ignored."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from fixtures.trace_data import fill_trace, trace_routes_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    writer = fill_trace(str(tmp_path_factory.mktemp("series") / "trace.duckdb"))
    yield trace_routes_app(writer)
    writer.stop()


def _get(app: FastAPI, path: str, **params) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=60) as client:
            return await client.get(path, params=params)

    return asyncio.run(go())


def test_the_latency_series_groups_by_tenant(app):
    reply = _get(app, "/v1/trace/series/latency", by="tenant")
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("kind", ["steps", "queues", "outcomes"])
def test_by_on_another_series_is_a_400_naming_it(app, kind):
    reply = _get(app, f"/v1/trace/series/{kind}", by="lane")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "by" and "latency series only" in error["message"]
