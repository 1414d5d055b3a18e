"""A fleet's trace: the ingress continues the caller's trace with its routing span and the
replica's request span hangs below it (the Ray-free fleet: tests/fixtures/local_fleet.py,
the same ingress and replica code). The ingress's hop on its own: the traceparent it
forwards carries its sampling decision, and a 5xx of its own is always exported, as an
error."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
from fixtures.local_fleet import LocalFleet
from fixtures.otlp_receiver import OtlpReceiver
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from control.otel.context import link_from_headers, parse_traceparent
from control.otel.door import Hop

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


class _Door:
    """What a Hop needs of its TraceDoor: where its routing span goes."""

    def __init__(self):
        self.resource = Resource.create({"service.name": "batchpilot"})
        self.spans: list = []
        self.export = SimpleNamespace(put=self.spans.append)


def test_the_replica_is_told_the_ingress_sampling_decision_not_the_callers():
    """A caller without a traceparent: the ingress kept the trace by its ratio, so the
    traceparent it forwards names its routing span and says sampled, and the replica keeps
    its request's spans below that span (not the caller's unsampled default)."""
    link = link_from_headers({})
    assert not link.sampled and not link.parent_span_id
    hop = Hop(_Door(), link, sampled=True, arrived=time.time())
    sent = hop.headers([(b"traceparent", b"00-junk"), (b"x-other", b"1")], replica=2)
    values = [v.decode() for k, v in sent if k == b"traceparent"]
    assert values == [f"00-{link.trace_id}-{link.span_id}-01"]
    assert (b"x-other", b"1") in sent and hop.replica == 2
    assert parse_traceparent(values[0]) == (link.trace_id, link.span_id, True)
    unsampled = Hop(_Door(), link_from_headers({}), sampled=False, arrived=time.time())
    (value,) = [v for k, v in unsampled.headers([], 0) if k == b"traceparent"]
    assert value.endswith(b"-00")


def test_an_ingress_500_is_exported_as_an_error_even_when_not_sampled():
    """A failure at the ingress itself (no replica, replica down) always has its routing
    span, with an ERROR status and the status code as error.type; an unsampled success
    has none; a hop ends once."""
    door = _Door()
    for status in (500, 503):
        hop = Hop(door, link_from_headers({}), sampled=False, arrived=time.time())
        hop.end(status)
        hop.end(status)
    assert len(door.spans) == 2
    for span, status in zip(door.spans, (500, 503), strict=True):
        assert span.name == "route" and span.status.status_code == StatusCode.ERROR
        assert span.attributes["error.type"] == str(status)
        assert span.attributes["http.response.status_code"] == status
    Hop(door, link_from_headers({}), sampled=False, arrived=time.time()).end(200)
    Hop(door, link_from_headers({}), sampled=False, arrived=time.time()).end(499)
    assert len(door.spans) == 2
    ok = Hop(door, link_from_headers({}), sampled=True, arrived=time.time())
    ok.end(200)
    assert door.spans[-1].status.status_code == StatusCode.UNSET
    assert "error.type" not in door.spans[-1].attributes
