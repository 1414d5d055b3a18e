"""Every query of the Grafana boards and every alert rule, run by a real Prometheus (the
Debian `prometheus` binary) that scrapes a live server (tiny model, uvicorn in a thread)
after a short workload: streams on three lanes and three tenants, a live config change,
rejections, a timeout and a client that leaves."""

from __future__ import annotations

import asyncio
import json
import time
from itertools import product

import httpx
import pytest
import yaml
from fixtures.grafana import BOARDS, GRAFANA, Prometheus, board_queries, promql
from fixtures.serving import LiveServer, make_engine, wait_until_idle

from control.serve.settings import ServeSettings

LANES = ("interactive", "long_context", "batch")
TENANTS = ("acme", "globex", "zeta")  # zeta is not in metrics_tenants: labelled "other"
PREFIX = "You are the batchpilot test assistant. Answer briefly and politely. " * 2
async def workload(url: str, engine, prom: Prometheus) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async def complete(lane: str, tenant: str, i: int, stream: bool = True, **extra):
            headers = {"X-Lane": lane, "X-Tenant": tenant, **extra.pop("headers", {})}
            body = {"model": "tiny", "prompt": f"{PREFIX}question {i}", "max_tokens": 8,
                    "ignore_eos": True, "stream": stream, **extra}
            async with client.stream("POST", "/v1/completions", json=body,
                                     headers=headers) as resp:
                return resp.status_code, [line async for line in resp.aiter_lines()]

        async def wave(offset: int) -> None:
            replies = await asyncio.gather(*(complete(lane, tenant, offset + i) for i, (
                lane, tenant) in enumerate(product(LANES, TENANTS))))
            assert all(status == 200 for status, _ in replies), replies

        await wave(0)
        # the gauges appear at the first step: let Prometheus see version 1 before 2
        await asyncio.to_thread(prom.until, lambda: prom.query(
            "batchpilot_config_version == 1"), "config version 1 never scraped")
        config = await client.get("/control/config")
        changed = await client.patch("/control/config", headers={
            "If-Match": config.headers["etag"]}, json={"changes": {"max_num_seqs": 3},
                                                       "reason": "grafana test"})
        assert changed.status_code == 200, changed.text
        await wave(100)
        too_long = await complete("interactive", "acme", 0, max_tokens=100_000)
        unknown = await complete("nope", "globex", 0)
        assert too_long[0] == unknown[0] == 400
        timeout = await complete("batch", "zeta", 0, stream=False, max_tokens=300,
                                 headers={"X-Request-Timeout-Ms": "100"})
        assert '"timeout"' in "".join(timeout[1]), timeout
        async with client.stream("POST", "/v1/completions", headers={"X-Tenant": "acme"},
                                 json={"prompt": PREFIX, "max_tokens": 300,
                                       "ignore_eos": True, "stream": True}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break  # leave after the first chunk
        deadline = time.monotonic() + 30
        while engine.abort_counts["client_disconnect"] < 1:
            assert time.monotonic() < deadline, "the cancel never reached the engine"
            await asyncio.sleep(0.05)
        await wait_until_idle(engine)


@pytest.fixture(scope="module")
def scraped(tiny_loaded, tmp_path_factory):
    """(prometheus, server URL) after the workload, once Prometheus has scraped for 3 s
    more (so rate() over 30 s has two samples of every series, even the newest)."""
    tmp = tmp_path_factory.mktemp("grafana")
    settings = ServeSettings(model="tiny", trace_db=str(tmp / "trace.duckdb"),
                             metrics_tenants=("acme", "globex"))
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.01, settings=settings,
                                      max_num_seqs=4)
    with LiveServer(engine, settings) as url, \
            Prometheus(url.removeprefix("http://"), tmp) as prom:
        prom.until(lambda: prom.query('up{job="batchpilot"} == 1'), "no scrape")
        asyncio.run(workload(url, engine, prom))
        ended = time.time()
        prom.until(lambda: prom.query(f'timestamp(up{{job="batchpilot"}}) > {ended + 3}'),
                   "no scrape 3 s after the load")
        yield prom, url


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_every_board_query_returns_data(scraped, path):
    prom, _ = scraped
    board = json.loads(path.read_text())
    for where, expr in board_queries(board):
        if where.startswith("variable"):
            continue
        result = prom.query(promql(expr))  # asserts status success
        if where.startswith("panel") or "config_version" in expr:
            assert result, f"{path.name}: {where} returned no data: {promql(expr)}"


def test_template_variables_list_the_workload(scraped):
    prom, _ = scraped
    board = json.loads(BOARDS[0].read_text())
    values = {}
    for v in board["templating"]["list"]:
        metric, label = v["query"].removeprefix("label_values(").rstrip(")").rsplit(", ", 1)
        body = prom.http.get(f"/api/v1/label/{label}/values",
                             params={"match[]": promql(metric)}).json()
        assert body["status"] == "success", body
        values[v["name"]] = set(body["data"])
    # one server has no replica label: the variable lists nothing, and its All (.*) still
    # matches every series, so every panel above returned data
    assert values == {"model": {"tiny"}, "replica": set(), "lane": set(LANES),
                      "tenant": {"acme", "globex", "other", "default"}}


def test_every_rule_evaluates_cleanly(scraped):
    prom, _ = scraped
    source = yaml.safe_load((GRAFANA / "alerts.yml").read_text())
    for rule in (r for g in source["groups"] for r in g["rules"]):
        prom.query(rule["expr"])  # asserts status success

    def rules() -> list[dict]:
        groups = prom.http.get("/api/v1/rules").json()["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    prom.until(lambda: all(r["health"] != "unknown" for r in rules()), "rules not evaluated")
    loaded = rules()
    assert {r["name"] for r in loaded} == {r["alert"] for g in source["groups"]
                                           for r in g["rules"]}
    for rule in loaded:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
    # a healthy idle server: no stall, no held KV blocks, scraped fine
    quiet = {"BatchpilotEngineStalled", "BatchpilotKVHeldWhileIdle", "BatchpilotDown",
             "BatchpilotTraceRecordsDropped", "BatchpilotObserverErrors"}
    assert {r["name"]: r["state"] for r in loaded if r["name"] in quiet} == dict.fromkeys(
        quiet, "inactive")
