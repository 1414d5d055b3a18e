"""The what-if report (control/whatif/report.py) where the CLI tests do not look: the units of
the step-time law's line, which fit error is the held-out one, the warnings, the per-lane
tables, and what the two plots draw. Over one prediction of a small simulated trace (40
requests), edited per test where a case needs exact numbers."""

from __future__ import annotations

import copy
import math

import pytest
from matplotlib.figure import Figure
from whatif_sim_trace import read_trace_window, record

from control.loadtest.records import SLO
from control.whatif.configs import base_config
from control.whatif.report import GROUP_METRICS, plot_capacity, plot_latencies, text_report
from control.whatif.run import predict
from engine.config import LiveConfig


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    path = str(tmp_path_factory.mktemp("whatif-report") / "trace.duckdb")
    record(path, LiveConfig(max_num_seqs=8, max_num_batched_tokens=256,
                            prefill_chunk_size=128), n=40, cancel_every=9)
    window = read_trace_window(path)
    base, notes = base_config(window, None)
    return predict(window, base, {"proposed": {"max_num_seqs": 2}}, slo=SLO(ttft_s=0.1),
                   notes=notes)


@pytest.fixture
def edited(result) -> dict:
    return copy.deepcopy(result)


def test_the_step_law_and_its_gap_print_in_milliseconds(edited):
    edited["calibration"]["coef_s"] = {"fixed": 0.004, "prefill_tokens": 0.0001}
    edited["calibration"]["gap_s"] = 0.002
    text = text_report(edited)
    assert "fixed 4 ms, prefill_tokens 0.1 ms; gap 2 ms\n" in text


def test_the_held_out_error_is_the_held_out_steps(edited):
    cal = edited["calibration"]
    cal["in_sample"].update(median_abs_pct=1.5, p90_abs_pct=3.0)
    cal["held_out"].update(steps=57, median_abs_pct=7.25, p90_abs_pct=20.0)
    text = text_report(edited)
    assert "median |err| 1.5%, p90 3%" in text
    assert "held out (57 steps): median 7.25%, p90 20%" in text


def test_every_warning_is_printed(result):
    assert result["warnings"]  # the fixture's self-prediction misses by some percent
    text = text_report(result)
    for warning in result["warnings"]:
        assert f"\nWARNING: {warning}\n" in text


def test_a_lane_only_some_columns_have_is_left_out(edited):
    """A proposal that removes a lane: the lane has no row to compare, so no table."""
    for column in ("recorded", "predicted"):
        lanes = edited["summaries"][column]["by_lane"]
        lanes["batch"] = copy.deepcopy(lanes["interactive"])
    text = text_report(edited)
    assert "\nlane interactive\n" in text and "\nlane batch\n" not in text


def test_each_lane_and_tenant_table_shows_the_group_metrics(result):
    text = text_report(result)
    for group in ("\nlane interactive\n", "\ntenant rag\n"):
        block = text.split(group, 1)[1].split("\n\n", 1)[0].splitlines()
        assert block[0].split()[0] == "metric"
        metrics = [line.split()[0] for line in block[2:]]
        assert metrics and set(metrics) == set(GROUP_METRICS), (group, metrics)


@pytest.fixture
def figures(monkeypatch) -> list[Figure]:
    """The figures the plots save, kept instead of written."""
    saved: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: saved.append(fig))
    return saved


def test_the_capacity_plot_draws_goodput_and_ttft_p99_against_rate(figures, tmp_path):
    rows = [{"rate_scale": r, "offered_rps": 4 * r, "goodput_rps": 3 * r,
             "ttft_p99_s": 0.1 * r, "e2e_p99_s": 5.0 * r} for r in (1.0, 2.0)]
    plot_capacity({"configs": {"as-is": rows}}, tmp_path / "capacity.png")
    good, ttft = figures[0].axes
    lines = {line.get_label(): list(line.get_ydata()) for line in good.get_lines()}
    assert lines == {"as-is": [3.0, 6.0], "offered": [4.0, 8.0]}
    [line] = ttft.get_lines()
    assert list(line.get_xdata()) == [1.0, 2.0]
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.2])


def test_the_latency_plot_has_each_columns_own_percentiles(result, figures, tmp_path):
    plot_latencies(result, tmp_path / "latencies.png")
    panels = {ax.get_title(): ax for ax in figures[0].axes}
    for name in ("ttft", "e2e"):
        bars = {c.get_label(): [p.get_height() for p in c] for c in
                panels[f"{name.upper()} (s)"].containers}
        assert list(bars) == result["columns"]
        for column, heights in bars.items():
            dist = result["summaries"][column][name]
            assert heights == pytest.approx([dist[s] for s in ("p50", "p95", "p99")])
            assert not any(math.isnan(h) for h in heights)
        assert bars["proposed"] != bars["recorded"]  # two seqs, not eight: not the same run
