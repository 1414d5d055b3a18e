"""What the engine thread does after each step for metrics and the trace: update the
metrics, publish the gauges, hand the records to the trace writer, and take a KV snapshot
every `kv_snapshot_every` steps and whenever usage crosses a watermark.

Cheap (a few microseconds a step; the trace writer's queue never blocks) and it never
raises: a failure is logged once and counted in batchpilot_observer_errors_total.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from control.metrics import ServingMetrics, counter_family
from control.trace.rows import kv_row
from control.trace.writer import StepItem, TraceWriter
from engine.config import LiveConfig
from engine.engine import Engine, StepOutput

log = logging.getLogger("batchpilot.observer")


def watermark_band(usage: float, live: LiveConfig) -> int:
    """0: below the high watermark, 1: between high and reject, 2: above reject."""
    return (usage > live.kv_cache_high_watermark) + (usage > live.kv_cache_reject_watermark)


BAND_TRIGGERS = {(0, 1): "above_high_watermark", (1, 0): "below_high_watermark",
                 (1, 2): "above_reject_watermark", (2, 1): "below_reject_watermark",
                 (0, 2): "above_reject_watermark", (2, 0): "below_high_watermark"}


class Observer:
    def __init__(self, metrics: ServingMetrics | None = None,
                 writer: TraceWriter | None = None, kv_snapshot_every: int = 50):
        if kv_snapshot_every < 1:
            raise ValueError(f"kv_snapshot_every={kv_snapshot_every!r} must be >= 1")
        self.metrics = metrics
        self.writer = writer
        self.kv_snapshot_every = kv_snapshot_every
        self._band = 0
        self._failed = False
        if metrics is not None and writer is not None:
            metrics.add_source(lambda: writer_families(writer, metrics.model))

    def on_step(self, engine: Engine, out: StepOutput) -> None:
        try:
            self._on_step(engine, out)
        except Exception:
            self._error("recording a step")

    def on_change(self, engine: Engine) -> None:
        """After a command (abort, config change) between steps: refresh the gauges."""
        try:
            if self.metrics is not None:
                self.metrics.set_gauges(engine.gauges())
        except Exception:
            self._error("refreshing the gauges")

    def _on_step(self, engine: Engine, out: StepOutput) -> None:
        metrics, record = self.metrics, out.record
        if metrics is not None:
            if record is not None:
                metrics.observe_step(record)
            for decision in out.admissions:
                metrics.observe_admission(decision)
            for rec in out.finished:
                metrics.observe_request(rec)
            metrics.set_gauges(engine.gauges())
        if self.writer is None:
            return
        kv = None
        if record is not None:
            live = engine.live_config
            band = watermark_band(record.kv_usage, live)
            trigger = BAND_TRIGGERS.get((self._band, band))
            self._band = band
            if trigger is None and record.step_id % self.kv_snapshot_every == 0:
                trigger = "periodic"
            if trigger is not None:
                kv = kv_row(self.writer.run_id, record.step_id, record.end_time, trigger,
                            engine.kv_snapshot(), live)
        self.writer.submit(StepItem(record, out.finished, out.admissions, kv))

    def _error(self, what: str) -> None:
        if not self._failed:  # once: a broken observer must not flood the log every step
            log.exception("observer failed while %s; the engine goes on", what)
            self._failed = True
        if self.metrics is not None:
            self.metrics.observer_errors.labels(self.metrics.model).inc()


def writer_families(writer: TraceWriter, model: str) -> Iterator[object]:
    stats = writer.stats()
    yield _per_table("batchpilot_trace_records_written_total",
                     "Trace rows committed to DuckDB, by table.", model, stats.written)
    yield _per_table("batchpilot_trace_records_dropped_total", "Trace rows lost (queue full"
                     " or a failed write), by table.", model, stats.dropped)
    yield counter_family("batchpilot_trace_write_errors_total", "Failed trace writes.",
                         ["model"], {(model,): stats.errors})
    yield counter_family("batchpilot_trace_rows_deleted_total", "Trace rows removed by"
                         " retention.", ["model"], {(model,): stats.deleted})
    depth = GaugeMetricFamily("batchpilot_trace_queue_depth", "Steps waiting to be"
                              " written.", labels=["model"])
    depth.add_metric([model], stats.queue_depth)
    yield depth


def _per_table(name: str, doc: str, model: str, values: dict[str, int],
               ) -> CounterMetricFamily:
    from control.trace.schema import TABLES

    return counter_family(name, doc, ["model", "table"],
                          {(model, t): values.get(t, 0) for t in TABLES})
