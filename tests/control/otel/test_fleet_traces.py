"""A fleet's trace: the ingress continues the caller's trace with its routing span and the
replica's request span hangs below it (the Ray-free fleet: tests/fixtures/local_fleet.py,
the same ingress and replica code)."""

from __future__ import annotations

import httpx
from fixtures.local_fleet import LocalFleet
from fixtures.otlp_receiver import OtlpReceiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


def test_the_ingress_routing_span_sits_between_the_caller_and_the_replica(
        tiny_llama_dir, tmp_path):
    with OtlpReceiver() as rx:
        with LocalFleet(tiny_llama_dir, tmp_path, otlp_endpoint=rx.endpoint) as fleet:
            reply = httpx.post(f"{fleet.url}/v1/chat/completions", timeout=60,
                               headers={"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}, json={
                                   "model": tiny_llama_dir.name, "max_tokens": 3,
                                   "ignore_eos": True,
                                   "messages": [{"role": "user", "content": "hi"}]})
            assert reply.status_code == 200, reply.text
            replica = reply.headers["x-batchpilot-replica"]
        spans = rx.wait_for(lambda s: sum(x.kind == 2 for x in s) >= 2)
    mine = [s for s in spans if s.trace_id == TRACE_ID]
    route = next(s for s in mine if s.name == "route")
    request = next(s for s in mine if s.kind == 2 and s.name != "route")
    assert route.parent_span_id == PARENT  # the caller's span
    assert request.parent_span_id == route.span_id  # the replica continues the ingress's
    assert route.resource["service.instance.id"] == "ingress"
    assert route.attributes["batchpilot.replica"] == f"replica-{replica}"
    assert route.attributes["batchpilot.routing_reason"]
    assert route.attributes["http.response.status_code"] == 200
    assert request.attributes["batchpilot.replica"] == f"replica-{replica}"
    assert request.resource["service.instance.id"] == f"replica-{replica}"
    # the routing span covers the replica's request (the relay ends after the last token)
    assert route.start_ns <= request.start_ns and request.end_ns <= route.end_ns
    assert reply.headers["x-batchpilot-trace-id"] == TRACE_ID
