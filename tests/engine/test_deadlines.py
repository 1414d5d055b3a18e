"""A deadline means "done by" (issue 17, item 8): admission refuses a request that cannot
finish by it, and a started request still unfinished at its deadline ends there with the
tokens it has (TIMEOUT, and the detail says where it was)."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt, warm_engine

from engine.config import LaneConfig
from engine.request import Request, SamplingParams
from engine.scheduling.deadlines import DeadlineHeap

ONE_LANE = (LaneConfig("interactive"),)


def test_admission_counts_the_tokens_after_the_first():
    engine, clock, d = warm_engine(ONE_LANE)
    long_answer = SamplingParams(max_tokens=900, ignore_eos=True)
    # First token after ~0.1 s (100-token prompt), but 899 more take >= 0.899 s.
    refused = d.add("a", prompt(1, 100), long_answer, deadline=clock.now + 0.5)
    assert (refused.accepted, refused.reason) == (False, "deadline")
    assert refused.estimated_wait_s == pytest.approx(0.1)  # still the wait for the first
    assert "max_tokens" in refused.message and "0.999s" in refused.message
    assert d.add("b", prompt(2, 100), long_answer, deadline=clock.now + 1.5).accepted
    short = SamplingParams(max_tokens=8, ignore_eos=True)
    assert d.add("c", prompt(3, 100), short, deadline=clock.now + 0.5).accepted
    d.run()


def test_before_any_throughput_is_measured_only_a_past_deadline_is_refused():
    engine, clock = make_engine(live_config(ONE_LANE))
    d = Driver(engine)
    huge = SamplingParams(max_tokens=1000, ignore_eos=True)
    assert engine.throughput.tokens_per_s is None
    assert d.add("soon", prompt(1, 500), huge, deadline=clock.now + 0.001).accepted
    past = d.add("past", prompt(2, 8), deadline=clock.now - 0.001)
    assert (past.accepted, past.reason) == (False, "deadline")
    d.run()


def test_a_running_request_past_its_deadline_ends_with_what_it_has():
    # Each step costs 10 ms: about 30 tokens fit before the 0.3 s deadline.
    engine, clock = make_engine(live_config(ONE_LANE), step_cost_s=0.01)
    d = Driver(engine)
    start = clock.now
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    assert d.add("late", prompt(1, 8), params, deadline=start + 0.3).accepted
    assert d.add("free", prompt(2, 8), params).accepted  # no deadline: runs to the end
    d.run()  # also checks "late" got a prefix of its undisturbed output
    ended = d.finished_records()
    late = ended["late"]
    assert (late.status, late.finish_reason) == ("TIMEOUT", "timeout")
    assert late.finish_detail == "deadline passed while running"
    assert 25 <= len(d.logs["late"].tokens) <= 31 and late.num_output_tokens < 100
    assert start + 0.3 <= late.finished_time <= start + 0.3 + 0.011  # the first step past it
    assert d.logs["late"].finish_reason == "timeout"  # the stream's last delta says why
    assert ended["free"].finish_reason == "length" and ended["free"].num_output_tokens == 100
    assert engine.block_manager.num_used == 0


def test_a_preempted_request_past_its_deadline_ends_while_queued_again():
    # 8 blocks of 16: both grow to 4 blocks, then `a` needs a 5th and preempts `b` (the
    # later arrival), which cannot start again until `a` is done (about 1.8 s).
    engine, clock = make_engine(live_config(ONE_LANE, max_num_seqs=4), num_kv_blocks=8,
                                step_cost_s=0.01, decode_token_cost_s=0.005)
    d = Driver(engine)
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    d.add("a", prompt(1, 8), params)
    d.add("b", prompt(2, 8), params, deadline=clock.now + 1.5)
    d.run()
    b = d.finished_records()["b"]
    assert b.num_preemptions == 1
    assert (b.status, b.finish_detail) == ("TIMEOUT", "deadline passed while queued")
    assert d.finished_records()["a"].finish_reason == "length"


def test_the_deadline_heap_forgets_requests_that_finished_long_before_their_deadline():
    engine, clock = make_engine(live_config(ONE_LANE))
    d = Driver(engine)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for i in range(400):  # deadlines a day away, each request done in two steps
        d.add(f"r{i}", prompt(i, 8), params, deadline=clock.now + 86_400)
        d.step()
        d.step()
        assert len(engine.scheduler.deadlines) <= 2 + 64 + 1
    d.run()


def test_the_measured_throughput_counts_prompt_tokens():
    """A step that only computed a 100-token prompt in 10 ms ran 10,000 tokens/s: what
    admission's deadline estimates read, not nothing for want of a decode."""
    engine, _ = make_engine(live_config(ONE_LANE), step_cost_s=0.01)
    engine.add_request("a", prompt(1, 100), SamplingParams(max_tokens=1, ignore_eos=True))
    engine.step()
    assert engine.throughput.tokens_per_s == pytest.approx(10_000.0)


def test_a_deadline_passes_only_after_its_instant():
    """Done by the deadline is on time: at that very instant a started request is not
    due; a moment later it is."""
    heap = DeadlineHeap()
    req = Request("a", prompt(1, 8), SamplingParams(), 0.0, deadline=10.0)
    heap.push(req, 1)
    assert heap.due(10.0) == []
    assert heap.due(10.001) == [req]
