"""Which finished requests' spans are exported (control/otel/settings.py `keep`): every
error and timeout whatever the ratio, a slow first token, else the ratio by trace id."""

from __future__ import annotations

import dataclasses

import pytest

from control.otel.settings import OtelSettings, keep
from engine.records import RequestRecord
from engine.request import TraceLink

LINK = TraceLink("0" * 31 + "1", "1" * 16)


def record(finish_reason: str, ttft_s: float | None = 0.1,
           trace: TraceLink | None = LINK) -> RequestRecord:
    filled = {f.name: 0 for f in dataclasses.fields(RequestRecord)
              if f.default is dataclasses.MISSING}
    filled.update(request_id="r", lane="interactive", tenant="t", status="finished",
                  finish_reason=finish_reason, finish_detail="", ttft_s=ttft_s)
    return RequestRecord(**filled, trace=trace)


@pytest.mark.parametrize(("finish_reason", "kept"), [
    ("stop", False), ("length", False), ("cancelled", False),
    ("error", True), ("timeout", True)])
def test_at_ratio_zero_only_errors_and_timeouts_are_kept(finish_reason, kept):
    assert keep(record(finish_reason), OtelSettings("http://x", sample_ratio=0.0)) is kept


def test_a_slow_first_token_is_kept_and_a_request_without_a_trace_never():
    settings = OtelSettings("http://x", sample_ratio=0.0, slow_ttft_s=1.0)
    assert keep(record("stop", ttft_s=1.5), settings) is True
    assert keep(record("stop", ttft_s=0.5), settings) is False
    assert keep(record("error", trace=None), settings) is False
    assert keep(record("stop"), OtelSettings("http://x", sample_ratio=1.0)) is True


def test_the_sampling_counter_counts_only_requests_that_had_a_trace():
    """batchpilot_otel_requests_total{decision}: a request that never had a trace was not
    sampled out; counting it would make the kept share look smaller than it is."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from control.otel.feed import OtelFeed
    from control.trace.writer import StepItem

    feed = OtelFeed(OtelSettings("http://x", sample_ratio=0.0), InMemorySpanExporter())
    try:
        kept = feed._on_item(StepItem(None, [record("stop"), record("stop", trace=None),
                                             record("error")], []))
        assert [rec.finish_reason for rec, _ in kept] == ["error"]
        assert feed.requests == {"kept": 1, "not_sampled": 1}
    finally:
        feed.stop(1.0)
