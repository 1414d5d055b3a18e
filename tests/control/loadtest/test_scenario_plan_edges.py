"""Edges of what `plan()` sends (control/loadtest/scenario.py): the end of a duration, a
trace's row limit, a trace that only times the arrivals, lengths that round to nothing,
ignore_eos off, a rate change on bursts, and draws that do not steer one another."""

from __future__ import annotations

from collections import Counter

import pytest
from fixtures.loadtest import small_scenario

from control.loadtest.scenario import plan, scale_rate
from engine.sim.workload import load_trace

TRACE = {"path": "azure_llm_2023_conv.csv", "time_scale": 4.0}




def test_a_burst_that_lands_on_the_duration_is_sent():
    """duration_s: arrivals up to that offset, itself included."""
    bursts = small_scenario(requests=None, duration_s=20,
                       arrival={"process": "bursts", "burst_size": 5, "every_s": 10})
    assert [r.arrival_s for r in plan(bursts)] == [10.0 * (i // 5) for i in range(15)]


def test_scale_rate_makes_bursts_come_that_much_more_often():
    bursts = small_scenario(requests=15, arrival={"process": "bursts", "burst_size": 5,
                                             "every_s": 10})
    assert [r.arrival_s for r in plan(scale_rate(bursts, 2.0))] == [
        5.0 * (i // 5) for i in range(15)]


def test_ignore_eos_off_reaches_every_planned_request():
    assert {r.ignore_eos for r in plan(small_scenario(ignore_eos=False))} == {False}


def test_a_length_that_rounds_to_zero_is_one_token():
    """A server refuses max_tokens 0 and an empty prompt: a count is at least 1."""
    planned = plan(small_scenario(prompt={"dist": "fixed", "value": 0.3},
                             output={"dist": "fixed", "value": 0}))
    assert {(r.prompt_tokens, r.output_tokens) for r in planned} == {(1, 1)}


def test_a_trace_limit_caps_the_replay_whatever_the_requests():
    replay = small_scenario(requests=50, arrival={"process": "trace"}, prompt={"dist": "trace"},
                       trace={**TRACE, "limit": 20})
    assert len(plan(replay)) == 20  # a replay ends with its rows
    # lengths from the trace, arrivals drawn: the 20 rows' lengths come round again
    lengths = plan(small_scenario(requests=50, prompt={"dist": "trace"},
                             trace={**TRACE, "limit": 20}))
    assert [r.prompt_tokens for r in lengths[20:40]] == [r.prompt_tokens for r in lengths[:20]]


def test_a_trace_can_time_the_arrivals_of_fixed_length_requests():
    planned = plan(small_scenario(requests=None, duration_s=1e6, arrival={"process": "trace"},
                             trace={**TRACE, "limit": 30}))
    rows = load_trace(limit=30)
    assert [r.arrival_s for r in planned] == pytest.approx([row.arrival_s * 4.0 for row in rows])
    assert {r.prompt_tokens for r in planned} == {100}


def test_the_tenant_drawn_does_not_decide_the_lane():
    """Each draw has its own random stream: two tenants and two lanes, equally weighted,
    give all four pairs about equally often."""
    planned = plan(small_scenario(requests=2000, tenants={"a": 1, "b": 1}, lanes={"x": 1, "y": 1}))
    pairs = Counter((r.tenant, r.lane) for r in planned)
    assert len(pairs) == 4
    assert all(n / len(planned) == pytest.approx(0.25, abs=0.04) for n in pairs.values())
