"""What the engine thread does after each step for metrics and the trace, and the
metrics' own thread.

    engine thread (per step, a few µs)       "metrics" thread         "trace-writer" thread
    ----------------------------------       ----------------         ---------------------
    KV snapshot when due, gauges at most     histograms, counters,    rows -> DuckDB
    every 50 ms -> StepItem -> both queues   gauges (lossless)        (bounded: drops)

Everything else runs off the engine thread: on a GPU server that work overlaps the host's
wait for the GPU instead of lengthening the step. KV snapshots are taken every
`kv_snapshot_every` steps and whenever usage crosses a watermark. Nothing here raises into
the engine: a failure is logged once and counted in batchpilot_observer_errors_total.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from control.metrics.registry import ServingMetrics, counter_family
from control.serve.bursts import drain
from control.trace.audit_sources import LAW_REFIT_SOURCE, THREADS_SOURCE
from control.trace.rows import kv_row
from control.trace.writer import StepItem, TraceWriter
from engine.config import LiveConfig, StaticConfig
from engine.engine import Engine
from engine.records import EngineGauges, StepOutput, StepRecord

log = logging.getLogger("batchpilot.observer")
GAUGES_EVERY_S = 0.05  # gauges refresh at most this often while busy (scrapes: seconds)
APPLY_EVERY_S = 0.1  # the metrics thread applies queued steps this often (a scrape syncs)
MAX_BACKLOG = 100_000  # steps the metrics thread may fall behind before it drops


class SpanFeed(Protocol):
    """What the observer needs of the OpenTelemetry feed (control/otel/feed.py, which
    imports the SDK: loaded only by a server that exports)."""

    def submit(self, item: StepItem) -> None: ...
    def stop(self) -> None: ...
    def families(self, model: str) -> Iterator[object]: ...


def watermark_band(usage: float, live: LiveConfig) -> int:
    """0: below the high watermark, 1: between high and reject, 2: above reject."""
    return (usage > live.kv_cache_high_watermark) + (usage > live.kv_cache_reject_watermark)


BAND_TRIGGERS = {(0, 1): "above_high_watermark", (1, 0): "below_high_watermark",
                 (1, 2): "above_reject_watermark", (2, 1): "below_reject_watermark",
                 (0, 2): "above_reject_watermark", (2, 0): "below_high_watermark"}


class MetricsFeed:
    """Applies StepItems to the metrics on a thread of its own (started on first use)."""

    def __init__(self, metrics: ServingMetrics):
        self.metrics = metrics
        self.dropped = 0  # items not applied because the backlog was full (engine thread)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed = False
        self._wake = threading.Event()

    def submit(self, item: StepItem | None, gauges: EngineGauges | None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
            self._thread.start()
        if self._queue.qsize() >= MAX_BACKLOG:
            self.dropped += 1
            return
        self._queue.put((item, gauges))

    def sync(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything submitted so far is applied."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.put((None, done))
        self._wake.set()
        return done.wait(timeout_s)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put((None, None))
            self._wake.set()
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        """Every APPLY_EVERY_S (or when synced), apply everything queued: bursts, not one
        GIL hand-over per step."""
        while True:
            self._wake.wait(APPLY_EVERY_S)
            self._wake.clear()
            for item, extra in drain(self._queue):
                if item is None and extra is None:
                    return
                if isinstance(extra, threading.Event):
                    extra.set()
                else:
                    self._apply(item, extra)

    def _apply(self, item: StepItem | None, gauges: EngineGauges | None) -> None:
        m = self.metrics
        try:
            # gauges first: their live config (in force during the step: it changes only
            # between steps) says which lanes the item's records may be labelled with
            if gauges is not None:
                m.set_gauges(gauges)
            if item is not None:
                if item.record is not None:
                    m.observe_step(item.record)
                for decision in item.admissions:
                    m.observe_admission(decision)
                for rec in item.finished:
                    m.observe_request(rec)
        except Exception:
            if not self._failed:
                log.exception("updating the metrics failed; serving goes on")
                self._failed = True
            m.observer_errors.labels(m.model).inc()


class Observer:
    def __init__(self, metrics: ServingMetrics | None = None,
                 writer: TraceWriter | None = None, kv_snapshot_every: int = 50,
                 spans: SpanFeed | None = None):
        if kv_snapshot_every < 1:
            raise ValueError(f"kv_snapshot_every={kv_snapshot_every!r} must be >= 1")
        self.metrics = metrics
        self.feed = MetricsFeed(metrics) if metrics is not None else None
        self.writer = writer
        self.spans = spans  # OpenTelemetry (control/otel/feed.py); None: no export
        self.kv_snapshot_every = kv_snapshot_every
        self.errors = 0  # failures on the engine thread (each logged once)
        self._band = 0
        self._next_gauges = 0.0  # monotonic time of the next gauge refresh
        if metrics is not None:
            metrics.add_source(self._own_families)
            if writer is not None:
                metrics.add_source(lambda: writer_families(writer, metrics.model))
            if spans is not None:
                metrics.add_source(lambda: spans.families(metrics.model))

    def prime(self, live: LiveConfig, static: StaticConfig) -> None:
        """Gauges of an idle engine under this config, for an engine loaded before this
        observer was attached (its next step or command refreshes them). Call it before
        attaching: afterwards only the engine thread feeds the metrics."""
        if self.metrics is not None:
            self.metrics.set_gauges(idle_gauges(live, static.num_kv_blocks))

    def on_step(self, engine: Engine, out: StepOutput) -> None:
        try:
            self._on_step(engine, out)
        except Exception:
            self._error("recording a step")

    def on_change(self, engine: Engine) -> None:
        """After a command (abort, config change) between steps: refresh the gauges."""
        try:
            if self.feed is not None:
                self.feed.submit(None, engine.gauges())
        except Exception:
            self._error("refreshing the gauges")

    def sync(self, timeout_s: float = 5.0) -> bool:
        """Wait until the metrics reflect every step so far (tests, /metrics)."""
        return self.feed is None or self.feed.sync(timeout_s)

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        if self.spans is not None:
            self.spans.stop()

    def _on_step(self, engine: Engine, out: StepOutput) -> None:
        record = out.record
        kv = None
        if record is not None and self.writer is not None:
            live = engine.live_config
            band = watermark_band(record.kv_usage, live)
            trigger = BAND_TRIGGERS.get((self._band, band))
            self._band = band
            if trigger is None and record.step_id % self.kv_snapshot_every == 0:
                trigger = "periodic"
            if trigger is not None:
                kv = kv_row(self.writer.run_id, record.step_id, record.end_time, trigger,
                            engine.kv_snapshot(), live)
        item = StepItem(record, out.finished, out.admissions, kv)
        if self.feed is not None:
            gauges = None
            now = time.monotonic()
            if now >= self._next_gauges or not engine.requests:  # and always when idle
                gauges = engine.gauges()
                self._next_gauges = now + GAUGES_EVERY_S
            self.feed.submit(item, gauges)
        if self.writer is not None:
            self.writer.submit(item)
            if record is not None and record.law_refit is not None:
                self._law_refit_row(engine, record)
        if record is not None and record.thread_switch is not None:
            self._thread_switch(engine, record)
        if self.spans is not None:
            self.spans.submit(item)

    def _law_refit_row(self, engine: Engine, record: StepRecord) -> None:
        """The step law refitted from served steps, as an audit row (not a config
        version): the what-if replays a later window under the law then in force."""
        old, new = record.law_refit
        self.writer.submit_config_change(
            record.end_time, engine.live_config.version, LAW_REFIT_SOURCE, "scheduler",
            {"step_law": [old, new]}, f"step law refitted from served steps at step"
            f" {record.step_id} (engine/calibration/online_law.py)")

    def _thread_switch(self, engine: Engine, record: StepRecord) -> None:
        """The steps' threads changed: the log says so, and the trace (an audit row)."""
        switch = record.thread_switch
        log.warning("%s after step %d (engine/calibration/thread_governor.py)",
                    switch.describe(), record.step_id)
        if self.writer is not None:
            self.writer.submit_config_change(
                record.end_time, engine.live_config.version, THREADS_SOURCE, "engine",
                {"threads": [switch.replaced, switch.threads]}, switch.describe())

    def _error(self, what: str) -> None:
        if not self.errors:  # once: a broken observer must not flood the log every step
            log.exception("observer failed while %s; the engine goes on", what)
        self.errors += 1

    def _own_families(self) -> Iterator[object]:
        model = self.metrics.model
        yield counter_family("batchpilot_observer_errors_engine_thread_total",
                             "Failures recording a step on the engine thread (the engine"
                             " went on).", ["model"], {(model,): self.errors})
        yield counter_family("batchpilot_metrics_records_dropped_total",
                             "Steps the metrics thread could not keep up with (their"
                             " records are missing from the metrics).", ["model"],
                             {(model,): self.feed.dropped})


def idle_gauges(live: LiveConfig, num_kv_blocks: int) -> EngineGauges:
    """What Engine.gauges() says of an engine that has run nothing yet."""
    idle = dict.fromkeys(live.lane_names, 0)
    return EngineGauges(time=0.0, running_by_lane=idle, waiting_by_lane=dict(idle),
                        waiting_by_reason={}, kv_blocks_total=num_kv_blocks, kv_blocks_used=0,
                        kv_blocks_free=num_kv_blocks, kv_blocks_cached=0, kv_usage=0.0,
                        live=live)


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
