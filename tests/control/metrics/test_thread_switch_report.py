"""A change of a CPU engine's step threads (engine/calibration/thread_governor.py) as the
operator meets it: a warning in the log naming why, an audit row in the trace (not a config
version), and the gauges batchpilot_step_threads / batchpilot_step_thread_switches_total."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest

from control.metrics.core import step_cost_families
from control.metrics.observer import Observer
from control.trace.audit_sources import THREADS_SOURCE, is_config_version
from engine.calibration.drift import StepCostDrift
from engine.calibration.thread_governor import ThreadSwitch
from engine.config import LiveConfig
from engine.records import StepOutput
from tests.control.metrics.test_observer_feed import Writer

SWITCH = ThreadSwitch(threads=1, replaced=2, before=4.2, after=1.4)


class AuditWriter(Writer):
    def __init__(self):
        super().__init__()
        self.rows: list[tuple] = []

    def submit_config_change(self, *row) -> None:
        self.rows.append(row)


def test_a_switch_is_logged_and_audited_and_never_a_config_version(caplog):
    engine = SimpleNamespace(live_config=LiveConfig(), requests={})
    writer = AuditWriter()
    record = SimpleNamespace(step_id=7, kv_usage=0.1, end_time=12.5, law_refit=None,
                             thread_switch=SWITCH)
    with caplog.at_level(logging.WARNING, logger="batchpilot.observer"):
        Observer(writer=writer, kv_snapshot_every=1000).on_step(engine, StepOutput(record))
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("steps on 1 thread(s) instead of 2: they cost 1.40x their"
                              " start against 4.20x (another process is on the cores)")
    assert "after step 7" in message
    [(at, _, source, who, change, _)] = writer.rows
    assert (at, source, who, change) == (12.5, THREADS_SOURCE, "engine", {"threads": [2, 1]})
    assert not is_config_version(source)


def test_the_threads_in_force_are_a_gauge_only_where_they_are_governed():
    def exposition(cost: StepCostDrift) -> str:
        class Families:
            def collect(self):
                return step_cost_families(cost, "m")

        registry = CollectorRegistry()
        registry.register(Families())
        return generate_latest(registry).decode()

    governed = exposition(StepCostDrift(1.1, 20, 1.0, threads=1, thread_switches=3))
    assert 'batchpilot_step_threads{model="m"} 1.0' in governed
    assert 'batchpilot_step_thread_switches_total{model="m"} 3.0' in governed
    assert "batchpilot_step_threads" not in exposition(StepCostDrift(1.1, 20, 1.0))
