"""Exemplars: the latency histograms name a trace per bucket under OpenMetrics negotiation,
only traces that exist (exported and taken by the collector, or the caller's sampled one),
and a real Prometheus stores them, so a Grafana panel's point links to the trace."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
from fixtures.grafana import Prometheus
from fixtures.otlp_receiver import OtlpReceiver
from fixtures.serving import LiveServer, asgi_client, make_engine, wait_until_idle
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from control.serve.settings import ServeSettings

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
LATENCIES = ("batchpilot_time_to_first_token_seconds", "batchpilot_e2e_request_latency_seconds",
             "batchpilot_time_per_output_token_seconds")


def exemplar_traces(text: str, family: str) -> set[str]:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.exemplar.labels["trace_id"] for s in fams[family].samples
            if s.exemplar is not None}


def complete(client, traceparent: str | None = None, max_tokens: int = 3):
    headers = {"traceparent": traceparent} if traceparent else {}
    return client.post("/v1/completions", headers=headers, json={
        "model": "tiny", "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True})


async def scrape_until(client, done, timeout_s: float = 30.0) -> httpx.Response:
    """OpenMetrics scrapes until done(text) (spans reach the collector a second or so after
    their request ends); the last scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        om = await client.get("/metrics", headers={"Accept": OPENMETRICS})
        if done(om.text) or time.monotonic() > deadline:
            return om
        await asyncio.sleep(0.2)


def test_openmetrics_scrapes_carry_the_trace_ids_of_exported_requests(tiny_loaded):
    with OtlpReceiver() as rx:
        settings = ServeSettings(model="tiny", otlp_traces_endpoint=rx.endpoint,
                                 otlp_sample_ratio=0.0)
        engine, _, settings = make_engine(tiny_loaded, settings=settings)

        async def scenario():
            async with asgi_client(engine, settings) as client:
                sampled = await complete(client, f"00-{TRACE}-00f067aa0ba902b7-01")
                unsampled = await complete(client)  # ratio 0: not exported
                await wait_until_idle(engine)
                om = await scrape_until(client, lambda text: all(
                    TRACE in exemplar_traces(text, f) for f in LATENCIES))
                plain = await client.get("/metrics")
                client.app.state.serving.observer.stop()
                return sampled, unsampled, om, plain

        sampled, unsampled, om, plain = asyncio.run(scenario())
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text  # the 0.0.4 text format has no exemplars
    hidden = unsampled.headers["x-batchpilot-trace-id"]
    for family in LATENCIES:
        traces = exemplar_traces(om.text, family)
        assert TRACE in traces and hidden not in traces, (family, traces)


def test_a_trace_the_collector_never_took_is_no_exemplar(tiny_loaded):
    """The collector is down: the request's spans are dropped (counted), and no latency
    bucket links to the trace they would have made (a panel's point would lead nowhere)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = ServeSettings(model="tiny", otlp_traces_endpoint=f"http://127.0.0.1:{port}"
                             "/v1/traces", otlp_sample_ratio=1.0)
    engine, _, settings = make_engine(tiny_loaded, settings=settings)

    def dropped(text: str) -> bool:
        return any(s.name == "batchpilot_otel_spans_dropped_total" and s.value > 0
                   and s.labels.get("reason") == "export_failed"
                   for f in text_string_to_metric_families(text) for s in f.samples)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            answer = await complete(client, f"00-{TRACE}-00f067aa0ba902b7-01")
            await wait_until_idle(engine)
            om = await scrape_until(client, dropped)
            client.app.state.serving.observer.stop()
            return answer, om

    answer, om = asyncio.run(scenario())
    assert answer.status_code == 200 and dropped(om.text), om.text[-2000:]
    for family in LATENCIES:
        assert exemplar_traces(om.text, family) == set(), family


def test_without_an_export_only_the_callers_sampled_traces_are_exemplars(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(model="tiny"))

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await complete(client, f"00-{TRACE}-00f067aa0ba902b7-01")
            await complete(client, f"00-{'1' * 32}-00f067aa0ba902b7-00")  # not sampled
            await complete(client)
            await wait_until_idle(engine)
            return (await client.get("/metrics", headers={"Accept": OPENMETRICS})).text

    text = asyncio.run(scenario())
    assert exemplar_traces(text, "batchpilot_time_to_first_token_seconds") == {TRACE}


def test_a_real_prometheus_stores_the_exemplars(tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(model="tiny"))
    with LiveServer(engine, settings) as url, Prometheus(url.removeprefix("http://"), tmp_path,
                    features=("exemplar-storage",)) as prom:
        with httpx.Client(base_url=url, timeout=60) as client:
            ids = []
            for i in range(3):
                trace = f"{i + 1:032x}"
                reply = complete(client, f"00-{trace}-00f067aa0ba902b7-01")
                assert reply.status_code == 200, reply.text
                ids.append(trace)
        query = "batchpilot_time_to_first_token_seconds_bucket"

        def stored() -> set[str]:
            return {e["labels"]["trace_id"] for e in prom.exemplars(query)}

        prom.until(lambda: ids[-1] in stored(), "no exemplar stored")
        assert stored() <= set(ids)


def test_the_otel_switch_adds_the_genai_server_histograms_with_their_buckets(tiny_loaded):
    from control.metrics.genai import DURATION_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

    def scrape(compat):
        settings = ServeSettings(model="tiny", metrics_compat=compat)
        engine, _, settings = make_engine(tiny_loaded, settings=settings)

        async def scenario():
            async with asgi_client(engine, settings) as client:
                for _ in range(2):
                    await client.post("/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 3, "ignore_eos": True})
                await complete(client, f"00-{TRACE}-00f067aa0ba902b7-01")
                await wait_until_idle(engine)
                return (await client.get("/metrics", headers={"Accept": OPENMETRICS})).text

        return {f.name: f for f in text_string_to_metric_families(asyncio.run(scenario()))}

    assert not any(name.startswith("gen_ai") for name in scrape(None))
    fams = scrape("otel")
    for name, bounds in (("gen_ai_server_time_to_first_token_seconds", TTFT_BUCKETS),
                         ("gen_ai_server_time_per_output_token_seconds", TPOT_BUCKETS),
                         ("gen_ai_server_request_duration_seconds", DURATION_BUCKETS)):
        samples = fams[name].samples
        counts = {s.labels["gen_ai_operation_name"]: s.value for s in samples
                  if s.name == name + "_count"}
        assert counts == {"chat": 2, "text_completion": 1}, (name, counts)
        les = sorted({float(s.labels["le"]) for s in samples if s.name == name + "_bucket"})
        assert les == [*bounds, float("inf")]
        assert {s.labels["gen_ai_provider_name"] for s in samples} == {"batchpilot"}
        assert TRACE in {s.exemplar.labels["trace_id"] for s in samples if s.exemplar}
    # our own names still count every request once
    ours = fams["batchpilot_time_to_first_token_seconds"].samples
    assert sum(s.value for s in ours if s.name.endswith("_count")) == 3
