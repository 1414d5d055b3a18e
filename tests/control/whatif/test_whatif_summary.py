"""The what-if's summary of requests (recorded or predicted), on rows worked out by hand:
goodput counts finished requests that meet every target given, its share is of the
finished ones, and queue delay is over every request that was scheduled, not only the
finished."""

from __future__ import annotations

import pytest

from control.loadtest.records import SLO
from control.whatif.summary import Row, summarize


def row(outcome: str, *, ttft=None, tpot=None, e2e=None, queue=None, lane="default") -> Row:
    return Row(lane, "acme", outcome, ttft, tpot, e2e, queue, ())


# over 10 s, under TTFT <= 0.5, TPOT <= 0.05, E2E <= 2:
ROWS = [
    row("finished", ttft=0.2, tpot=0.01, e2e=1.0, queue=0.1),  # meets every target
    row("finished", ttft=0.2, tpot=0.01, e2e=5.0, queue=0.2),  # E2E over its target
    row("rejected"),  # never scheduled
    row("cancelled", ttft=0.3, queue=4.0),  # waited 4 s in the queue, then its client left
]


TARGETS = SLO(0.5, 0.05, 2.0)


def summary(slo: SLO | None = TARGETS) -> dict:
    return summarize(ROWS, 10.0, slo, kv_total_blocks=100, kv_peak_blocks=40, preempted=0)


def test_goodput_counts_finished_requests_meeting_every_target_e2e_included():
    s = summary()
    assert (s["requests"], s["finished"], s["rejected"], s["cancelled"]) == (4, 2, 1, 1)
    assert s["goodput_rps"] == pytest.approx(0.1)  # one good request in 10 s
    assert s["slo_met_share"] == pytest.approx(0.5)  # of the two finished, not of all four
    assert summary(None)["goodput_rps"] is None  # no target: not reported


def test_queue_delay_is_over_every_scheduled_request_not_only_the_finished():
    queue = summary()["queue"]
    assert queue["count"] == 3  # the cancelled one waited too; the rejected one never did
    assert queue["mean"] == pytest.approx((0.1 + 0.2 + 4.0) / 3)
    assert queue["p99"] > 3.5
    assert summary()["ttft"]["count"] == 2  # TTFT, TPOT, E2E: the finished ones
