"""OTLP export end to end: a server over the tiny model sends each request's trace to a real
OTLP/HTTP receiver (tests/fixtures/otlp_receiver.py decodes the Collector's wire format).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fixtures.otlp_receiver import OtlpGrpcReceiver, OtlpReceiver, Span
from fixtures.serving import ServerProcess, asgi_client, make_engine, wait_until_idle

from control.serve.settings import ServeSettings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
PHASES = {"tokenize", "queued", "prefill", "decode"}


def serve_settings(endpoint: str, **extra) -> ServeSettings:
    return ServeSettings(model="tiny", otlp_traces_endpoint=endpoint, **extra)


async def stream(client: httpx.AsyncClient, headers: dict | None = None,
                 max_tokens: int = 6) -> httpx.Response:
    async with client.stream("POST", "/v1/chat/completions", headers=headers or {}, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hello there " * 8}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}) as reply:
        await reply.aread()
        return reply


def run(tiny_loaded, settings: ServeSettings, scenario, **engine_options):
    engine, _, settings = make_engine(tiny_loaded, settings=settings, **engine_options)

    async def main():
        async with asgi_client(engine, settings) as client:
            result = await scenario(client, engine)
            await wait_until_idle(engine)
            return result, client.app.state.serving

    result, state = asyncio.run(main())
    state.observer.stop()  # what the lifespan does at shutdown: export what is queued
    return result, state


def tree(spans: list[Span], trace_id: str) -> tuple[Span, list[Span]]:
    mine = [s for s in spans if s.trace_id == trace_id]
    roots = [s for s in mine if s.kind == 2]  # SPAN_KIND_SERVER
    assert len(roots) == 1, [(s.name, s.kind) for s in mine]
    return roots[0], [s for s in mine if s is not roots[0]]


def test_a_streamed_request_continues_the_callers_trace_with_its_phases(tiny_loaded):
    with OtlpReceiver() as rx:
        async def scenario(client, engine):
            return await stream(client, {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"})

        reply, _ = run(tiny_loaded, serve_settings(rx.endpoint), scenario)
        assert reply.status_code == 200
        assert reply.headers["x-batchpilot-trace-id"] == TRACE_ID
        spans = rx.wait_for(lambda s: any(x.kind == 2 for x in s))
    root, children = tree(spans, TRACE_ID)
    assert root.parent_span_id == PARENT  # the caller's span is the request's parent
    assert root.name == "chat tiny"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny"
    assert a["gen_ai.request.max_tokens"] == 6 and a["gen_ai.usage.output_tokens"] == 6
    assert a["gen_ai.usage.input_tokens"] > 8
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["server.address"] == "127.0.0.1" and a["batchpilot.lane"]
    assert a["batchpilot.tenant"] == "default" and "batchpilot.config_version" in a
    assert root.resource["service.name"] == "batchpilot"
    # the phases tile the request: their durations add up to its E2E (ns rounding only)
    phases = [s for s in children if s.parent_span_id == root.span_id]
    assert {s.name for s in phases} >= {"queued", "prefill", "decode"}, phases
    assert {s.name for s in phases} <= PHASES
    assert abs(sum(s.duration_ns for s in phases) - root.duration_ns) <= 2 * len(phases)
    assert abs(root.duration_ns / 1e9 - a["batchpilot.e2e_s"]) < 1e-6
    by_start = sorted(phases, key=lambda s: s.start_ns)
    assert by_start[0].start_ns == root.start_ns and by_start[-1].end_ns == root.end_ns
    for before, after in zip(by_start, by_start[1:], strict=False):
        assert abs(after.start_ns - before.end_ns) <= 1, (before.name, after.name)
    prefill = next(s for s in phases if s.name == "prefill")
    chunks = [s for s in children if s.parent_span_id == prefill.span_id]
    assert chunks and all(s.name == "prefill_chunk" for s in chunks)
    assert sum(c.attributes["batchpilot.tokens"] for c in chunks) == \
        a["gen_ai.usage.input_tokens"] - a["batchpilot.cached_tokens"]
    decode = next(s for s in phases if s.name == "decode")
    assert decode.attributes["batchpilot.decode_steps"] == 5  # 6 tokens: 1 from prefill


def test_grpc_delivers_the_same_trace(tiny_loaded):
    with OtlpGrpcReceiver() as rx:
        async def scenario(client, engine):
            return await stream(client, {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"})

        settings = serve_settings(rx.endpoint, otlp_protocol="grpc")
        reply, state = run(tiny_loaded, settings, scenario)
        assert reply.status_code == 200
        spans = rx.wait_for(lambda s: any(x.kind == 2 for x in s))
    root, children = tree(spans, TRACE_ID)
    assert root.parent_span_id == PARENT and root.attributes["gen_ai.operation.name"] == "chat"
    assert {s.name for s in children} >= {"queued", "prefill", "decode"}
    assert state.observer.spans.counts["export_failed"] == 0


def test_without_a_traceparent_the_request_starts_a_trace_and_bad_headers_are_ignored(
        tiny_loaded):
    bad = ["00-" + "0" * 32 + f"-{PARENT}-01", "zz-not-a-header", "00-" + "x" * 2000,
           f"00-{TRACE_ID.upper()}-{PARENT}-01", f"ff-{TRACE_ID}-{PARENT}-01"]
    with OtlpReceiver() as rx:
        async def scenario(client, engine):
            replies = [await stream(client, {"traceparent": h}, max_tokens=2) for h in bad]
            replies.append(await stream(client, max_tokens=2))
            return replies

        replies, _ = run(tiny_loaded, serve_settings(rx.endpoint), scenario)
        assert [r.status_code for r in replies] == [200] * len(replies)
        ids = [r.headers["x-batchpilot-trace-id"] for r in replies]
        assert len(set(ids)) == len(ids) and TRACE_ID not in ids
        spans = rx.wait_for(lambda s: sum(x.kind == 2 for x in s) == len(replies))
    roots = [s for s in spans if s.kind == 2]
    assert sorted(s.trace_id for s in roots) == sorted(ids)
    assert all(s.parent_span_id == "" for s in roots)  # each started its own trace


def test_sampling_keeps_the_ratio_the_callers_flag_and_every_error(tiny_loaded):
    unsampled = f"00-{TRACE_ID}-{PARENT}-00"
    with OtlpReceiver() as rx:
        async def scenario(client, engine):
            plain = [await stream(client, max_tokens=1) for _ in range(4)]
            parent_no = await stream(client, {"traceparent": unsampled}, max_tokens=1)
            parent_yes = await stream(client, {"traceparent": unsampled[:-1] + "1"},
                                      max_tokens=1)
            late = await client.post("/v1/completions", headers={
                "X-Request-Timeout-Ms": "1"}, json={"model": "tiny", "prompt": "x",
                                                    "max_tokens": 50, "ignore_eos": True})
            return plain, parent_no, parent_yes, late

        (plain, no, yes, late), state = run(
            tiny_loaded, serve_settings(rx.endpoint, otlp_sample_ratio=0.0), scenario,
            delay_s=0.01)
        timed_out = late.headers["x-batchpilot-trace-id"]
        spans = rx.wait_for(lambda s: {x.trace_id for x in s if x.kind == 2}
                            >= {TRACE_ID, timed_out})
        time.sleep(0.3)  # anything else would have come in the same export
        spans = list(rx.spans)
    kept = {s.trace_id for s in spans if s.kind == 2}
    assert kept == {TRACE_ID, timed_out}, kept  # ratio 0: only the flagged and the timeout
    root = next(s for s in spans if s.kind == 2 and s.trace_id == timed_out)
    assert root.status_code == 2 and root.attributes["error.type"] == "timeout"
    counts = state.observer.spans.counts
    assert counts["kept"] == 2 and counts["not_sampled"] == 5


def test_a_collector_that_is_down_costs_a_counter_and_nothing_else(tiny_loaded):
    with OtlpReceiver() as rx:
        endpoint = rx.endpoint  # closed after this block: nobody listens there
    async def scenario(client, engine):
        replies = await asyncio.gather(*(stream(client, max_tokens=4) for _ in range(4)))
        return replies

    replies, state = run(tiny_loaded, serve_settings(endpoint), scenario)
    assert [r.status_code for r in replies] == [200] * 4
    assert all(json.loads(line[6:])["choices"] is not None for r in replies
               for line in r.text.splitlines() if line.startswith("data: {"))
    counts = state.observer.spans.counts
    assert counts["export_failed"] > 0 and counts["exported"] == 0, counts
    metrics = "\n".join(str(f) for f in state.observer.spans.families("tiny"))
    assert "export_failed" in metrics


@pytest.mark.parametrize("option,value", [("otlp_protocol", "thrift"),
                                          ("otlp_sample_ratio", 1.5),
                                          ("otlp_slow_ttft_s", 0.0)])
def test_bad_otlp_settings_are_refused_naming_the_option(option, value):
    with pytest.raises(ValueError, match=option):
        ServeSettings(model="tiny", otlp_traces_endpoint="http://127.0.0.1:1/v1/traces",
                      **{option: value}).validate()


def test_the_trace_names_each_requests_trace_and_answers_a_lookup_by_trace_id(
        tiny_loaded, tmp_path, capsys):
    from control.cli.main import main

    db = str(tmp_path / "t.duckdb")
    traceparent = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}

    async def scenario(client, engine):
        client.app.state.serving.trace.start()  # what the lifespan does
        first = await stream(client, traceparent, max_tokens=2)
        second = await stream(client, traceparent, max_tokens=2)
        other = await stream(client, max_tokens=2)
        await wait_until_idle(engine)
        by_trace = await client.get(f"/v1/trace/requests/{TRACE_ID}")
        unknown = await client.get(f"/v1/trace/requests/{'e' * 32}")
        return first, second, other, by_trace, unknown

    (first, second, other, by_trace, unknown), state = run(
        tiny_loaded, ServeSettings(model="tiny", trace_db=db), scenario)
    state.trace.stop()
    ids = [r.headers["x-batchpilot-request-id"] for r in (first, second)]
    assert by_trace.status_code == 200, by_trace.text
    body = by_trace.json()
    assert body["request"]["trace_id"] == TRACE_ID and body["request_id"] == ids[1]
    assert sorted(body["trace_requests"]) == sorted(ids)
    assert unknown.status_code == 404
    assert main(["trace", "--db", db, "request", other.headers[
        "x-batchpilot-request-id"]]) == 0
    assert f"trace {other.headers['x-batchpilot-trace-id']}" in capsys.readouterr().out
    assert main(["trace", "--db", db, "request", TRACE_ID]) == 0
    out = capsys.readouterr().out
    assert f"request {ids[1]}" in out and f"trace {TRACE_ID} (also: {ids[0]})" in out


def test_the_yaml_telemetry_block_sets_the_export_and_a_flag_wins(tmp_path, capsys):
    import argparse

    from control.cli.main import main
    from control.otel.cli_args import add_otlp_args, otlp_settings

    config = tmp_path / "serving.yaml"
    config.write_text("telemetry:\n  otlp_traces_endpoint: http://127.0.0.1:4318/v1/traces\n"
                      "  otlp_sample_ratio: 0.25\n")
    parser = argparse.ArgumentParser()
    add_otlp_args(parser)
    settings = ServeSettings(model="tiny", config_path=str(config)).replace(
        **otlp_settings(parser.parse_args(["--otlp-sample-ratio", "0.5"]), str(config)))
    otlp = settings.validate().otlp
    assert otlp.endpoint == "http://127.0.0.1:4318/v1/traces" and otlp.sample_ratio == 0.5
    for block, named in (("  otlp_endpoint: x\n", "otlp_endpoint"),
                         ("  otlp_traces_endpoint: http://h/v1/traces\n"
                          "  otlp_sample_ratio: lots\n", "otlp_sample_ratio")):
        config.write_text("telemetry:\n" + block)
        assert main(["serve", "--model", str(tmp_path), "--config", str(config)]) == 2
        assert named in capsys.readouterr().err


def test_a_server_without_an_export_never_imports_the_sdk():
    """The SDK and its exporters load only where a collector is configured (app.py's
    span_feed): the server's modules and the CLI import none of it."""
    import subprocess
    import sys

    code = ("import sys, control.api.app, control.cli.main, control.fleet.ingress;"
            " print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_ready_banner_says_where_spans_go_and_which_are_kept(tiny_llama_dir, tmp_path):
    with ServerProcess(tiny_llama_dir, tmp_path, {}, "--otlp-traces-endpoint",
                       "http://127.0.0.1:9/v1/traces", "--otlp-sample-ratio", "0.25",
                       "--otlp-slow-ttft-s", "2") as server:
        banner = server.log()
    assert ("otlp: spans to http://127.0.0.1:9/v1/traces (http/protobuf); kept: as the"
            " caller's traceparent says, else 0.25 of traces; always errors and timeouts,"
            " and any slower than 2 s to a first token") in banner


@pytest.mark.parametrize("block", ["[]", "[otlp_traces_endpoint]", "http://h/v1/traces"])
def test_a_telemetry_block_that_is_not_a_mapping_is_refused_naming_its_keys(tmp_path, block):
    from control.otel.cli_args import telemetry_block

    config = tmp_path / "serving.yaml"
    config.write_text(f"telemetry: {block}\n")
    with pytest.raises(ValueError, match="telemetry in .* must be a mapping of"
                       " otlp_traces_endpoint, otlp_protocol"):
        telemetry_block(str(config))
