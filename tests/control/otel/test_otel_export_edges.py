"""The span export (control/otel/export.py) and the server's span feed (control/otel/feed.py)
where test_export_backlog.py and test_sampling_rule.py do not look: a partial batch flushed
in time, a stop that exports everything queued, failures counted per span and warned about
once, delivered trace ids as 32 hex digits, the feed's own backlog, its last wake-up at a
stop, and the phases it builds from each step. Fake spans and exporters: no collector."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from control.otel import export
from control.otel import feed as feed_module
from control.otel.export import DeliveredTraces, SpanExport
from control.otel.feed import OtelFeed
from control.otel.settings import OtelSettings
from control.trace.writer import StepItem
from engine.records import AdmissionDecision, RequestRecord, SchedulingDecisions, StepRecord
from engine.request import TraceLink

SETTINGS = OtelSettings("http://127.0.0.1:1/v1/traces")
LINK = TraceLink("0" * 31 + "1", "1" * 16)


def span(trace_id: int) -> SimpleNamespace:
    """What SpanExport reads of a span: its context's trace id."""
    return SimpleNamespace(context=SimpleNamespace(trace_id=trace_id))


class Recorder(SpanExporter):
    """Keeps each batch; takes them (`ok`) or refuses them; `hold`: the first export waits
    until `release` is set, as a collector that stopped reading."""

    def __init__(self, ok: bool = True, hold: bool = False):
        self.ok, self.hold = ok, hold
        self.batches: list[list] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def export(self, spans):
        self.batches.append(list(spans))
        self.entered.set()
        if self.hold:
            self.release.wait(10)
        return SpanExportResult.SUCCESS if self.ok else SpanExportResult.FAILURE

    def shutdown(self):
        pass  # nothing to close: it holds no connection


