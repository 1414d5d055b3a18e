"""The simulations' latency summary (engine/sim/stats.py): percentiles interpolate linearly
between ranks, a table groups finished records by lane, and its text is in milliseconds."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from engine.sim.stats import format_latency_table, latency_table, percentile


def test_percentiles_interpolate_between_the_ranks():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # between the 2nd and 3rd
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([10.0, 20.0], 95) == pytest.approx(19.5)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def record(lane: str, ttft_s: float, queue_s: float) -> SimpleNamespace:
    return SimpleNamespace(lane=lane, queue_delay_s=queue_s, ttft_s=ttft_s, tpot_s=None,
                           e2e_s=4 * ttft_s)


def test_the_table_is_by_lane_and_its_text_in_milliseconds():
    table = latency_table([record("chat", 0.2, 0.001), record("chat", 0.3, 0.003),
                           record("batch", 2.0, 1.5)])
    assert list(table) == ["batch", "chat"]
    assert table["chat"]["n"] == 2 and table["chat"]["ttft_s_p50"] == pytest.approx(0.25)
    assert math.isnan(table["chat"]["tpot_s_p50"])  # no TPOT recorded
    text = format_latency_table(table)
    chat = next(line for line in text.splitlines() if line.startswith("chat"))
    # queue 2.0 / 2.9 / 3.0 ms, TTFT 250 / 295 / 299 ms, no TPOT, E2E 1000 / 1180 / 1196 ms
    assert chat.split() == ["chat", "2", "2.0", "/", "2.9", "/", "3.0", "250", "/", "295",
                            "/", "299", "-", "/", "-", "/", "-", "1000", "/", "1180", "/",
                            "1196"]
