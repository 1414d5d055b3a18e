"""The ingress over stand-in replicas (no Ray, no engine): a replica that dies mid-stream,
one that never accepts, and the merged /metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
from prometheus_client.parser import text_string_to_metric_families
from test_fleet_relay import SSE, Handle, Script

from control.fleet.forward import relay
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.metrics_merge import kv_index_metrics, merge_metrics
from control.fleet.router import RoutingPolicy

CHUNK = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]}


def replica(replica_id: int, behaviour: str) -> Handle:
    """A handle that streams two chunks then dies (`dies`), streams them and ends (`ok`),
    or never answers at all (`silent`)."""
    def script(*_args) -> Script:
        if behaviour == "silent":
            return Script([], fails=True)  # fails before accepting
        data = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"
        return Script([{"accepted": replica_id}, {"status": 200, "headers": SSE},
                       {"body": data}, {"body": data}], fails=behaviour == "dies")
    return Handle(script)


def _fleet(behaviours: list[str]) -> tuple[FleetIngress, list[Handle]]:
    replicas = [replica(i, b) for i, b in enumerate(behaviours)]
    fleet = FleetIngress(replicas, RoutingPolicy(mode="random"), seed=0)
    for i in range(len(replicas)):
        fleet.table.polled(i, {"ready": True})
    return fleet, replicas


async def _ask(fleet: FleetIngress, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.ASGITransport(app=build_app(fleet))
    async with httpx.AsyncClient(transport=transport, base_url="http://fleet") as client:
        return await client.request(method, path, **kw)


def _post(fleet: FleetIngress):
    """A streamed completion through the ingress (a coroutine for asyncio.run)."""
    return _ask(fleet, "POST", "/v1/completions", json={"prompt": "x", "stream": True})


def test_a_stream_cut_by_a_dying_replica_ends_with_an_error_chunk():
    fleet, _ = _fleet(["dies"])
    resp = asyncio.run(_post(fleet))
    assert resp.status_code == 200 and resp.headers["x-batchpilot-replica"] == "0"
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 4 and events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["id"] == "cmpl-1" and last["choices"][0]["finish_reason"] == "error"
    assert last["error"]["code"] == "replica_failed" and last["error"]["type"] == "server_error"
    view = fleet.table.views[0]
    assert not view.healthy and view.failures == 1 and view.inflight == 0


def test_a_replica_that_never_accepts_is_skipped_for_another():
    fleet, replicas = _fleet(["silent", "ok"])
    fleet.policy = RoutingPolicy(mode="pow2")
    fleet.table.polled(1, {"ready": True, "running": 5})  # so the silent one is tried first
    codes = [asyncio.run(_post(fleet)).status_code for _ in range(4)]
    assert codes == [200] * 4
    assert len(replicas[0].calls) == 1 and len(replicas[1].calls) == 4  # retried, then down
    assert not fleet.table.views[0].healthy
    assert [v.inflight for v in fleet.table.views] == [0, 0]


def test_no_healthy_replica_is_a_503_in_the_servers_error_shape():
    fleet, _ = _fleet(["ok"])
    fleet.table.failed(0, "gone")
    resp = asyncio.run(_post(fleet))
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "no_replica"


def test_merged_metrics_label_each_replica_in_one_family():
    text = ("# HELP batchpilot_steps_total Steps.\n# TYPE batchpilot_steps_total counter\n"
            'batchpilot_steps_total{model="m"} %d\n')
    merged = merge_metrics([(0, text % 5), (1, text % 7)]).decode()
    assert merged.count("# TYPE batchpilot_steps_total counter") == 1
    [family] = list(text_string_to_metric_families(merged))
    values = {s.labels["replica"]: s.value for s in family.samples
              if s.name == "batchpilot_steps_total"}
    assert values == {"0": 5.0, "1": 7.0}


def test_a_client_that_leaves_mid_stream_cancels_the_replica_call():
    """The replica aborts a request only when its call is cancelled (its KV is freed before
    the next step); a stream the client reads to its end is not cancelled."""
    data = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"

    async def read(chunks: int | None) -> tuple[Script, list[str]]:
        call, closed = Script([{"body": data}] * 3), []
        start = {"status": 200, "headers": [("content-type", "text/event-stream")]}
        body = relay(call, start, 0, "/v1/completions", lambda: closed.append("closed"),
                     lambda exc: closed.append("failed")).body_iterator
        if chunks is None:
            assert [chunk async for chunk in body] == [data] * 3
        else:
            for _ in range(chunks):
                assert await body.__anext__() == data
            await body.aclose()  # what Starlette does when the client disconnects
        return call, closed

    left, closed = asyncio.run(read(1))
    assert left.cancelled and closed == ["closed"]
    stayed, closed = asyncio.run(read(None))
    assert not stayed.cancelled and closed == ["closed"]


def test_kv_index_metrics_count_snapshots_and_batches_apart():
    """A reader that keeps falling behind (snapshots) reads apart from one applying each
    step's batch: the two kinds must not trade places."""
    rows = [{"replica_id": 0, "blocks": 12, "snapshots": 2, "batches": 40, "dropped": 1},
            {"replica_id": 1, "blocks": 0, "snapshots": 1, "batches": 0, "dropped": 0}]
    merged = merge_metrics([], kv_index_metrics({0: 30}, rows)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(merged) for s in f.samples}
    reads = "batchpilot_fleet_kv_index_reads_total"
    assert samples[(reads, (("kind", "snapshot"), ("replica", "0")))] == 2
    assert samples[(reads, (("kind", "batch"), ("replica", "0")))] == 40
    assert samples[(reads, (("kind", "batch"), ("replica", "1")))] == 0
    assert samples[("batchpilot_fleet_kv_index_blocks", (("replica", "0"),))] == 12
    assert samples[("batchpilot_fleet_kv_events_dropped_total", (("replica", "0"),))] == 1
    assert samples[("batchpilot_fleet_routed_matched_blocks_total", (("replica", "0"),))] \
        == 30


def test_a_draining_fleet_is_not_ready_though_its_replicas_are():
    """A load balancer reads /readyz to stop sending: while the fleet drains, every
    replica still polls healthy, and the fleet must say not ready anyway."""
    fleet, _ = _fleet(["ok", "ok"])

    assert asyncio.run(_ask(fleet, "GET", "/readyz")).status_code == 200
    fleet.draining = True
    reply = asyncio.run(_ask(fleet, "GET", "/readyz"))
    assert reply.status_code == 503 and reply.json()["draining"] is True
    assert all(v.healthy for v in fleet.table.views)


def test_an_openai_user_keys_affinity_as_an_x_tenant_header_does():
    """OpenAI's clients name their end user in the body's `user`, which the server takes
    as the tenant when no X-Tenant is sent: routing must key on it alike, or one user's
    requests scatter over replicas whose caches never hold their prefix."""
    fleet, _ = _fleet(["ok", "ok", "ok"])
    fleet.policy = RoutingPolicy()
    prompts = [f"Question {i} about the scheduler" for i in range(30)]
    by_user = [fleet.route({"prompt": p, "user": "alice"}, {}).replica_id for p in prompts]
    by_header = [fleet.route({"prompt": p}, {"x-tenant": "alice"}).replica_id
                 for p in prompts]
    assert by_user == by_header
    anonymous = [fleet.route({"prompt": p}, {}).replica_id for p in prompts]
    assert anonymous != by_user  # the tenant is in the key: some prompts move
