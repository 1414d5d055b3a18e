"""The step cost's standing on /metrics, wherever there is a step law: the scheduler's
correction of the law, and the drift, NaN without evidence (an idle server's drift is
unknown, not 1)."""

from __future__ import annotations

import dataclasses
import math

from prometheus_client.parser import text_string_to_metric_families

from control.metrics.observer import idle_gauges
from control.metrics.registry import ServingMetrics
from engine.calibration.drift import StepCostDrift
from engine.config import LiveConfig

NAMES = ("batchpilot_step_cost_drift_ratio", "batchpilot_step_law_scale")


def scrape(step_cost: StepCostDrift | None) -> dict[str, float]:
    metrics = ServingMetrics("m")
    metrics.set_gauges(dataclasses.replace(idle_gauges(LiveConfig(), 64), step_cost=step_cost))
    return {s.name: s.value for f in text_string_to_metric_families(metrics.render()[0].decode())
            for s in f.samples if s.name in NAMES}


def test_drift_and_the_laws_scale_are_gauges():
    assert scrape(StepCostDrift(drift=2.25, window_steps=40, law_scale=2.4)) == {
        "batchpilot_step_cost_drift_ratio": 2.25, "batchpilot_step_law_scale": 2.4}


def test_no_evidence_is_a_nan_drift_and_no_law_no_series():
    got = scrape(StepCostDrift(None, 3, 1.0))
    assert got["batchpilot_step_law_scale"] == 1.0
    assert math.isnan(got["batchpilot_step_cost_drift_ratio"])
    assert scrape(None) == {}


def test_the_laws_online_refits_are_a_counter_by_outcome():
    metrics = ServingMetrics("m")
    cost = StepCostDrift(drift=1.0, window_steps=40, law_scale=1.0, law_refits=5,
                         law_adopted=2)
    metrics.set_gauges(dataclasses.replace(idle_gauges(LiveConfig(), 64), step_cost=cost))
    got = {(s.name, s.labels.get("adopted")): s.value
           for f in text_string_to_metric_families(metrics.render()[0].decode())
           for s in f.samples if s.name == "batchpilot_step_law_refits_total"}
    assert got == {("batchpilot_step_law_refits_total", "true"): 2.0,
                   ("batchpilot_step_law_refits_total", "false"): 3.0}
