"""What the Observer (control/metrics/observer.py) hands on after each step: gauges to the
metrics thread, while the engine is busy at most every GAUGES_EVERY_S but always once it
is idle (so /metrics never keeps showing a request running after the last one ended); and
a KV snapshot to the trace at every crossing of a watermark, a jump over both included."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from control.metrics import observer as observer_module
from control.metrics.observer import Observer, idle_gauges
from control.metrics.registry import ServingMetrics
from engine.config import LiveConfig
from engine.records import StepOutput


def engine_with(running: int) -> SimpleNamespace:
    """What the Observer reads of an engine with `running` requests in one lane."""
    live = LiveConfig()
    gauges = dataclasses.replace(idle_gauges(live, 64), running_by_lane={
        name: running if name == live.lane_names[0] else 0 for name in live.lane_names})
    return SimpleNamespace(requests={f"r{i}": None for i in range(running)},
                           gauges=lambda: gauges, live_config=live)


def running(metrics: ServingMetrics) -> int:
    return sum(metrics.gauges.running_by_lane.values())


def test_an_idle_engine_refreshes_the_gauges_whatever_the_interval(monkeypatch):
    monkeypatch.setattr(observer_module, "GAUGES_EVERY_S", 3600.0)  # no refresh by time
    metrics = ServingMetrics("m")
    observer = Observer(metrics)
    try:
        observer.on_step(engine_with(2), StepOutput(None))  # the first: refreshed
        assert observer.sync() and running(metrics) == 2
        observer.on_step(engine_with(1), StepOutput(None))  # busy, within the interval
        assert observer.sync() and running(metrics) == 2
        observer.on_step(engine_with(0), StepOutput(None))  # the last one ended: idle
        assert observer.sync() and running(metrics) == 0
    finally:
        observer.stop()


class Writer:
    """What the Observer needs of a TraceWriter: the step items it is handed."""

    run_id = "run"

    def __init__(self):
        self.items: list = []

    def submit(self, item) -> None:
        self.items.append(item)


def test_every_watermark_crossing_takes_a_kv_snapshot_even_a_jump_over_both():
    live = LiveConfig()  # high 0.88, reject 0.95
    snapshot = SimpleNamespace(total=64, used=0, free=64, cached=0, usage=0.0, by_lane={},
                               by_tenant={})
    engine = SimpleNamespace(live_config=live, kv_snapshot=lambda: snapshot, requests={})
    writer = Writer()
    observer = Observer(writer=writer, kv_snapshot_every=1000)  # no periodic one here
    usages = (0.5, 0.97, 0.5, 0.9, 0.97, 0.9, 0.5, 0.6)
    for step_id, usage in enumerate(usages, start=1):
        record = SimpleNamespace(step_id=step_id, kv_usage=usage, end_time=float(step_id),
                                 law_refit=None, thread_switch=None)
        observer.on_step(engine, StepOutput(record))
    assert observer.errors == 0
    triggers = {item.record.step_id: item.kv_row[3] for item in writer.items
                if item.kv_row is not None}
    assert triggers == {2: "above_reject_watermark", 3: "below_high_watermark",
                        4: "above_high_watermark", 5: "above_reject_watermark",
                        6: "below_reject_watermark", 7: "below_high_watermark"}
