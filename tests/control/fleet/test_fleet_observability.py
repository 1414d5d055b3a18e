"""The fleet observed as one (issue 21 item 4), on a 2-replica fleet without Ray (the tiny
model's replicas in this process behind the real ingress, tests/fixtures/local_fleet.py):
/metrics labels every sample with its replica and adds the ingress's own families; the
trace read through the ingress (`batchpilot trace --url`) is both replicas' trace, and one
replica's when asked; the checklist reads the fleet through the same URL; a replica that
does not answer fails a trace read with 502 naming it (stand-in handles, no engine)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
import pytest
from fixtures.local_fleet import LocalFleet
from prometheus_client.parser import text_string_to_metric_families

from control.cli.main import main
from control.fleet.ingress import FleetIngress, build_app
from control.fleet.router import RoutingPolicy
from control.trace.fleet_db import open_files, open_parquet

PROMPTS = [f"question {i}: what is the capital of country number {i}?" for i in range(8)]


@pytest.fixture(scope="module")
def fleet(tiny_llama_dir, tmp_path_factory, one_torch_thread):
    trace_dir = tmp_path_factory.mktemp("fleet-trace")
    with LocalFleet(tiny_llama_dir, trace_dir) as running:
        served: Counter[str] = Counter()
        with httpx.Client(base_url=running.url, timeout=60) as client:
            for i, prompt in enumerate(PROMPTS):
                resp = client.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": 4, "ignore_eos": True},
                    headers={"X-Tenant": f"t{i}"})
                assert resp.status_code == 200, resp.text
                served[resp.headers["x-batchpilot-replica"]] += 1
        # affinity hashes these prompts onto both replicas (deterministic: rendezvous hash)
        assert set(served) == {"0", "1"}, served
        running.served = served
        yield running


def cli(capsys, *argv: str) -> tuple[int, object, str]:
    code = main(["trace", *argv])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def test_every_metric_carries_its_replica_and_the_ingress_exports_its_own(fleet):
    text = httpx.get(f"{fleet.url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    kinds = Counter()
    for family in families.values():
        for sample in family.samples:
            assert sample.labels.get("replica") in ("0", "1"), (family.name, sample)
        kinds[family.type] += 1
    assert {"counter", "gauge", "histogram"} <= set(kinds), kinds
    ttft = families["batchpilot_time_to_first_token_seconds"]
    counts = {s.labels["replica"]: s.value for s in ttft.samples if s.name.endswith("_count")
              and s.labels.get("lane") == "interactive"}
    requests = {r: sum(s.value for s in families["batchpilot_requests"].samples
                       if s.name.endswith("_total") and s.labels["replica"] == r)
                for r in ("0", "1")}
    assert requests == {r: float(n) for r, n in fleet.served.items()}, requests
    assert sum(counts.values()) == len(PROMPTS), counts
    routed = Counter()
    for s in families["batchpilot_fleet_routed_requests"].samples:
        if s.name.endswith("_total"):
            routed[s.labels["replica"]] += s.value
    assert routed == {r: float(n) for r, n in fleet.served.items()}
    inflight = {s.labels["replica"]: s.value
                for s in families["batchpilot_fleet_inflight_requests"].samples}
    assert inflight == {"0": 0.0, "1": 0.0}
    healthy = {s.labels["replica"]: s.value
               for s in families["batchpilot_fleet_replica_healthy"].samples}
    assert healthy == {"0": 1.0, "1": 1.0}


def test_trace_through_the_ingress_is_the_fleets_and_one_replica_when_asked(fleet, capsys):
    code, summary, err = cli(capsys, "--url", fleet.url, "summary", "--json")
    assert code == 0, err
    assert sum(o["requests"] for o in summary["outcomes"]) == len(PROMPTS)
    assert summary["latency"][0]["requests"] == len(PROMPTS)
    assert sorted(r["replica"] for r in summary["runs"]) == ["0", "1"]
    code, slow, err = cli(capsys, "--url", fleet.url, "slow", "--limit", "20", "--json")
    assert code == 0, err
    assert Counter(r["replica"] for r in slow) == fleet.served
    e2e = [r["e2e_s"] for r in slow]
    assert e2e == sorted(e2e, reverse=True)
    for replica, n in fleet.served.items():
        code, one, err = cli(capsys, "--url", fleet.url, "--replica", replica, "summary",
                             "--json")
        assert code == 0, err
        assert sum(o["requests"] for o in one["outcomes"]) == n
    picked = slow[0]
    code, timeline, err = cli(capsys, "--url", fleet.url, "request", picked["request_id"],
                              "--json")
    assert code == 0, err
    assert timeline["replica"] == picked["replica"] and timeline["steps"]


def test_the_fleet_aggregate_equals_the_union_of_the_replicas_rows(fleet, capsys):
    """The ingress's percentiles are computed over both replicas' rows, not merged."""
    code, latency, err = cli(capsys, "--url", fleet.url, "summary", "--json")
    assert code == 0, err
    server_p99 = latency["latency"][0]["e2e_s_p99"]
    parts = {}
    for r in ("0", "1"):  # each replica's requests table, as the ingress fetches it
        resp = httpx.get(f"{fleet.url}/v1/trace/export/requests",
                         headers={"X-Batchpilot-Replica": r}, timeout=30)
        assert resp.status_code == 200 and resp.content[:4] == b"PAR1"
        parts[r] = resp.content
    con = open_parquet({r: {"requests": b} for r, b in parts.items()})
    try:
        (p99,) = con.execute("SELECT quantile_cont(e2e_s, 0.99) FROM requests"
                             " WHERE outcome <> 'rejected'").fetchone()
    finally:
        con.close()
    assert server_p99 == pytest.approx(p99)


def test_bad_reads_through_the_ingress_say_what_is_wrong(fleet, capsys):
    code, _, err = cli(capsys, "--url", fleet.url, "--replica", "7", "summary")
    assert code == 2 and "replica='7' must be one of 0, 1" in err
    resp = httpx.get(f"{fleet.url}/v1/trace/slow?limit=0", timeout=30)
    assert resp.status_code == 400 and "limit=0" in resp.json()["error"]["message"]
    resp = httpx.get(f"{fleet.url}/v1/trace/summary?bogus=1", timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "bogus"
    code, _, err = cli(capsys, "--url", fleet.url, "request", "no-such-request")
    assert code == 1 and "not in any replica's trace" in err


def test_the_checklist_reads_the_fleet_through_its_url(fleet, capsys):
    for replica in (None, "1"):
        extra = ["--replica", replica] if replica else []
        code = main(["checklist", "--url", fleet.url, *extra, "--json"])
        items = {i["id"]: i for i in json.loads(capsys.readouterr().out)["items"]}
        assert code in (0, 1)
        tracing = items["tracing"]
        assert tracing["status"] == "pass", tracing
        assert f"the trace of {fleet.url}" in tracing["evidence"]
    code = main(["checklist", "--url", fleet.url, "--replica", "9", "--json"])
    assert code == 2 and "replica='9'" in capsys.readouterr().err


def test_the_replicas_files_read_as_one_after_the_fleet_stops(tmp_path_factory,
                                                               tiny_llama_dir,
                                                               one_torch_thread, capsys):
    trace_dir = tmp_path_factory.mktemp("stopped-fleet")
    with LocalFleet(tiny_llama_dir, trace_dir) as running:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            for prompt in PROMPTS[:4]:
                assert client.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": 2}).status_code == 200
        code, _, err = cli(capsys, "--db", str(trace_dir / "replica-*.duckdb"), "summary")
        assert code == 2 and "held by another process" in err, err
    code, summary, err = cli(capsys, "--db", str(trace_dir / "replica-*.duckdb"), "summary",
                             "--json")
    assert code == 0, err
    assert sum(o["requests"] for o in summary["outcomes"]) == 4
    con = open_files({"0": str(trace_dir / "replica-0.duckdb"),
                      "1": str(trace_dir / "replica-1.duckdb")})
    try:
        assert con.execute("SELECT count(DISTINCT replica) FROM runs").fetchone()[0] == 2
    finally:
        con.close()


class StubReplica:
    """A replica handle whose every call answers (status, JSON body), or raises (None)."""

    def __init__(self, status: int | None, body: dict | None = None):
        self.status, self.body = status, body or {}

    def options(self, **_):
        return self

    @property
    def http(self):
        stub = self

        class Method:
            @staticmethod
            def remote(*args):
                return stub.answer()

        return Method

    async def answer(self):
        if self.status is None:
            raise RuntimeError("ActorDiedError: the actor died unexpectedly")
        yield {"accepted": 0}
        yield {"status": self.status, "headers": [["content-type", "application/json"]]}
        yield {"body": json.dumps(self.body).encode()}


async def _get(handles, path: str) -> httpx.Response:
    app = build_app(FleetIngress(handles, RoutingPolicy()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://fleet") as client:
        return await client.get(path)


@pytest.mark.parametrize("path", ["/v1/trace/slow", "/v1/trace/summary"])
def test_a_replica_that_does_not_answer_fails_the_read_naming_it(path):
    off = {"error": {"message": "tracing is off", "code": "trace_off"}}
    resp = asyncio.run(_get([StubReplica(200, []), StubReplica(None)], path))
    assert resp.status_code == 502, resp.text
    assert "replica 1" in resp.json()["error"]["message"]
    resp = asyncio.run(_get([StubReplica(404, off), StubReplica(404, off)], path))
    assert resp.status_code == 404 and "--trace-dir" in resp.json()["error"]["message"]


def test_a_body_nested_past_the_json_parsers_depth_is_a_400_at_the_ingress(fleet):
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        reply = httpx.post(f"{fleet.url}{path}", content=deep, timeout=30,
                           headers={"Content-Type": "application/json"})
        assert reply.status_code == 400, (path, reply.text)
