"""/metrics on a fresh server and the lane label: the gauges and the zero counters are there
from the first scrape, a lane a client makes up is labelled "other", and a lane added (or
removed) through the control API is labelled as the live config says at that moment. Fed
directly: the live limits in their units, every config version counted, and an ended
request's reason label taken from its finish detail before any colon."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
from fixtures.serving import ServerProcess, asgi_client, make_engine, wait_until_idle
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from control.metrics.observer import idle_gauges
from control.metrics.registry import OUTCOME_REASONS, ServingMetrics
from control.trace.schema import TABLES
from engine import LLM
from engine.config import LiveConfig
from engine.records import AdmissionDecision, RequestRecord

LANES = ("interactive", "long_context", "batch")  # engine.config.default_lanes()
CONFIG = {"serving": {"num_kv_blocks": 256, "max_num_seqs": 3, "max_batched_tokens": 96,
                      "prefill_chunk_size": 32}}
MODEL_COUNTERS = ("engine_steps", "preemptions", "config_changes", "observer_errors",
                  "prefix_cache_queries", "prefix_cache_hits")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(values: dict, name: str, **labels: str) -> list[float]:
    """The values of every `name` sample carrying at least these labels."""
    want = set(labels.items())
    return [v for (n, lab), v in values.items() if n == name and want <= lab]


def lanes_of(values: dict, name: str) -> set[str]:
    return {dict(lab)["lane"] for (n, lab) in values if n == name}


def assert_fresh_server_metrics(text: str, model: str) -> None:
    """Before any request: every gauge and every known-label counter, at the config's values
    and 0."""
    values = samples(text)
    one = lambda name, **labels: get(values, "batchpilot_" + name, model=model,  # noqa: E731
                                     **labels)
    assert one("config_max_num_batched_tokens") == [96]
    assert one("config_max_num_seqs") == [3]
    assert one("config_prefill_chunk_size") == [32]
    assert one("config_version") == [1]
    assert one("kv_blocks_total") == one("kv_blocks_free") == [256]
    assert one("kv_blocks_used") == one("kv_usage_ratio") == [0]
    for gauge in ("running_requests", "waiting_requests", "lane_weight"):
        assert lanes_of(values, "batchpilot_" + gauge) == set(LANES), gauge
    assert one("lane_weight", lane="interactive") == [4.0]
    assert sum(one("running_requests")) == sum(one("waiting_requests")) == 0
    for counter in MODEL_COUNTERS:
        assert one(counter + "_total") == [0], counter
    assert one("scheduled_tokens_total", kind="prefill") == [0]
    assert one("step_duration_seconds_count") == [0]
    for lane in LANES:
        for outcome, reasons in OUTCOME_REASONS.items():
            for reason in reasons:
                assert one("requests_total", lane=lane, tenant="default", outcome=outcome,
                           reason=reason) == [0], (lane, outcome, reason)
        assert one("admission_decisions_total", lane=lane, decision="admitted") == [0]
        assert one("time_to_first_token_seconds_count", lane=lane) == [0]
        assert one("generation_tokens_total", lane=lane) == [0]


def test_an_engine_loaded_before_the_app_shows_its_config_from_the_first_scrape(
        tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, config=CONFIG, tmp_path=tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            reply = await client.get("/metrics")
            assert reply.status_code == 200
            assert_fresh_server_metrics(reply.text, "tiny")
    asyncio.run(scenario())


def test_a_started_server_shows_gauges_and_zero_counters_before_any_request(
        tiny_llama_dir, tmp_path):
    db = tmp_path / "trace.duckdb"
    with ServerProcess(tiny_llama_dir, tmp_path, CONFIG, "--trace-db", str(db)) as server:
        text = httpx.get(server.url + "/metrics", timeout=30).text
    assert_fresh_server_metrics(text, tiny_llama_dir.name)
    values = samples(text)
    dropped = {dict(lab)["table"]: v for (n, lab), v in values.items()
               if n == "batchpilot_trace_records_dropped_total"}
    assert dropped == dict.fromkeys(TABLES, 0)


async def complete(client: httpx.AsyncClient, lane: str) -> httpx.Response:
    return await client.post("/v1/completions", headers={"X-Lane": lane}, json={
        "model": "tiny", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True})


async def scrape(client: httpx.AsyncClient, engine) -> dict:
    await wait_until_idle(engine)  # the rejection is reported by the step after it
    return samples((await client.get("/metrics")).text)


async def patch(client: httpx.AsyncClient, changes: dict) -> None:
    current = await client.get("/control/config")
    reply = await client.patch("/control/config", json={"changes": changes, "reason": "test"},
                               headers={"If-Match": current.headers["etag"]})
    assert reply.status_code == 200, reply.text


def test_a_lane_is_labelled_only_while_the_live_config_has_it(tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, config=CONFIG, tmp_path=tmp_path)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            assert (await complete(client, "nope")).status_code == 400
            values = await scrape(client, engine)
            assert not [key for key in values if ("lane", "nope") in key[1]]
            rejected = dict(outcome="rejected", reason="unknown_lane", lane="other")
            assert get(values, "batchpilot_requests_total", **rejected) == [1]
            assert get(values, "batchpilot_admission_decisions_total", decision="rejected",
                       reason="unknown_lane", lane="other") == [1]

            assert (await complete(client, "bulk")).status_code == 400  # not a lane yet
            await patch(client, {"lanes": {"bulk": {"weight": 0.5}}})
            values = await scrape(client, engine)
            assert get(values, "batchpilot_requests_total", **rejected) == [2]
            assert "bulk" in lanes_of(values, "batchpilot_lane_weight")
            assert get(values, "batchpilot_requests_total", lane="bulk",
                       outcome="finished") == [0, 0]  # at 0 from the change: stop, length
            assert get(values, "batchpilot_config_changes_total") == [1]

            assert (await complete(client, "bulk")).status_code == 200
            values = await scrape(client, engine)
            assert sum(get(values, "batchpilot_requests_total", lane="bulk",
                           outcome="finished")) == 1
            assert get(values, "batchpilot_admission_decisions_total", lane="bulk",
                       decision="admitted") == [1]

            await patch(client, {"lanes": {"bulk": None}})
            assert (await complete(client, "bulk")).status_code == 400  # gone again
            values = await scrape(client, engine)
            assert get(values, "batchpilot_requests_total", **rejected) == [3]
            assert get(values, "batchpilot_requests_total", lane="bulk",
                       outcome="rejected") == [0]
            assert "bulk" not in lanes_of(values, "batchpilot_lane_weight")
    asyncio.run(scenario())


def test_a_refusal_for_an_unknown_lane_stays_other_after_a_config_adds_the_lane(tiny_loaded):
    """The step that reports a refusal can reach the metrics thread after the config change
    that adds its lane: the refusal is still counted under "other", where it was decided."""
    metrics = ServingMetrics("tiny")
    metrics.set_gauges(LLM(tiny_loaded).engine.gauges())  # the default lanes, "batch" among them
    assert metrics.lane("batch") == "batch"
    assert metrics.lane("batch", "unknown_lane") == "other"
    metrics.observe_admission(AdmissionDecision(False, "r1", "unknown_lane", lane="batch"))
    values = samples(generate_latest(metrics.registry).decode())
    assert get(values, "batchpilot_admission_decisions_total", decision="rejected",
               reason="unknown_lane", lane="other") == [1]
    assert get(values, "batchpilot_admission_decisions_total", decision="rejected",
               reason="unknown_lane", lane="batch") == []


def ended(finish_reason: str, detail: str = "", lane: str = "interactive") -> RequestRecord:
    """A request record at its end: every field 0 but the ones named."""
    filled = {f.name: 0 for f in dataclasses.fields(RequestRecord)
              if f.default is dataclasses.MISSING}
    filled.update(request_id="r", lane=lane, tenant="default", status="FINISHED",
                  finish_reason=finish_reason, finish_detail=detail, ttft_s=None, tpot_s=None,
                  e2e_s=None, queue_delay_s=None, prefill_time_s=None, decode_time_s=None)
    return RequestRecord(**filled)


def test_the_live_queue_timeout_is_a_gauge_in_seconds():
    metrics = ServingMetrics("m")
    metrics.set_gauges(idle_gauges(LiveConfig(queue_timeout_ms=1500), 64))
    values = samples(generate_latest(metrics.registry).decode())
    assert get(values, "batchpilot_config_queue_timeout_seconds", model="m") == [1.5]


def test_config_changes_count_every_version_even_when_several_arrive_at_once():
    """The metrics thread may see version 1 then version 3 (two changes between its
    refreshes): that is two changes, and seeing version 3 again is none."""
    metrics = ServingMetrics("m")
    for version in (1, 3, 3, 4):
        metrics.set_gauges(idle_gauges(LiveConfig(version=version), 64))
    values = samples(generate_latest(metrics.registry).decode())
    assert get(values, "batchpilot_config_changes_total", model="m") == [3]
    assert get(values, "batchpilot_config_version", model="m") == [4]


def test_a_failed_step_is_counted_under_its_reason_not_its_message():
    """A finish detail says more after a colon ("step failed: execute raised ..."): the
    reason label is the part before it, one series whatever the exception."""
    metrics = ServingMetrics("m")
    metrics.set_gauges(idle_gauges(LiveConfig(), 64))
    for error in ("OutOfMemoryError", "RuntimeError"):
        metrics.observe_request(ended("error", f"step failed: execute raised {error}"))
    metrics.observe_request(ended("timeout", "queue_timeout: waited 30 s"))
    values = samples(generate_latest(metrics.registry).decode())
    assert get(values, "batchpilot_requests_total", lane="interactive", outcome="error",
               reason="step_failed") == [2]
    assert get(values, "batchpilot_requests_total", outcome="timeout",
               reason="queue_timeout") == [1]
    assert get(values, "batchpilot_requests_total", reason="other") == []
