"""The load-test report as a reader sees it (control/loadtest/report.py), over the recorded
run of 8 requests (fixtures/loadtest_results.json; test_loadtest_metrics.py works out its
numbers): configs that did not all run the same lanes, and the configs section's counts."""

from __future__ import annotations

import pytest
from fixtures.loadtest import load_recorded

from control.loadtest.metrics import summarize
from control.loadtest.report import markdown_report


@pytest.fixture(scope="module")
def recorded():
    return load_recorded()


def test_a_lane_one_config_never_ran_is_a_row_for_the_other_alone(recorded):
    """A config compared with one that sent no batch requests: the by-lane table lists
    batch for the first only (it once needed every lane in every config)."""
    results, duration_s, slo = recorded
    baseline = summarize(results, duration_s, slo, label="baseline")
    no_batch = summarize([r for r in results if r.planned.lane != "batch"], duration_s, slo,
                         label="no-batch")
    md = markdown_report("mixed-lanes", "", [baseline, no_batch], [])
    assert "| batch | baseline | 2 | 1 |" in md
    assert "| batch | no-batch |" not in md
    assert "| interactive | no-batch | 4 | 3 |" in md


def test_the_configs_section_counts_every_request_sent(recorded):
    results, duration_s, slo = recorded
    md = markdown_report("t", "", [summarize(results, duration_s, slo, label="baseline")], [])
    assert "- baseline: 8 requests over 4 s" in md  # 5 of them ok
