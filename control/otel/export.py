"""Spans to an OTLP collector from a thread of their own: a bounded queue, batches, and
counters instead of exceptions. Used by a server's span feed (feed.py) and a fleet's
ingress (its routing spans).

    put(span) -> bounded queue (full: dropped, counted) -> "otel-export" thread: batches of
    up to BATCH_SPANS, at least every FLUSH_EVERY_S -> OTLP (HTTP or gRPC); a failed batch
    is dropped and counted, and warned about at most once a minute; the trace ids of each
    batch the collector took go to `on_delivered` where the caller gives one (a server's
    span feed keeps them, DeliveredTraces, so that a latency exemplar names only a trace the
    operator's backend has: control/metrics/core.py Histogram.shows)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from control.metrics.registry import counter_family
from control.otel.settings import OtelSettings

log = logging.getLogger("batchpilot.otel")
MAX_SPAN_BACKLOG = 20_000  # spans waiting for export before new ones are dropped
BATCH_SPANS = 512  # spans per export call at most
FLUSH_EVERY_S = 1.0  # a partial batch waits at most this long
WARN_EVERY_S = 60.0  # a failing collector is logged at most this often
EXPORT_TIMEOUT_S = 5.0  # one export call, retries included (the SDK exporter retries)
# Trace ids remembered as delivered. An exemplar whose trace fell out (this many delivered
# traces later) is no longer shown; Prometheus keeps the exemplars it has scraped.
DELIVERED_TRACES = 65_536


def make_exporter(settings: OtelSettings) -> SpanExporter:
    # the SDK exporters log every failed attempt; SpanExport counts and warns once a minute
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                 "opentelemetry.exporter.otlp.proto.grpc.exporter"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = settings.endpoint
        insecure = not endpoint.startswith("https://")
        return OTLPSpanExporter(endpoint=endpoint.split("://", 1)[-1], insecure=insecure,
                                timeout=EXPORT_TIMEOUT_S)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint, timeout=EXPORT_TIMEOUT_S)


def resource_of(settings: OtelSettings) -> Resource:
    """service.name, and service.instance.id for a fleet's replica or ingress (the
    standard OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME variables are merged in too)."""
    return Resource.create({"service.name": settings.service_name,
                            **({"service.instance.id": settings.replica}
                               if settings.replica else {})})


class DeliveredTraces:
    """The last `limit` trace ids whose spans the collector took (32 hex digits): added by
    one thread, asked by any (`in`; each dict operation is atomic under the GIL)."""

    def __init__(self, limit: int = DELIVERED_TRACES):
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, trace_ids: Iterable[str]) -> None:
        for trace_id in trace_ids:
            self._ids[trace_id] = None
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self._ids


class SpanExport:
    def __init__(self, settings: OtelSettings, exporter: SpanExporter | None = None,
                 on_delivered: Callable[[list[str]], None] | None = None):
        """`on_delivered(trace_ids)`: called on the export thread with each batch the
        collector took, before the exported count moves."""
        self.settings = settings.validate()
        self.exporter = exporter or make_exporter(settings)
        self.on_delivered = on_delivered
        self.counts = {"exported": 0, "queue_full": 0, "export_failed": 0}
        self._spans: queue.Queue = queue.Queue(MAX_SPAN_BACKLOG)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._next_warning = 0.0

    def put(self, span: ReadableSpan) -> None:
        """From any thread; never blocks."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="otel-export",
                                            daemon=True)
            self._thread.start()
        try:
            self._spans.put_nowait(span)
        except queue.Full:
            self.counts["queue_full"] += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        """Export what is queued (for at most timeout_s), then stop."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join(timeout_s)
            self._thread = None
        self.exporter.shutdown()

    def families(self, model: str) -> Iterator[object]:
        yield from span_families(model, self.counts)

    def _loop(self) -> None:
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
        if ok and self.on_delivered is not None:  # before the count moves: the span
            # process reports both when the count does
            self.on_delivered(list(dict.fromkeys(f"{span.context.trace_id:032x}"
                                                 for span in batch)))
        self.counts["exported" if ok else "export_failed"] += len(batch)
        now = time.monotonic()
        if not ok and now >= self._next_warning:  # once a minute, not once a batch
            log.warning("exporting spans to %s failed; %d dropped so far (counted in"
                        " batchpilot_otel_spans_dropped_total)", self.settings.endpoint,
                        self.counts["export_failed"])
            self._next_warning = now + WARN_EVERY_S


def span_families(model: str, c: dict[str, int]) -> Iterator[object]:
    """The export's counters for /metrics: `c` as SpanExport.counts."""
    yield counter_family("batchpilot_otel_spans_exported_total", "Spans the OTLP collector"
                         " accepted.", ["model"], {(model,): c["exported"]})
    yield counter_family("batchpilot_otel_spans_dropped_total", "Spans not exported: the"
                         " export queue was full or the collector failed.",
                         ["model", "reason"], {(model, "queue_full"): c["queue_full"],
                                               (model, "export_failed"): c["export_failed"]})
