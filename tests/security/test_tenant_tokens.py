"""A read token bound to a tenant sees that tenant's requests and nothing that names another
tenant or its requests: two tenants' requests run through the tiny model on one server
(sharing its steps), then every trace read with tenant A's token is searched, byte for
byte, for B's request ids and B's name. The same through `batchpilot trace` and the
dashboard's source (they read through the server), and at a fleet's ingress over replicas
that have no tokens of their own (the ingress scopes what it merges)."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pyarrow.parquet as pq
import pytest
from fixtures.serving import LiveServer, make_engine, tokens_file

from control.cli.main import main
from control.serve.settings import ServeSettings
from control.trace.sources import TraceError, open_source

A, B = "acme", "zeta-secret-tenant"  # B's name must appear in no answer to A
TOKENS = "ops admin ops-secret-1\nviewer read view-secret-1\nacme-ro read acme-secret1 acme\n"
VIEWER, ACME = {"Authorization": "Bearer view-secret-1"}, {"Authorization": "Bearer acme-secret1"}


def _workload(url: str) -> dict[str, list[str]]:
    """Three requests per tenant, sent together, interleaved: they share steps."""
    def one(i: int, tenant: str) -> str:
        reply = httpx.post(f"{url}/v1/completions", headers={"X-Tenant": tenant}, json={
            "model": "tiny", "prompt": f"hello {i} from a tenant", "max_tokens": 6,
            "temperature": 0, "ignore_eos": True}, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["id"]

    with ThreadPoolExecutor(6) as pool:
        sent = [(t, pool.submit(one, i, t)) for i in range(3) for t in (A, B)]
    return {t: [f.result() for tenant, f in sent if tenant == t] for t in (A, B)}


@pytest.fixture(scope="module")
def served(tiny_loaded, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    with tokens_file(tmp, TOKENS) as tokens:
        engine, _, settings = make_engine(tiny_loaded, delay_s=0.01, max_num_seqs=4,
                                          settings=ServeSettings(
                                              model="tiny", trace_db=str(tmp / "t.duckdb"),
                                              control_tokens_path=str(tokens),
                                              kv_snapshot_every=1))
        with LiveServer(engine, settings) as url:
            ids = _workload(url)
            yield url, ids


def get(url: str, path: str, headers: dict, **params) -> httpx.Response:
    return httpx.get(url + path, headers=headers, params=params, timeout=60)


def text_of(reply: httpx.Response) -> str:
    """What a reply says, decoded: JSON as is, Parquet's rows (its bytes are compressed, so
    a search of the raw bytes alone could miss a value)."""
    if reply.headers["content-type"].startswith("application/vnd.apache.parquet"):
        rows = pq.read_table(io.BytesIO(reply.content)).to_pylist()
        return json.dumps(rows, default=str) + reply.content.decode("latin-1")
    return reply.text


def foreign(text: str, ids: dict[str, list[str]]) -> list[str]:
    return [s for s in (*ids[B], B) if s in text]


READS = [("/v1/trace/summary", {}), ("/v1/trace/slow", {"limit": 100}),
         ("/v1/trace/latency", {"by": "tenant"}), ("/v1/trace/steps", {"batch": "true"}),
         ("/v1/trace/kv", {}), ("/v1/trace/series/latency", {"by": "tenant"}),
         ("/v1/trace/series/steps", {}), ("/v1/trace/series/queues", {}),
         ("/v1/trace/series/outcomes", {}), ("/v1/trace/report/latency", {}),
         ("/v1/trace/report/kv_crossings", {}),
         *[(f"/v1/trace/export/{t}", {}) for t in ("requests", "admissions", "steps",
                                                     "kv_snapshots", "request_ids", "runs")]]


def test_a_bound_token_counts_only_its_tenants_requests(served):
    url, ids = served
    mine = get(url, "/v1/trace/summary", ACME).json()
    every = get(url, "/v1/trace/summary", VIEWER).json()
    assert sum(o["requests"] for o in mine["outcomes"]) == 3
    assert sum(o["requests"] for o in every["outcomes"]) == 6
    assert mine["steps"]["steps"] == every["steps"]["steps"]  # steps: the server's, as counts
    groups = [g["group"] for g in get(url, "/v1/trace/latency", ACME, by="tenant").json()]
    assert groups == [A]
    assert {r["request_id"] for r in get(url, "/v1/trace/slow", ACME, limit=100).json()} \
        == set(ids[A])


def test_no_answer_to_a_bound_token_names_another_tenant_or_its_requests(served):
    url, ids = served
    middle = get(url, "/v1/trace/steps", VIEWER, limit=5000).json()
    at = str(middle[len(middle) // 2]["start_time"])
    reads = [*READS, ("/v1/trace/steps/around", {"at": at, "before": 500, "after": 500}),
             *[(f"/v1/trace/requests/{rid}", {}) for rid in ids[A]]]
    for path, params in reads:
        reply = get(url, path, ACME, **params)
        assert reply.status_code == 200, (path, reply.text)
        assert foreign(text_of(reply), ids) == [], path
    # the same reads unscoped do name them: the search above can find what it looks for
    for path, params in (("/v1/trace/slow", {"limit": 100}), ("/v1/trace/export/requests", {}),
                         ("/v1/trace/export/steps", {})):  # (export takes no limit)
        assert foreign(text_of(get(url, path, VIEWER, **params)), ids), path


def test_another_tenants_request_is_a_404_like_a_missing_one(served):
    url, ids = served
    theirs = get(url, f"/v1/trace/requests/{ids[B][0]}", ACME)
    missing = get(url, "/v1/trace/requests/cmpl-no-such-request", ACME)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.text.replace(ids[B][0], "ID") == missing.text.replace(
        "cmpl-no-such-request", "ID")
    assert get(url, f"/v1/trace/requests/{ids[B][0]}", VIEWER).status_code == 200


def test_steps_keep_their_counts_without_another_tenants_ids(served):
    url, ids = served
    steps = get(url, "/v1/trace/steps", ACME, batch="true", limit=5000).json()
    mixed = 0
    for step in steps:
        assert len(step["decode_ids"]) == step["num_decode_seqs"]
        assert len(step["prefill_ids"]) == step["num_prefill_seqs"]
        for column in ("decode_ids", "prefill_ids", "admitted", "finished", "preempted"):
            assert set(step[column]) <= {*ids[A], None}, (column, step[column])
        mixed += None in step["decode_ids"] and any(step["decode_ids"])
    assert mixed, "no step ran both tenants: the workload did not test the scoping"


def test_batchpilot_trace_with_a_bound_token_shows_its_tenant_only(served, capsys,
                                                                   monkeypatch):
    url, ids = served
    monkeypatch.setenv("BATCHPILOT_TOKEN", "acme-secret1")
    assert main(["trace", "--url", url, "slow", "--limit", "50", "--json"]) == 0
    out = capsys.readouterr().out
    assert {r["request_id"] for r in json.loads(out)} == set(ids[A])
    assert main(["trace", "--url", url, "steps", "--since", "0", "--batch"]) == 0
    assert main(["trace", "--url", url, "summary"]) == 0
    assert foreign(capsys.readouterr().out, ids) == []
    assert main(["trace", "--url", url, "request", ids[B][0]]) == 1
    assert "is not in the trace" in capsys.readouterr().err
    monkeypatch.delenv("BATCHPILOT_TOKEN")
    assert main(["trace", "--url", url, "summary"]) == 1
    assert "401" in capsys.readouterr().err


def test_the_dashboards_live_source_sends_the_token(served, monkeypatch):
    from dashboard.context import _context

    url, ids = served
    monkeypatch.setenv("BP_TEST_TOKEN", "acme-secret1")
    ctx = _context(url, None, "BP_TEST_TOKEN")
    assert {r["request_id"] for r in ctx.source.ask("slow", limit=50)} == set(ids[A])
    assert foreign(json.dumps(ctx.source.ask("steps", since=0, batch=True)), ids) == []
    with pytest.raises(TraceError) as refused:  # the config audit is not the tenant's
        ctx.source.ask("config_changes")
    assert refused.value.status == 403
    assert open_source(url=url).token is None  # no token given: none is sent


# ---- a fleet: the ingress checks the fleet's tokens and scopes what it merges ----------
class TraceReplica:
    """A replica as the ingress reaches it (by handle; `tokens`: its own, none or the
    fleet's): the real trace routes over a trace of the simulated workload
    (fixtures/trace_data: tenants acme and zeta, requests r0..r7, "big" of tenant default)."""

    def __init__(self, writer, replica_id: int, tokens: tuple = ()):
        from types import SimpleNamespace

        from fastapi import FastAPI

        from control.api.errors import install_error_handlers
        from control.trace import export_route, routes

        self.app, self.replica_id = FastAPI(), replica_id
        install_error_handlers(self.app)
        self.app.include_router(routes.router)
        self.app.include_router(export_route.router)
        self.app.state.serving = SimpleNamespace(trace=writer, metrics=None,
                                                 control_tokens=tokens)

    async def http(self, method, path, query, headers, body):
        from control.fleet.asgi_call import call_asgi

        yield {"accepted": self.replica_id}
        async for message in call_asgi(self.app, method, path, query, headers, body):
            yield message

    def stats(self, *_: object) -> dict:
        return {"replica_id": self.replica_id, "ready": True, "waiting": 0, "running": 0,
                "kv_usage": 0.0}


SIM_FOREIGN = ["r0", "r2", "r4", "r6", "big"]  # fill_trace's requests not of acme


@pytest.fixture(scope="module", params=[False, True],
                ids=["replicas-without-tokens", "replicas-with-the-fleets-tokens"])
def ingress(request, tmp_path_factory):
    from fixtures.trace_data import fill_trace

    from control.admin.auth import load_tokens
    from control.fleet.ingress import FleetIngress, build_app
    from control.fleet.local import LocalHandle
    from control.fleet.router import RoutingPolicy

    tmp = tmp_path_factory.mktemp("fleet-tenants")
    writers = [fill_trace(str(tmp / f"replica-{i}.duckdb"), run_id=f"run-{i}")
               for i in range(2)]
    with tokens_file(tmp, TOKENS) as path:
        tokens = load_tokens(str(path))
    own = tokens if request.param else ()
    fleet = FleetIngress([LocalHandle(TraceReplica(w, i, own)) for i, w in enumerate(writers)],
                         RoutingPolicy(), control_tokens=tokens)
    yield build_app(fleet)
    for writer in writers:
        writer.stop()


def fleet_get(app, calls: list[tuple[str, str, dict, dict | None]]) -> list[httpx.Response]:
    import asyncio

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=60) as client:
            return [await client.request(m, p, headers=h, json=body) for m, p, h, body in calls]

    return asyncio.run(go())


def test_the_fleet_ingress_needs_a_token_for_every_trace_route(ingress):
    from fixtures.app_routes import api_routes

    paths = [p.replace("{request_id}", "r1").replace("{kind}", "steps")
             for p, route in api_routes(ingress.routes) if route.name.startswith("fleet_trace_")]
    assert len(paths) >= 16, paths
    relayed = [("POST", "/v1/whatif", {}, {"set": {"max_num_seqs": 2}}),
               ("GET", "/v1/trace/export/steps", {}, None),
               ("GET", "/v1//TRACE/export/steps/", {}, None),
               ("POST", "/v1/loadtest/results", {}, {"runs": []})]
    replies = fleet_get(ingress, [("GET", p, {}, None) for p in paths] + relayed)
    assert [r.status_code for r in replies] == [401] * len(replies), [
        (c, r.text) for c, r in zip(paths + relayed, replies, strict=True)]
    refused = fleet_get(ingress, [("POST", "/v1/loadtest/results", VIEWER, {"runs": []}),
                                  ("GET", "/v1/trace/export/steps", ACME, None),
                                  ("POST", "/v1/whatif", ACME, {"set": {"max_num_seqs": 2}}),
                                  ("GET", "/v1/trace/config_changes", ACME, None),
                                  ("GET", "/v1/trace/checklist", ACME, None)])
    assert [r.status_code for r in refused] == [403] * 5, [r.text for r in refused]


def test_a_bound_token_at_the_fleet_sees_its_tenant_only(ingress):
    reads = ["/v1/trace/summary", "/v1/trace/slow?limit=100", "/v1/trace/latency?by=tenant",
             "/v1/trace/steps?batch=true&limit=5000", "/v1/trace/kv",
             "/v1/trace/steps/around?at=1000000.2&before=50&after=50",
             "/v1/trace/series/latency?by=tenant", "/v1/trace/report/latency",
             "/v1/trace/requests/r1"]
    replies = fleet_get(ingress, [("GET", p, ACME, None) for p in reads])
    for path, reply in zip(reads, replies, strict=True):
        assert reply.status_code == 200, (path, reply.text)
        assert not [s for s in ("zeta", *SIM_FOREIGN) if f'"{s}"' in reply.text or (
            s == "zeta" and s in reply.text)], (path, reply.text[:300])
    slow = replies[1].json()
    assert {r["request_id"] for r in slow} == {"r1", "r3", "r5", "r7"}
    assert len(slow) == 8  # both replicas' (the same ids in each)
    theirs, every, summary = fleet_get(ingress, [
        ("GET", "/v1/trace/requests/r0", ACME, None),
        ("GET", "/v1/trace/slow?limit=100", VIEWER, None),
        ("GET", "/v1/trace/summary", VIEWER, None)])  # the token reaches the replicas too
    assert theirs.status_code == 404
    assert every.status_code == summary.status_code == 200, (every.text, summary.text)
    assert "zeta" in every.text  # unscoped, the same read names them


def test_a_bound_token_naming_one_replica_still_sees_its_tenant_only(ingress):
    """X-Batchpilot-Replica asks one replica; a bound token's answer is still the ingress's
    own, scoped (a replica without tokens would answer every tenant's rows as they are)."""
    reads = ["/v1/trace/slow?limit=100", "/v1/trace/summary", "/v1/trace/requests/r1",
             "/v1/trace/steps?batch=true&limit=5000"]
    replies = fleet_get(ingress, [("GET", p, {**ACME, "X-Batchpilot-Replica": "1"}, None)
                                  for p in reads])
    for path, reply in zip(reads, replies, strict=True):
        assert reply.status_code == 200, (path, reply.text)
        assert not [s for s in ("zeta", *SIM_FOREIGN) if f'"{s}"' in reply.text or (
            s == "zeta" and s in reply.text)], (path, reply.text[:300])
    assert {r["request_id"] for r in replies[0].json()} == {"r1", "r3", "r5", "r7"}
    assert len(replies[0].json()) == 4  # that replica's only
    (theirs,) = fleet_get(ingress, [("GET", "/v1/trace/requests/r0",
                                     {**ACME, "X-Batchpilot-Replica": "0"}, None)])
    assert theirs.status_code == 404


def test_hostile_trace_queries_at_the_fleet_are_400s_for_every_token(ingress):
    # the ingress answers a bound token itself: its own parsing once gave 500s here
    asks = ["/v1/trace/kv?bucket_s=nan", "/v1/trace/kv?bucket_s=inf",
            "/v1/trace/kv?bucket_s=1e-300", "/v1/trace/steps/around?before=5",
            "/v1/trace/steps?batch=maybe"]
    for token in (ACME, VIEWER):
        replies = fleet_get(ingress, [("GET", p, token, None) for p in asks])
        for path, reply in zip(asks, replies, strict=True):
            assert reply.status_code == 400, (path, reply.text)
            assert reply.json()["error"]["param"] in ("bucket_s", "at", "batch"), reply.text
