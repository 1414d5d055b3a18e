"""OpenTelemetry export off the engine thread and the event loop.

    engine thread (per step, O(1))      "otel-spans" thread              "otel-export" thread
    ------------------------------      -------------------              --------------------
    Observer.on_step -> submit(item) -> phases from the steps;         batches -> OTLP
                        (bounded: a     each finished request: sample,   (HTTP or gRPC); a
                        full queue       build its spans -> bounded      failed batch is
                        drops, counted)  queue (drops, counted)          dropped, counted

Which requests are exported: control/otel/settings.py `keep`. Nothing here raises into its
callers: an unreachable collector costs the server a counter
(batchpilot_otel_spans_dropped_total{reason="export_failed"}) and nothing more.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from control.metrics.registry import counter_family
from control.otel.phases import PhaseTracker
from control.otel.settings import OtelSettings, keep
from control.otel.spans import SpanBuilder
from control.serve.bursts import drain
from control.trace.writer import StepItem

log = logging.getLogger("batchpilot.otel")
MAX_STEP_BACKLOG = 50_000  # steps the span thread may fall behind before dropping
MAX_SPAN_BACKLOG = 20_000  # spans waiting for export before new ones are dropped
BATCH_SPANS = 512  # spans per export call at most
FLUSH_EVERY_S = 1.0  # a partial batch waits at most this long
WARN_EVERY_S = 60.0  # a failing collector is logged at most this often
EXPORT_TIMEOUT_S = 5.0  # one export call, retries included (the SDK exporter retries)


def make_exporter(settings: OtelSettings) -> SpanExporter:
    # the SDK exporters log every failed attempt; the feed counts and warns once a minute
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                 "opentelemetry.exporter.otlp.proto.grpc.exporter"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = settings.endpoint.removeprefix("http://")
        return OTLPSpanExporter(endpoint=endpoint, insecure=settings.endpoint.startswith(
            "http://") or "://" not in settings.endpoint, timeout=EXPORT_TIMEOUT_S)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint, timeout=EXPORT_TIMEOUT_S)


class OtelFeed:
    """Fed StepItems by the Observer (engine thread); exports the kept requests' spans."""

    def __init__(self, settings: OtelSettings, exporter: SpanExporter | None = None):
        self.settings = settings.validate()
        resource = Resource.create({"service.name": settings.service_name,
                                    **({"service.instance.id": settings.replica}
                                       if settings.replica else {})})
        self.builder = SpanBuilder(resource, settings.replica)
        self.exporter = exporter or make_exporter(settings)
        self.tracker = PhaseTracker()
        self.counts = {"exported": 0, "queue_full": 0, "export_failed": 0, "steps_dropped": 0,
                       "kept": 0, "not_sampled": 0}
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._spans: queue.Queue = queue.Queue(MAX_SPAN_BACKLOG)
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._next_warning = 0.0

    # ---- the engine thread -----------------------------------------------------------------
    def submit(self, item: StepItem) -> None:
        if not self._threads:
            self._start()
        if self._steps.qsize() >= MAX_STEP_BACKLOG:
            self.counts["steps_dropped"] += 1
            return
        self._steps.put(item)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (for at most timeout_s), then stop both threads."""
        if not self._threads:
            return
        self._steps.put(None)
        self._threads[0].join(timeout_s)
        self._stopping.set()
        self._threads[1].join(timeout_s)
        self.exporter.shutdown()
        self._threads = []

    def families(self, model: str) -> Iterator[object]:
        c = self.counts
        yield counter_family("batchpilot_otel_spans_exported_total", "Spans the OTLP"
                             " collector accepted.", ["model"], {(model,): c["exported"]})
        yield counter_family("batchpilot_otel_spans_dropped_total", "Spans not exported:"
                             " the export queue was full or the collector failed.",
                             ["model", "reason"], {(model, "queue_full"): c["queue_full"],
                                                   (model, "export_failed"): c["export_failed"]})
        yield counter_family("batchpilot_otel_requests_total", "Ended requests by sampling"
                             " decision.", ["model", "decision"],
                             {(model, "kept"): c["kept"], (model, "not_sampled"):
                              c["not_sampled"]})
        yield counter_family("batchpilot_otel_steps_dropped_total", "Steps the span thread"
                             " could not keep up with (their requests' phases are"
                             " incomplete).", ["model"], {(model,): c["steps_dropped"]})

    # ---- threads -----------------------------------------------------------------------------
    def _start(self) -> None:
        self._threads = [threading.Thread(target=self._spans_loop, name="otel-spans",
                                          daemon=True),
                         threading.Thread(target=self._export_loop, name="otel-export",
                                          daemon=True)]
        for thread in self._threads:
            thread.start()

    def _spans_loop(self) -> None:
        next_purge = time.monotonic() + 60.0
        while True:
            time.sleep(0.1)  # bursts: one GIL hand-over per 100 ms, not one per step
            for item in drain(self._steps):
                if item is None:
                    return
                try:
                    self._on_item(item)
                except Exception:  # a bug here must not stop the feed
                    log.exception("building spans failed; the server goes on")
            if time.monotonic() > next_purge:
                self.tracker.purge(time.time())
                next_purge = time.monotonic() + 60.0

    def _on_item(self, item: StepItem) -> None:
        for decision in item.admissions:
            self.tracker.on_admission(decision)
        if item.record is not None:
            self.tracker.on_step(item.record)
        for rec in item.finished:
            phases = self.tracker.on_finished(rec)
            if not keep(rec, self.settings):
                self.counts["not_sampled"] += rec.trace is not None
                continue
            self.counts["kept"] += 1
            for span in self.builder.build(rec, phases):
                try:
                    self._spans.put_nowait(span)
                except queue.Full:
                    self.counts["queue_full"] += 1

    def _export_loop(self) -> None:
        batch: list[ReadableSpan] = []
        due = time.monotonic() + FLUSH_EVERY_S
        while True:
            stopping = self._stopping.is_set()
            with contextlib.suppress(queue.Empty):
                batch.append(self._spans.get(timeout=0.05))
            if batch and (len(batch) >= BATCH_SPANS or time.monotonic() >= due or stopping):
                self._export(batch)
                batch, due = [], time.monotonic() + FLUSH_EVERY_S
            if stopping and self._spans.empty() and not batch:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
        except Exception:
            ok = False
        self.counts["exported" if ok else "export_failed"] += len(batch)
        now = time.monotonic()
        if not ok and now >= self._next_warning:  # once a minute, not once a batch
            log.warning("exporting spans to %s failed; %d dropped so far (counted in"
                        " batchpilot_otel_spans_dropped_total)", self.settings.endpoint,
                        self.counts["export_failed"])
            self._next_warning = now + WARN_EVERY_S
