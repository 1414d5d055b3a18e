"""The Observer (control/metrics/observer.py) where test_observer_feed.py does not look: a
watermark crossing on a periodic step keeps its name, the metrics thread's backlog drops
and counts, the span feed gets every step and stops with the observer, a law refit is an
audit row of old then new, and the trace writer's counters keep written and dropped apart."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from control.metrics import observer as observer_module
from control.metrics.observer import MetricsFeed, Observer, idle_gauges, writer_families
from control.metrics.registry import ServingMetrics
from control.trace.audit_sources import LAW_REFIT_SOURCE
from engine.config import LiveConfig
from engine.records import StepOutput

LIVE = LiveConfig()  # high watermark 0.88, reject 0.95


class Writer:
    """What the Observer needs of a TraceWriter: the items and audit rows it is handed."""

    run_id = "run"

    def __init__(self):
        self.items: list = []
        self.changes: list[tuple] = []

    def submit(self, item) -> None:
        self.items.append(item)

    def submit_config_change(self, *row) -> None:
        self.changes.append(row)


def engine() -> SimpleNamespace:
    """What the Observer reads of an idle engine."""
    snapshot = SimpleNamespace(total=64, used=0, free=64, cached=0, usage=0.0, by_lane={},
                               by_tenant={})
    return SimpleNamespace(live_config=LIVE, kv_snapshot=lambda: snapshot, requests={},
                           gauges=lambda: idle_gauges(LIVE, 64))


def step(step_id: int, usage: float = 0.1, law_refit=None) -> SimpleNamespace:
    return SimpleNamespace(step_id=step_id, kv_usage=usage, end_time=float(step_id),
                           law_refit=law_refit, thread_switch=None)


def test_a_crossing_on_a_periodic_step_is_named_as_the_crossing():
    """`trace report` finds a watermark crossing by its trigger: one that falls on a
    periodic step must not be filed as periodic."""
    writer = Writer()
    observer = Observer(writer=writer, kv_snapshot_every=2)
    for step_id, usage in enumerate((0.5, 0.97, 0.97, 0.97, 0.97), start=1):
        observer.on_step(engine(), StepOutput(step(step_id, usage)))
    assert observer.errors == 0
    triggers = {item.record.step_id: item.kv_row[3] for item in writer.items
                if item.kv_row is not None}
    assert triggers == {2: "above_reject_watermark", 4: "periodic"}


def test_a_full_metrics_backlog_drops_and_counts_the_step(monkeypatch):
    monkeypatch.setattr(observer_module, "MAX_BACKLOG", 2)
    gate = threading.Event()  # the metrics thread is held: nothing leaves its queue
    monkeypatch.setattr(MetricsFeed, "_run", lambda self: gate.wait(10))
    observer = Observer(ServingMetrics("m"))
    try:
        for step_id in range(1, 4):
            observer.on_step(engine(), StepOutput(step(step_id)))
        assert observer.errors == 0 and observer.feed.dropped == 1
    finally:
        gate.set()
        observer.stop()


class Spans:
    """What the Observer needs of the OpenTelemetry feed."""

    def __init__(self):
        self.items: list = []
        self.stopped = False

    def submit(self, item) -> None:
        self.items.append(item)

    def stop(self) -> None:
        self.stopped = True

    def families(self, model: str):
        return iter(())


def test_the_span_feed_gets_every_step_and_stops_with_the_observer():
    spans = Spans()
    observer = Observer(spans=spans)
    for step_id in (1, 2):
        observer.on_step(engine(), StepOutput(step(step_id)))
    assert observer.errors == 0
    assert [item.record.step_id for item in spans.items] == [1, 2]
    observer.stop()
    assert spans.stopped  # its last spans are flushed at a shutdown


def test_a_law_refit_is_an_audit_row_of_the_old_law_then_the_new():
    """The what-if reads the law in force after a refit as the row's second value
    (control/whatif/window.py _law_in_force)."""
    writer = Writer()
    old, new = {"fixed_s": 0.004}, {"fixed_s": 0.006}
    observer = Observer(writer=writer)
    observer.on_step(engine(), StepOutput(step(7, law_refit=(old, new))))
    assert observer.errors == 0
    [(time, version, source, actor, change, note)] = writer.changes
    assert (time, version, source, actor) == (7.0, LIVE.version, LAW_REFIT_SOURCE, "scheduler")
    assert change == {"step_law": [old, new]} and "at step 7" in note


def test_the_writer_counters_keep_written_and_dropped_rows_apart():
    stats = SimpleNamespace(written={"steps": 5, "requests": 2}, dropped={"steps": 1},
                            errors=1, deleted=4, queue_depth=3)
    writer = SimpleNamespace(stats=lambda: stats)
    values = {(s.name, s.labels.get("table")): s.value
              for f in writer_families(writer, "m") for s in f.samples
              if not s.name.endswith("_created")}
    assert values[("batchpilot_trace_records_written_total", "steps")] == 5
    assert values[("batchpilot_trace_records_written_total", "requests")] == 2
    assert values[("batchpilot_trace_records_dropped_total", "steps")] == 1
    assert values[("batchpilot_trace_records_dropped_total", "requests")] == 0
    assert values[("batchpilot_trace_write_errors_total", None)] == 1
    assert values[("batchpilot_trace_rows_deleted_total", None)] == 4
    assert values[("batchpilot_trace_queue_depth", None)] == 3
