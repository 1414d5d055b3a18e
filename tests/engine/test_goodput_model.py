"""The goodput model's arithmetic term by term (engine/scheduling/goodput.py): what counts
ahead of the queue, how a slow device and the streams' TPOT bound a step, how much a grown
step asks for, and admission's TTFT estimates. test_goodput_policy.py runs the policy on
the simulated engine; these pin the pieces a policy-level test can miss."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import prompt
from fixtures.law_engine import LAW, timed_engine
from test_goodput_policy import BASE, SLO, live, live_with_long_lane, model

from engine.config import LaneConfig, LaneSLO
from engine.lanes.queues import LaneSet
from engine.request import Request, SamplingParams
from engine.scheduling.goodput import (
    GROWTH_MARGIN,
    MAX_GROWTH,
    QueueModel,
    alone_ttft_s,
)
from engine.scheduling.step_time import HEADROOM


def running_prompt(rid: str, length: int, done: int, deferred: bool = False) -> Request:
    """A chat request running with `done` of its `length` prompt tokens computed."""
    req = Request(rid, prompt(len(rid), length), SamplingParams(max_tokens=4), 0.0,
                  lane="chat")
    req.num_computed_tokens, req.slo_deferred = done, deferred
    return req


def test_a_running_prompts_rest_is_ahead_of_the_queue_and_a_deferred_ones_is_not():
    """A deferred prompt under way runs after the queue (Scheduler.schedule): counted
    ahead, it would grow steps and shed requests for work that does not delay them."""
    on_time = model([running_prompt("a", 600, 200)])
    assert on_time.ahead_s == pytest.approx(LAW.chunk_s(200, 400))  # what is left of it
    assert model([running_prompt("d", 600, 200, deferred=True)]).ahead_s == 0.0


def test_the_running_prompts_ahead_of_the_queue_can_grow_the_step():
    """The same queue, met at the base step when nothing runs ahead of it, needs a bigger
    step behind 2 law-seconds of running prompts: its first request starts after them."""
    idle = model()
    queue = [(3.0, 0.5)]
    assert idle.choose(queue, 0.0).reason == "target"
    behind = dataclasses.replace(idle, ahead_s=2.0)
    # 2.5 law-seconds in 3 s: past the base step's rate, within the largest step's
    assert idle.rate(BASE) < 2.5 / 3.0 < idle.rate(idle.cap_s)
    assert behind.choose(queue, 0.0).reason == "grow_for_slo"


def test_a_stream_whose_tpot_is_under_the_base_target_never_shrinks_a_step():
    """The largest step allowed is at least the base target: a stream with a 0.1 s TPOT
    target does not make a queue past saving run 0.1 s steps (the fixed cost paid 2.5x as
    often, the queue cleared slower)."""
    tight = LaneSLO(ttft_s=3.0, tpot_s=0.1)
    cfg = live(lanes=(LaneConfig("chat", slo=tight), LaneConfig("bulk")))
    stream = running_prompt("s", 10, 10)
    m = QueueModel.of(LAW, 1.0, BASE, [stream], cfg, LaneSet(cfg.lanes))
    assert m.cap_s == BASE
    choice = m.choose([(1.0, 50.0)], 0.0)
    assert (choice.seconds, choice.growth) == (BASE, 1.0)


def test_a_device_slower_than_its_law_clears_the_queue_slower_and_grows_for_it():
    """At slowdown 2 a step's law time is half its real time: the prompt rate falls, and
    the step sized for a rate is the one that gives it on the slow device."""
    fast = model()
    slow = dataclasses.replace(fast, slowdown=2.0)
    for step in (0.25, 1.0, 2.0):
        run = HEADROOM * step
        assert slow.rate(step) == pytest.approx((run / 2.0 - fast.overhead_s) / run)
        assert slow.rate(step) < fast.rate(step)
        assert slow.step_for_rate(slow.rate(step)) == pytest.approx(step)


def test_a_queued_request_already_past_its_deadline_grows_the_step_to_the_largest():
    """No step meets a deadline that has passed: the queue is past saving, so the step
    grows to the largest allowed rather than staying at the base target."""
    choice = model().choose([(9.0, 0.01)], 10.0)
    assert (choice.reason, choice.seconds) == ("grow_for_throughput", MAX_GROWTH * BASE)


def test_a_grown_step_asks_growth_margin_times_the_rate_the_queue_needs():
    """Growing to exactly the rate needed leaves no room for a step that runs a little
    slow: the grown step gives GROWTH_MARGIN x that rate. (Under a running set whose
    decodes cost 0.15 law-seconds a step, say 64 streams of 125 tokens: with the bare
    fixed cost the base step's rate is within GROWTH_MARGIN of the largest's.)"""
    m = dataclasses.replace(model(), overhead_s=0.15)
    needed = 0.5
    assert m.rate(BASE) < needed and GROWTH_MARGIN * needed < m.rate(m.cap_s)
    choice = m.choose([(2.0, 2.0 * needed)], 0.0)
    assert choice.reason == "grow_for_slo"
    assert m.rate(choice.seconds) == pytest.approx(GROWTH_MARGIN * needed)


def test_a_predicted_ttft_is_the_wait_then_the_work_ahead_at_the_largest_step():
    """req waited 2 s before admission; ahead of it: its lane's 1 law-second of queue and
    its own prompt, and the bulk lane's 50 law-seconds only up to bulk's fair share while
    req's lane is served (weight 1 against chat's 2: half req's lane's work), all at the
    rate of the largest step."""
    m = model()
    req = Request("r", prompt(1, 600), SamplingParams(), 98.0, lane="chat")
    own = 1.0 + LAW.chunk_s(0, 600)
    predicted = m.predicted_ttft_s(req, {"chat": 1.0, "bulk": 50.0},
                                   {"chat": 2.0, "bulk": 1.0}, 100.0)
    assert predicted == pytest.approx(2.0 + (own + own / 2) / m.rate(m.cap_s))


def test_a_prompt_that_meets_the_default_lanes_ttft_alone_at_the_largest_step_stays():
    """1,800 tokens take 2.6 s alone at the largest step (under chat's 3 s), 3.1 s at the
    base step: priced at the base step it would go to the long-context lane, behind its
    long prompts, though chat serves it in time."""
    law_s = LAW.chunk_s(0, 1800)
    at_base = QueueModel(LAW, 1.0, BASE, BASE, LAW.fixed_s, 0.0)
    assert alone_ttft_s(LAW, 1.0, BASE, 1800) < SLO.ttft_s < law_s / at_base.rate(BASE)
    engine, _ = timed_engine(live_with_long_lane())
    decision = engine.add_request("mid", prompt(1, 1800), SamplingParams(max_tokens=4))
    assert decision.accepted and decision.lane == "chat"
