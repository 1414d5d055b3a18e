"""The canary's decision rule (control/fleet/canary.py) as a table: a bad change rolls back,
a good one promotes, too few requests extend the window and then roll back."""

from __future__ import annotations

import pytest

from control.fleet.canary import CanaryRule, decide, side_stats


def window(n: int, ttft: float = 0.05, tpot: float = 0.01, errors: int = 0,
           timeouts: int = 0, cancelled: int = 0, rejected: int = 0,
           good: int | None = None) -> dict:
    return {"outcomes": {"finished": n, "error": errors, "timeout": timeouts,
                         "cancelled": cancelled, "rejected": rejected},
            "good": n if good is None else good, "ttft": [ttft] * n, "tpot": [tpot] * n}


RULE = CanaryRule(min_requests=10)
BASE = side_stats([window(20), window(20)], [1, 2], 10.0)


def test_side_stats_pool_replicas_and_exclude_cancellations():
    side = side_stats([window(8, ttft=0.1), window(2, ttft=0.9, errors=2, cancelled=5)],
                      [0, 1], 10.0)
    assert (side.requests, side.finished, side.errors, side.cancelled) == (12, 10, 2, 5)
    assert side.error_rate == pytest.approx(2 / 12)
    assert side.goodput_share == pytest.approx(10 / 12)
    assert side.goodput_rps == pytest.approx(10 / 20)  # per replica-second
    assert side.ttft_p99_s > 0.8 and side.ttft_p50_s == pytest.approx(0.1)


@pytest.mark.parametrize(("canary", "metric"), [
    (window(20, ttft=0.5), "ttft_p99_s"),  # 10x slower first token (max_num_seqs=1)
    (window(20, tpot=0.05), "tpot_p99_s"),
    (window(20, errors=3), "error_timeout_rate"),
    (window(20, timeouts=3), "error_timeout_rate"),
    (window(20, rejected=3), "error_timeout_rate"),  # refused at arrival: the canary's fault
    (window(20, good=10), "goodput_share"),  # no errors, but half miss their SLO
])
def test_a_regression_rolls_back_at_once_even_mid_window(canary, metric):
    verdict = decide(side_stats([canary], [0], 10.0), BASE, RULE, window_over=False,
                     extensions=0)
    assert verdict.decision == "rollback" and metric in verdict.why
    assert [c.metric for c in verdict.checks if c.regressed][0] == metric


def test_a_good_change_promotes_only_when_the_window_is_over():
    canary = side_stats([window(20, ttft=0.055)], [0], 10.0)  # +10%: within the rule
    assert decide(canary, BASE, RULE, window_over=False, extensions=0).decision == "continue"
    verdict = decide(canary, BASE, RULE, window_over=True, extensions=0)
    assert verdict.decision == "promote"
    assert all(not c.regressed for c in verdict.checks)


def test_a_relative_regression_under_the_absolute_floor_is_not_one():
    base = side_stats([window(20, ttft=0.002)], [1], 10.0)
    canary = side_stats([window(20, ttft=0.004)], [0], 10.0)  # 2x, but 2 ms
    assert decide(canary, base, RULE, window_over=True, extensions=0).decision == "promote"


def test_one_error_in_200_against_a_clean_baseline_is_within_the_points():
    """Error rates compare in points: 0 -> 0.5% is not "infinitely worse" than 0."""
    canary = side_stats([window(199, errors=1)], [0], 10.0)
    verdict = decide(canary, BASE, RULE, window_over=True, extensions=0)
    assert verdict.decision == "promote", verdict.why


def test_a_tpot_regression_in_the_tail_alone_rolls_back():
    """5 streams in 100 that stall show in p99, not in the median: the rule reads p99."""
    canary = side_stats([window(95), window(5, tpot=0.1)], [0], 10.0)
    verdict = decide(canary, BASE, RULE, window_over=False, extensions=0)
    assert verdict.decision == "rollback" and "tpot_p99_s" in verdict.why


def test_too_few_requests_extend_then_roll_back_as_inconclusive():
    few = side_stats([window(3, ttft=5.0)], [0], 10.0)  # awful, but 3 requests prove little
    assert decide(few, BASE, RULE, window_over=False, extensions=0).decision == "continue"
    assert decide(few, BASE, RULE, window_over=True, extensions=0).decision == "extend"
    last = decide(few, BASE, RULE, window_over=True, extensions=1)
    assert last.decision == "rollback" and last.why.startswith("inconclusive")


def test_a_rule_with_a_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="ttft_rel=-1"):
        CanaryRule(ttft_rel=-1).validate()


def test_a_rule_with_min_requests_zero_is_refused():
    """With 0 a side, a canary nobody sent a request to would be promoted at its window's
    end (too few is never true)."""
    assert decide(side_stats([], [0], 10.0), BASE, CanaryRule(min_requests=0),
                  window_over=True, extensions=0).decision == "promote"
    with pytest.raises(ValueError, match="min_requests=0 must be >= 1"):
        CanaryRule(min_requests=0).validate()