def wait_for(done: Callable[[], bool], what: object, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_partial_batch_is_exported_within_flush_every_s(monkeypatch):
    """A quiet server's last few spans reach the collector without waiting for a full batch
    or a shutdown."""
    monkeypatch.setattr(export, "FLUSH_EVERY_S", 0.05)
    recorder = Recorder()
    spans = SpanExport(SETTINGS, recorder)
    try:
        spans.put(span(1))
        wait_for(lambda: spans.counts["exported"] == 1, spans.counts)
    finally:
        spans.stop(1.0)


def test_a_stop_exports_every_span_still_queued(monkeypatch):
    monkeypatch.setattr(export, "BATCH_SPANS", 1)
    monkeypatch.setattr(export, "FLUSH_EVERY_S", 60.0)
    recorder = Recorder(hold=True)
    spans = SpanExport(SETTINGS, recorder)
    spans.put(span(1))
    assert recorder.entered.wait(10)  # the export thread is inside export() with span 1
    for trace_id in range(2, 6):
        spans.put(span(trace_id))
    threading.Timer(0.3, recorder.release.set).start()  # the collector reads again
    spans.stop(5.0)  # called while the collector still holds the first batch
    assert spans.counts == {"exported": 5, "queue_full": 0, "export_failed": 0}


def test_a_failed_batch_counts_each_span_and_is_warned_about_once(monkeypatch, caplog):
    monkeypatch.setattr(export, "BATCH_SPANS", 3)
    monkeypatch.setattr(export, "FLUSH_EVERY_S", 60.0)
    caplog.set_level(logging.WARNING, logger="batchpilot.otel")
    delivered: list[str] = []
    spans = SpanExport(SETTINGS, Recorder(ok=False), on_delivered=delivered.extend)
    try:
        for batch in (1, 2):
            for trace_id in range(3):
                spans.put(span(trace_id + 1))
            wait_for(lambda batch=batch: spans.counts["export_failed"] == 3 * batch,
                     spans.counts)
    finally:
        spans.stop(1.0)
    assert spans.counts == {"exported": 0, "queue_full": 0, "export_failed": 6}
    warned = [r for r in caplog.records if "exporting spans" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert delivered == []  # a refused batch's traces are no exemplar's


def test_delivered_trace_ids_are_32_hex_digits_once_each(monkeypatch):
    """An exemplar's trace id is matched against these as text: a trace id with leading
    zero digits must keep them."""
    monkeypatch.setattr(export, "BATCH_SPANS", 3)
    monkeypatch.setattr(export, "FLUSH_EVERY_S", 60.0)
    delivered: list[str] = []
    spans = SpanExport(SETTINGS, Recorder(), on_delivered=delivered.extend)
    try:
        for trace_id in (1, 0xABC << 100, 1):
            spans.put(span(trace_id))
        wait_for(lambda: spans.counts["exported"] == 3, spans.counts)
    finally:
        spans.stop(1.0)
    assert delivered == ["0" * 31 + "1", "0" * 4 + "abc" + "0" * 25]


def test_delivered_traces_forget_the_oldest_first():
    traces = DeliveredTraces(limit=2)
    traces.add(["a", "b"])
    traces.add(["c"])
    assert "a" not in traces and "b" in traces and "c" in traces


# ---- the span feed ------------------------------------------------------------------------

T0 = 1000.0  # engine clock


def finished(rid: str, finish_reason: str) -> RequestRecord:
    filled = {f.name: 0 for f in dataclasses.fields(RequestRecord)
              if f.default is dataclasses.MISSING}
    filled.update(request_id=rid, lane="interactive", tenant="t", status="finished",
                  finish_reason=finish_reason, finish_detail="", arrival_time=T0,
                  finished_time=T0 + 2.0, e2e_s=2.0, ttft_s=0.1)
    return RequestRecord(**filled, trace=LINK)


def prefill_step(rid: str, tokens: int) -> StepRecord:
    filled = {f.name: 0 for f in dataclasses.fields(StepRecord)
              if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING}
    filled.update(step_id=1, start_time=T0 + 0.5, end_time=T0 + 1.0, duration_s=0.5,
                  running_by_lane={}, waiting_by_lane={}, finished=[], config_version=1,
                  decode_ids=[], prefill_chunks=[(rid, tokens)],
                  decisions=SchedulingDecisions(admitted=[rid], preempted=[]))
    return StepRecord(**filled)


def admission(rid: str) -> AdmissionDecision:
    return AdmissionDecision(True, rid, lane="interactive", time=T0, arrival_time=T0)


def test_the_feed_builds_each_kept_requests_phases_and_forgets_every_ended_one():
    """The phases of an error (kept at ratio 0) come from its admission and its steps; an
    ordinary request sampled out leaves nothing behind in the tracker."""
    feed = OtelFeed(OtelSettings("http://x", sample_ratio=0.0), InMemorySpanExporter())
    try:
        kept = feed._on_item(StepItem(prefill_step("e", 8), [],
                                      [admission("e"), admission("s")]))
        kept += feed._on_item(StepItem(None, [finished("e", "error"), finished("s", "stop")],
                                       []))
        [(rec, phases)] = kept
        assert rec.request_id == "e" and phases is not None
        assert [c.tokens for run in phases.runs for c in run.chunks] == [8]
        assert feed.tracker.live == {}
        assert feed.requests == {"kept": 1, "not_sampled": 1}
    finally:
        feed.stop(1.0)


def test_a_full_step_backlog_drops_and_counts_the_step(monkeypatch):
    monkeypatch.setattr(feed_module, "MAX_STEP_BACKLOG", 2)
    gate = threading.Event()  # the span thread is held: nothing leaves the queue
    monkeypatch.setattr(OtelFeed, "_loop", lambda self: gate.wait(10))
    feed = OtelFeed(SETTINGS, InMemorySpanExporter())
    try:
        for _ in range(3):
            feed.submit(StepItem(None, [], []))
        assert feed.steps_dropped == 1
        families = {s.name: s.value for f in feed.families("m") for s in f.samples}
        assert families["batchpilot_otel_steps_dropped_total"] == 1
    finally:
        gate.set()
        feed.stop(1.0)


def test_a_stopping_feed_exports_the_requests_of_its_last_wake_up(monkeypatch):
    """The stop's marker and a last error arrive in the same wake-up: the error's spans
    still go out."""
    gate = threading.Event()  # the span thread's 100 ms nap lasts until the stop is queued
    monkeypatch.setattr(feed_module, "time", SimpleNamespace(
        sleep=lambda s: gate.wait(10), monotonic=time.monotonic, time=time.time))
    exporter = InMemorySpanExporter()
    feed = OtelFeed(OtelSettings("http://x", sample_ratio=0.0), exporter)
    feed.submit(StepItem(None, [finished("e", "error")], []))
    threading.Timer(0.3, gate.set).start()
    feed.stop(5.0)
    assert feed.requests["kept"] == 1
    assert exporter.get_finished_spans(), feed.counts


@pytest.mark.parametrize("reason", ["error", "timeout"])
def test_errors_and_timeouts_are_kept_at_ratio_zero(reason):
    feed = OtelFeed(OtelSettings("http://x", sample_ratio=0.0), InMemorySpanExporter())
    try:
        kept = feed._on_item(StepItem(None, [finished("r", reason)], []))
        assert [rec.request_id for rec, _ in kept] == ["r"]
    finally:
        feed.stop(1.0)
