"""Issue #29 (13): small parsing faults a client or an operator can trip.

(a) `'²'.isdigit()` is True but `int('²')` raises: an X-Batchpilot-Replica of '²' (one
latin-1 byte, as Starlette decodes header bytes) was a 500, not a 400 naming the header;
a fleet trace file `replica-².duckdb` made the glob unreadable.
(b) `vllm:cache_config_info` said enable_prefix_caching="True" whatever the engine ran."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures.fleet_fakes import FakeReplica
from fixtures.serving import asgi_client, make_engine, wait_until_idle
from prometheus_client.parser import text_string_to_metric_families

from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.router import RoutingPolicy
from control.serve.settings import ServeSettings
from control.trace.fleet_db import expand

NOT_ASCII_DIGITS = ["²", "³", "¹"]  # str.isdigit() says yes to each; int() raises


def ask_fleet(path: str, replica_header: bytes | list[bytes]) -> httpx.Response:
    """GET `path` at a 2-replica fleet with X-Batchpilot-Replica (each of a list sent)."""
    values = replica_header if isinstance(replica_header, list) else [replica_header]
    async def main() -> httpx.Response:
        fleet = FleetIngress([LocalHandle(FakeReplica(i)) for i in range(2)],
                             RoutingPolicy(), poll_s=0.02)
        fleet.start_polls()
        await wait_healthy(lambda: all(v.healthy for v in fleet.table.views))
        transport = httpx.ASGITransport(app=build_app(fleet))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as c:
                return await c.get(path, headers=[("X-Batchpilot-Replica", v) for v in values])
        finally:
            await fleet.stop_polls()
    return asyncio.run(main())


@pytest.mark.parametrize("path", ["/control/config", "/v1/trace/summary", "/tokenize"])
@pytest.mark.parametrize("value", NOT_ASCII_DIGITS)
def test_a_superscript_replica_id_is_a_400_naming_the_header(path, value):
    reply = ask_fleet(path, value.encode("latin-1"))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "X-Batchpilot-Replica"
    assert "X-Batchpilot-Replica=" in error["message"] and "0..1" in error["message"]


@pytest.mark.parametrize("value", [b"2", b"0000000", b"1" + b"0" * 4999, [b"0", b"1"]],
                         ids=["past-the-fleet", "seven-digits", "past-int-limit", "twice"])
def test_a_replica_id_the_fleet_does_not_have_is_a_400_naming_the_header(value):
    """One id in 0..N-1 as at most 6 ASCII digits, sent once: N itself would index past
    the handles, a 5,000-digit id is past int()'s limit (both were 500s), and a second
    header (a proxy's) must not lose to the first silently."""
    reply = ask_fleet("/control/config", value)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "X-Batchpilot-Replica"


def test_a_fleet_trace_glob_with_a_superscript_replica_file_still_reads(tmp_path):
    for name in ("replica-10", "replica-2", "replica-²"):
        (tmp_path / f"{name}.duckdb").write_bytes(b"")
    parts = expand(str(tmp_path / "replica-*.duckdb"))
    assert list(parts) == ["2", "10", "²"]  # numeric ids in number order, then the rest


def cache_config_info(tiny_loaded, tmp_path, enable_prefix_caching: bool) -> dict:
    config = {"serving": {"enable_prefix_caching": enable_prefix_caching}}
    engine, _, settings = make_engine(tiny_loaded, config=config, tmp_path=tmp_path,
                                      settings=ServeSettings(model="tiny",
                                                             metrics_compat="vllm"))

    async def scrape() -> str:
        async with asgi_client(engine, settings) as client:
            reply = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": "hello", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            await wait_until_idle(engine)  # the engine has reported its gauges
            return (await client.get("/metrics")).text

    families = {f.name: f for f in text_string_to_metric_families(asyncio.run(scrape()))}
    (sample,) = families["vllm:cache_config_info"].samples
    return sample.labels


@pytest.mark.parametrize("enabled", [False, True])
def test_cache_config_info_reports_the_engines_prefix_caching(tiny_loaded, tmp_path,
                                                               enabled):
    labels = cache_config_info(tiny_loaded, tmp_path, enabled)
    assert labels["enable_prefix_caching"] == str(enabled)
    assert labels["block_size"] == "16"
