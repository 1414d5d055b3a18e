"""/metrics and the trace read API on the real server (tiny model), and a trace that
survives SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import duckdb
import httpx
import pytest
from fixtures.serving import ServerProcess, asgi_client, make_engine, wait_until_idle
from prometheus_client.parser import text_string_to_metric_families

from control.serve.settings import ServeSettings

LABELS = {  # metric -> labels it must carry (besides model)
    "batchpilot_time_to_first_token_seconds": {"lane", "tenant"},
    "batchpilot_time_per_output_token_seconds": {"lane", "tenant"},
    "batchpilot_inter_token_latency_seconds": {"lane", "tenant"},
    "batchpilot_e2e_request_latency_seconds": {"lane", "tenant"},
    "batchpilot_queue_delay_seconds": {"lane", "tenant"},
    "batchpilot_prefill_time_seconds": {"lane", "tenant"},
    "batchpilot_decode_time_seconds": {"lane", "tenant"},
    "batchpilot_step_duration_seconds": set(),
    "batchpilot_step_tokens": {"kind"},
    "batchpilot_running_requests": {"lane"},
    "batchpilot_waiting_requests": {"lane"},
    "batchpilot_waiting_requests_by_reason": {"reason"},
    "batchpilot_kv_blocks_used": set(), "batchpilot_kv_blocks_total": set(),
    "batchpilot_kv_blocks_cached": set(), "batchpilot_kv_usage_ratio": set(),
    "batchpilot_config_max_num_seqs": set(), "batchpilot_config_max_num_batched_tokens": set(),
    "batchpilot_config_kv_cache_high_watermark_ratio": set(),
    "batchpilot_config_kv_cache_reject_watermark_ratio": set(),
    "batchpilot_requests": {"lane", "tenant", "outcome", "reason"},
    "batchpilot_prompt_tokens": {"lane", "tenant"},
    "batchpilot_generation_tokens": {"lane", "tenant"},
    "batchpilot_preemptions": set(),
    "batchpilot_prefix_cache_queries": set(), "batchpilot_prefix_cache_hits": set(),
    "batchpilot_admission_decisions": {"lane", "tenant", "decision", "reason"},
    "batchpilot_config_changes": set(),
    "batchpilot_trace_records_dropped": {"table"},
}


def parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, suffix: str = "", **labels: str) -> float:
    return sum(s.value for s in families[name].samples if s.name == name + suffix
               and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module")
def traced_server(tiny_loaded, tmp_path_factory):
    """Engine + in-process app with a trace; a scripted workload has run through it."""
    tmp = tmp_path_factory.mktemp("obs")
    settings = ServeSettings(model="tiny", trace_db=str(tmp / "trace.duckdb"),
                             metrics_tenants=("acme",), kv_snapshot_every=3)
    engine, _, settings = make_engine(tiny_loaded, settings=settings, max_num_seqs=2)
    return engine, settings


async def workload(client: httpx.AsyncClient) -> dict[str, str]:
    async def one(prompt, tenant, **extra):
        return await client.post("/v1/completions", json={
            "model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, **extra},
            headers={"X-Tenant": tenant})
    replies = await asyncio.gather(*(
        one(f"hello number {i}", "acme" if i % 2 else f"tenant{i}") for i in range(5)))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    too_long = await one("x", "acme", max_tokens=100_000)
    assert too_long.status_code == 400
    return {"ok": replies[0].json()["id"], "acme": replies[1].json()["id"]}


def test_metrics_and_trace_agree_after_a_workload(traced_server):
    asyncio.run(_metrics_and_trace_agree(*traced_server))


async def _metrics_and_trace_agree(engine, settings) -> None:
    async with asgi_client(engine, settings, stop=False) as client:
        writer = client.app.state.serving.trace
        writer.start()
        ids = await workload(client)
        await wait_until_idle(engine)
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        fams = parse(metrics.text)
        for name, labels in LABELS.items():
            assert name in fams, name
            for sample in fams[name].samples:
                assert sample.name.startswith("batchpilot_")
                assert set(sample.labels) - {"le", "model"} == labels, (name, sample.labels)
                assert sample.labels["model"] == "tiny"
        assert writer.sync()
        con = writer.cursor()
        rows = con.execute("SELECT outcome, tenant, count(*), sum(num_output_tokens)"
                           " FROM requests GROUP BY ALL").fetchall()
        for outcome, tenant, n, _ in rows:
            label = tenant if tenant in ("acme", "default") else "other"
            assert value(fams, "batchpilot_requests", "_total", outcome=outcome,
                         tenant=label) >= n
        assert sum(r[2] for r in rows) == value(fams, "batchpilot_requests", "_total") == 6
        assert value(fams, "batchpilot_generation_tokens", "_total") == sum(
            r[3] for r in rows)
        steps, tokens = con.execute("SELECT count(*), sum(tokens_used) FROM steps").fetchone()
        assert value(fams, "batchpilot_engine_steps", "_total") == steps
        assert value(fams, "batchpilot_scheduled_tokens", "_total") == tokens
        assert value(fams, "batchpilot_admission_decisions", "_total", decision="rejected",
                     reason="too_long") == 1
        assert value(fams, "batchpilot_config_max_num_seqs") == 2
        assert value(fams, "batchpilot_running_requests") == 0

        timeline = (await client.get(f"/v1/trace/requests/{ids['ok']}")).json()
        assert timeline["request"]["outcome"] == "finished"
        phases = [s["phase"] for s in timeline["steps"]]
        assert phases[0] == "prefill" and phases.count("decode") == \
            timeline["request"]["num_output_tokens"] - 1
        events = [e["event"] for e in timeline["events"]]
        assert events.index("arrival") < events.index("first_token") < events.index(
            "finished")
        assert timeline["breakdown"]["e2e_s"] == pytest.approx(
            timeline["breakdown"]["queue_s"] + timeline["breakdown"]["prefill_s"]
            + timeline["breakdown"]["decode_s"], abs=1e-6)
        slow = (await client.get("/v1/trace/slow", params={"limit": 3})).json()
        assert len(slow) == 3 and slow[0]["e2e_s"] >= slow[-1]["e2e_s"]
        by_tenant = (await client.get("/v1/trace/latency", params={"by": "tenant"})).json()
        assert {g["group"] for g in by_tenant} >= {"acme", "tenant0"}
        first = con.execute("SELECT min(start_time) FROM steps").fetchone()[0]
        around = (await client.get("/v1/trace/steps/around", params={"at": first})).json()
        assert around and "decode_ids" in around[0]
        kv = (await client.get("/v1/trace/kv", params={"bucket_s": 1})).json()
        assert kv["series"] and kv["snapshots"]
        summary = (await client.get("/v1/trace/summary", params={"since": "-1h"})).json()
        assert summary["steps"]["steps"] == steps
        missing = await client.get("/v1/trace/requests/nope")
        assert missing.status_code == 404
        bad = await client.get("/v1/trace/steps", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and "since" in bad.json()["error"]["message"]
        bad = await client.get("/v1/trace/latency", params={"by": "model; DROP TABLE steps"})
        assert bad.status_code == 400
        writer.stop()


def test_trace_endpoints_say_when_tracing_is_off(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            reply = await client.get("/v1/trace/summary")
            assert reply.status_code == 404
            assert "--trace-db" in reply.json()["error"]["message"]
            assert (await client.get("/metrics")).status_code == 200
    asyncio.run(scenario())


def test_sigkill_leaves_every_committed_record(tiny_llama_dir, tmp_path):
    db = tmp_path / "trace.duckdb"
    config = {"serving": {"num_kv_blocks": 256, "max_num_seqs": 4}}
    with ServerProcess(tiny_llama_dir, tmp_path, config, "--trace-db", str(db)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for i in range(6):
                reply = client.post("/v1/completions", json={
                    "model": tiny_llama_dir.name, "prompt": f"request {i}", "max_tokens": 5})
                assert reply.status_code == 200, reply.text
            deadline = time.monotonic() + 30
            while True:  # the writer commits within its flush interval
                fams = parse(client.get("/metrics").text)
                written = {s.labels["table"]: s.value for s in
                           fams["batchpilot_trace_records_written"].samples}
                if written.get("requests") == 6:
                    break
                assert time.monotonic() < deadline, written
                time.sleep(0.1)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 6
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] >= written["steps"]
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
