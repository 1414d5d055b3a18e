"""What gateways read from /metrics: our one-series totals and KV-pool info always, and with
`--metrics-compat vllm` the same state and the main histograms and counters under vLLM's
names, equal to ours; without the switch no vllm:* family at all."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
import pytest
from fixtures.serving import ServerProcess, asgi_client, make_engine, wait_until_idle
from prometheus_client.parser import text_string_to_metric_families

from control.cli.main import build_parser
from control.metrics.gateway import vllm_families
from control.metrics.registry import ServingMetrics
from control.serve.settings import ServeSettings
from engine.records import RequestRecord

# vLLM name -> (sample suffix compared, our family whose samples it must sum)
SAME_AS_OURS = {
    "vllm:prompt_tokens": ("_total", "batchpilot_prompt_tokens"),
    "vllm:generation_tokens": ("_total", "batchpilot_generation_tokens"),
    "vllm:num_preemptions": ("_total", "batchpilot_preemptions"),
    "vllm:prefix_cache_queries": ("_total", "batchpilot_prefix_cache_queries"),
    "vllm:prefix_cache_hits": ("_total", "batchpilot_prefix_cache_hits"),
    "vllm:gpu_prefix_cache_hits": ("_total", "batchpilot_prefix_cache_hits"),
    "vllm:gpu_prefix_cache_queries": ("_total", "batchpilot_prefix_cache_queries"),
    "vllm:time_to_first_token_seconds": ("_count", "batchpilot_time_to_first_token_seconds"),
    "vllm:e2e_request_latency_seconds": ("_sum", "batchpilot_e2e_request_latency_seconds"),
    "vllm:request_queue_time_seconds": ("_count", "batchpilot_queue_delay_seconds"),
    "vllm:request_prefill_time_seconds": ("_count", "batchpilot_prefill_time_seconds"),
    "vllm:request_decode_time_seconds": ("_sum", "batchpilot_decode_time_seconds"),
    "vllm:request_time_per_output_token_seconds": (
        "_count", "batchpilot_time_per_output_token_seconds"),
    "vllm:inter_token_latency_seconds": ("_count", "batchpilot_inter_token_latency_seconds"),
    "vllm:num_requests_running": ("", "batchpilot_running_requests"),
    "vllm:num_requests_waiting": ("", "batchpilot_waiting_requests"),
    "vllm:kv_cache_usage_perc": ("", "batchpilot_kv_usage_ratio"),
    "vllm:gpu_cache_usage_perc": ("", "batchpilot_kv_usage_ratio"),
}
TOTALS = {"batchpilot_num_requests_running": "batchpilot_running_requests",
          "batchpilot_num_requests_waiting": "batchpilot_waiting_requests"}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(fams: dict, name: str, suffix: str = "", **labels: str) -> float:
    return sum(s.value for s in fams[name].samples if s.name == name + suffix
               and all(s.labels.get(k) == v for k, v in labels.items()))


async def scrape_under_load(client: httpx.AsyncClient, engine) -> tuple[str, str]:
    """Three slow requests on one running slot (one runs while two wait; each runs 20
    steps of 50 ms, so the scrape 0.1 s after the queue formed sees the first one running)
    and one that times out: /metrics while they run, and once all have ended."""
    async def one(**extra) -> httpx.Response:
        headers = extra.pop("headers", {})
        return await client.post("/v1/completions", headers=headers, json={
            "model": "tiny", "prompt": "hello there", "max_tokens": 20, "ignore_eos": True,
            **extra})

    jobs = [asyncio.ensure_future(one()) for _ in range(3)]
    deadline = time.monotonic() + 30
    while not (engine.stats.running >= 1 and engine.stats.waiting >= 1):
        assert time.monotonic() < deadline, "the requests never queued"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # a gauge refresh (every 50 ms while busy) after the queue
    busy = (await client.get("/metrics")).text
    late = await one(headers={"X-Request-Timeout-Ms": "1"})
    replies = await asyncio.gather(*jobs)
    assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]
    assert late.json()["choices"][0]["finish_reason"] != "length"
    await wait_until_idle(engine)
    return busy, (await client.get("/metrics")).text


def run_workload(tiny_loaded, compat: str | None) -> tuple[dict, dict]:
    settings = ServeSettings(model="tiny", metrics_compat=compat)
    engine, _, settings = make_engine(tiny_loaded, settings=settings, delay_s=0.05,
                                      max_num_seqs=1)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            return await scrape_under_load(client, engine)

    busy, idle = asyncio.run(scenario())
    return families(busy), families(idle)


def check_gateway_totals(fams: dict) -> None:
    """One series each (an endpoint picker reads one), equal to the per-lane sums."""
    for name, per_lane in TOTALS.items():
        assert [s.labels for s in fams[name].samples] == [{"model": "tiny"}]
        assert total(fams, name) == total(fams, per_lane)
    info = fams["batchpilot_kv_cache_config_info"].samples
    assert [(s.labels, s.value) for s in info] == [
        ({"model": "tiny", "block_size": "16", "num_gpu_blocks": "256"}, 1.0)]


def test_without_the_switch_only_our_names(tiny_loaded):
    busy, idle = run_workload(tiny_loaded, None)
    assert not [name for name in {**busy, **idle} if name.startswith("vllm:")]
    check_gateway_totals(busy)
    assert total(busy, "batchpilot_num_requests_waiting") >= 1  # a real queue was seen
    check_gateway_totals(idle)


def test_with_the_switch_vllm_names_carry_our_values(tiny_loaded):
    busy, idle = run_workload(tiny_loaded, "vllm")
    for fams in (busy, idle):
        check_gateway_totals(fams)
        for name, (suffix, ours) in SAME_AS_OURS.items():
            samples = [s for s in fams[name].samples if s.name == name + suffix]
            assert [s.labels for s in samples] == [{"model_name": "tiny", "engine": "0"}], name
            assert samples[0].value == pytest.approx(total(fams, ours, suffix)), name
    assert total(busy, "vllm:num_requests_running") == 1
    assert total(busy, "vllm:num_requests_waiting") >= 1
    assert total(busy, "vllm:kv_cache_usage_perc") > 0
    assert total(idle, "vllm:generation_tokens", "_total") >= 60  # 3 x 20, and the late one's
    success = {s.labels["finished_reason"]: s.value for s in
               idle["vllm:request_success"].samples}
    assert success == {"stop": 0, "length": 3, "abort": 1, "error": 0}
    hist = [s for s in idle["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")]
    assert hist[-1].labels["le"] == "+Inf" and hist[-1].value >= 3
    assert [s.value for s in hist] == sorted(s.value for s in hist)  # cumulative
    info = idle["vllm:cache_config_info"].samples[0]
    assert (info.labels["block_size"], info.labels["num_gpu_blocks"]) == ("16", "256")


def test_the_switch_is_checked_and_reaches_serve_from_the_command_line(tiny_llama_dir,
                                                                       tmp_path):
    with pytest.raises(ValueError, match="metrics_compat"):
        ServeSettings(metrics_compat="sglang").validate()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--metrics-compat", "sglang"])
    config = {"serving": {"num_kv_blocks": 256, "max_num_seqs": 4}}
    with ServerProcess(tiny_llama_dir, tmp_path, config, "--metrics-compat", "vllm") as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert reply.status_code == 200, reply.text
        fams = families(client.get("/metrics").text)
    model = tiny_llama_dir.name
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc"):
        assert [s.labels["model_name"] for s in fams[name].samples] == [model]
    assert total(fams, "vllm:request_success", "_total") == 1


def test_failed_and_timed_out_requests_count_in_vllm_request_success():
    """vLLM's finished_reason of each outcome: error -> error, cancelled and timeout ->
    abort; a rejected request never reached vLLM's engine and counts nowhere."""
    metrics = ServingMetrics("tiny")
    filled = {f.name: 0 for f in dataclasses.fields(RequestRecord)
              if f.default is dataclasses.MISSING}
    for reason, detail in (("length", ""), ("stop", ""), ("stop", ""), ("error", "step failed"),
                           ("timeout", "request_timeout"), ("cancelled", ""),
                           ("rejected", "queue_full")):
        filled.update(request_id=reason, lane="interactive", tenant="default",
                      status="FINISHED", finish_reason=reason, finish_detail=detail)
        metrics.observe_request(RequestRecord(**filled))
    (success,) = [f for f in vllm_families(metrics, None) if f.name == "vllm:request_success"]
    assert {s.labels["finished_reason"]: s.value for s in success.samples} == {
        "stop": 2, "length": 1, "abort": 2, "error": 1}
