"""A lane's SLO (engine/config/slo.py): a request meets it at exactly its targets and not a
hair past them, one without a first token never does, one with a single output token (no
TPOT) meets any TPOT target; a target must be a positive number of seconds up to an hour."""

from __future__ import annotations

import pytest

from engine.config.slo import MAX_SLO_S, LaneSLO

SLO = LaneSLO(ttft_s=1.0, tpot_s=0.1)


@pytest.mark.parametrize(("ttft_s", "tpot_s", "met"), [
    (1.0, 0.1, True), (0.5, 0.05, True), (1.0001, 0.1, False), (1.0, 0.1001, False),
    (None, 0.05, False), (0.5, None, True)])
def test_a_request_meets_its_slo_up_to_and_at_each_target(ttft_s, tpot_s, met):
    assert SLO.met(ttft_s, tpot_s) is met


def test_no_targets_are_met_by_anything_but_a_missing_first_token():
    assert LaneSLO().met(100.0, 5.0) and LaneSLO(tpot_s=0.1).met(None, 0.05)
    assert not LaneSLO(ttft_s=5.0).met(None, None)


@pytest.mark.parametrize("value", [0, 0.0, -1.0, MAX_SLO_S + 1, float("nan"), True, "1"])
def test_a_target_outside_zero_to_an_hour_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"lanes\.chat\.slo\.ttft_s=.* must be a number of"
                       " seconds in"):
        LaneSLO.parse({"ttft_s": value}, "lanes.chat.slo")


def test_an_hour_and_the_smallest_positive_target_are_accepted():
    assert LaneSLO.parse({"ttft_s": MAX_SLO_S, "tpot_s": 1e-6}, "slo") == LaneSLO(
        ttft_s=MAX_SLO_S, tpot_s=1e-6)
