"""A collector slower than the spans: SpanExport (control/otel/export.py) keeps at most
MAX_SPAN_BACKLOG spans waiting, drops the rest without blocking, and counts each drop."""

from __future__ import annotations

import threading

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from control.otel import export
from control.otel.settings import OtelSettings


class HeldExporter(SpanExporter):
    """Holds its first export until released, as a collector that stopped reading."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()

    def export(self, spans):
        self.entered.set()
        self.release.wait(10)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass  # nothing to close: the test's exporter holds no connection


def test_spans_past_the_backlog_are_dropped_and_counted(monkeypatch):
    monkeypatch.setattr(export, "MAX_SPAN_BACKLOG", 2)
    monkeypatch.setattr(export, "BATCH_SPANS", 1)
    held = HeldExporter()
    spans = export.SpanExport(OtelSettings("http://127.0.0.1:1/v1/traces"), exporter=held)
    spans.put("s0")
    assert held.entered.wait(10)  # the export thread is inside export() with s0
    for name in ("s1", "s2", "s3"):  # two fit the backlog, the third does not
        spans.put(name)
    held.release.set()
    spans.stop()
    assert spans.counts == {"exported": 3, "queue_full": 1, "export_failed": 0}
