"""A server's OpenTelemetry spans, built off the engine thread and the event loop.

    engine thread (per step, O(1))      "otel-spans" thread               "otel-export"
    ------------------------------      -------------------               -------------
    Observer.on_step -> submit(item) -> phases from the steps; each    -> SpanExport
                        (bounded: a     finished request: sample, build    (export.py)
                        full queue       its spans
                        drops, counted)

Which requests are exported: control/otel/settings.py `keep`. Nothing here raises into its
callers: an unreachable collector costs the server a counter
(batchpilot_otel_spans_dropped_total{reason="export_failed"}) and nothing more.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator

from opentelemetry.sdk.trace.export import SpanExporter

from control.metrics.registry import counter_family
from control.otel.export import SpanExport, resource_of
from control.otel.phases import PhaseTracker
from control.otel.settings import OtelSettings, keep
from control.otel.spans import SpanBuilder
from control.serve.bursts import drain
from control.trace.writer import StepItem

log = logging.getLogger("batchpilot.otel")
MAX_STEP_BACKLOG = 50_000  # steps the span thread may fall behind before dropping
PURGE_EVERY_S = 60.0  # forget requests whose finish never came (control/otel/phases.py)


class OtelFeed:
    """Fed StepItems by the Observer (engine thread); exports the kept requests' spans."""

    def __init__(self, settings: OtelSettings, exporter: SpanExporter | None = None):
        self.settings = settings.validate()
        self.builder = SpanBuilder(resource_of(settings), settings.replica)
        self.export = SpanExport(settings, exporter)
        self.tracker = PhaseTracker()
        self.requests = {"kept": 0, "not_sampled": 0}
        self.steps_dropped = 0
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {**self.export.counts, **self.requests, "steps_dropped": self.steps_dropped}

    # ---- the engine thread -----------------------------------------------------------------
    def submit(self, item: StepItem) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="otel-spans", daemon=True)
            self._thread.start()
        if self._steps.qsize() >= MAX_STEP_BACKLOG:
            self.steps_dropped += 1
            return
        self._steps.put(item)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Build the spans of what is queued, export them (at most timeout_s), stop."""
        if self._thread is not None:
            self._steps.put(None)
            self._thread.join(timeout_s)
            self._thread = None
        self.export.stop(timeout_s)

    def families(self, model: str) -> Iterator[object]:
        yield from self.export.families(model)
        yield counter_family("batchpilot_otel_requests_total", "Ended requests by sampling"
                             " decision.", ["model", "decision"],
                             {(model, k): v for k, v in self.requests.items()})
        yield counter_family("batchpilot_otel_steps_dropped_total", "Steps the span thread"
                             " could not keep up with (their requests' phases are"
                             " incomplete).", ["model"], {(model,): self.steps_dropped})

    # ---- the span thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        next_purge = time.monotonic() + PURGE_EVERY_S
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
                next_purge = time.monotonic() + PURGE_EVERY_S

    def _on_item(self, item: StepItem) -> None:
        for decision in item.admissions:
            self.tracker.on_admission(decision)
        if item.record is not None:
            self.tracker.on_step(item.record)
        for rec in item.finished:
            phases = self.tracker.on_finished(rec)
            if not keep(rec, self.settings):
                self.requests["not_sampled"] += rec.trace is not None
                continue
            self.requests["kept"] += 1
            for span in self.builder.build(rec, phases):
                self.export.put(span)
