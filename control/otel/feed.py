"""A server's OpenTelemetry spans, built off the engine thread and the event loop.

    engine thread (per step, O(1))      "otel-spans" thread            child process
    ------------------------------      -------------------            -------------
    Observer.on_step -> submit(item) -> phases from the steps; each -> build the spans,
                        (bounded: a     finished request: sample;      export them (OTLP)
                        full queue      a batch per 100 ms to the      (span_process.py,
                        drops, counted) child                          export.py)

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
from control.otel.export import span_families
from control.otel.phases import PhaseTracker
from control.otel.settings import OtelSettings, keep
from control.otel.span_process import InProcessSpans, SpanProcess
from control.serve.bursts import drain
from control.trace.writer import StepItem

log = logging.getLogger("batchpilot.otel")
MAX_STEP_BACKLOG = 50_000  # steps the span thread may fall behind before dropping
PURGE_EVERY_S = 60.0  # forget requests whose finish never came (control/otel/phases.py)


class OtelFeed:
    """Fed StepItems by the Observer (engine thread); exports the kept requests' spans."""

    def __init__(self, settings: OtelSettings, exporter: SpanExporter | None = None):
        self.settings = settings.validate()
        # building and encoding spans in a child process (span_process.py); an exporter
        # object from the caller cannot cross to it
        self.sink = SpanProcess(settings) if exporter is None else \
            InProcessSpans(settings, exporter)
        self.tracker = PhaseTracker()
        self.requests = {"kept": 0, "not_sampled": 0}
        self.steps_dropped = 0
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {**self.sink.counts, **self.requests, "steps_dropped": self.steps_dropped}

    def delivered(self, trace_id: str) -> bool:
        """Whether the collector took this trace's spans (as last reported): a latency
        exemplar naming it links to a trace the operator's backend has."""
        return trace_id in self.sink.delivered

    def start(self, wait_s: float = 0.0) -> OtelFeed:
        """Start the span thread and the span process now (else at the first step); with
        `wait_s`, until the process is ready (a benchmark's clock must not see it start)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="otel-spans", daemon=True)
            self._thread.start()
        if isinstance(self.sink, SpanProcess):
            self.sink.start(wait_s)
        return self

    # ---- the engine thread -----------------------------------------------------------------
    def submit(self, item: StepItem) -> None:
        if self._thread is None:
            self.start()
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
        self.sink.stop(timeout_s)

    def families(self, model: str) -> Iterator[object]:
        yield from span_families(model, self.sink.counts)
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
            kept: list = []
            for item in drain(self._steps):
                if item is None:
                    self.sink.send(kept)
                    return
                try:
                    kept += self._on_item(item)
                except Exception:  # a bug here must not stop the feed
                    log.exception("building spans failed; the server goes on")
            self.sink.send(kept)  # one pickled batch a wake-up
            if time.monotonic() > next_purge:
                self.tracker.purge(time.time())
                next_purge = time.monotonic() + PURGE_EVERY_S

    def _on_item(self, item: StepItem) -> list:
        """The phases of one step; [(record, phases)] of the requests it ended that are
        kept (sampled, or an error, a timeout, a slow first token)."""
        for decision in item.admissions:
            self.tracker.on_admission(decision)
        if item.record is not None:
            self.tracker.on_step(item.record)
        kept = []
        for rec in item.finished:
            phases = self.tracker.on_finished(rec)
            if not keep(rec, self.settings):
                self.requests["not_sampled"] += rec.trace is not None
                continue
            self.requests["kept"] += 1
            kept.append((rec, phases))
        return kept
