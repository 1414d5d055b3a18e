"""Admission stories: every rejection has a reason, and queued requests time out.

Every scenario drives the engine through `Driver`, which checks budgets, block integrity
and the one-finish-per-request contract after every step.
"""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt, warm_engine

from engine.config import LaneConfig
from engine.request import SamplingParams

ONE_LANE = (LaneConfig("interactive"),)


def test_queue_full_rejects_with_reason():
    live = live_config(ONE_LANE, max_num_seqs=1, max_waiting_requests=2)
    engine, _ = make_engine(live)
    d = Driver(engine)
    d.add("r0", prompt(0, 8))
    d.step()  # r0 runs; running requests do not count against the queue
    assert d.add("w1", prompt(1, 8)).accepted
    assert d.add("w2", prompt(2, 8)).accepted
    rejected = d.add("w3", prompt(3, 8))
    assert not rejected.accepted
    assert rejected.reason == "queue_full"
    assert "max_waiting_requests" in rejected.message
    assert rejected.retry_after_s is not None and rejected.retry_after_s >= 1.0
    out = d.step()
    record = {r.request_id: r for r in out.finished}["w3"]
    assert record.status == "REJECTED" and record.finish_detail == "queue_full"
    assert all(dl.request_id != "w3" for dl in out.deltas)
    d.run()
    assert d.add("w4", prompt(4, 8)).accepted  # room again once the queue drained
    d.run()


def test_lane_queue_full_rejects_only_that_lane():
    lanes = (LaneConfig("interactive"), LaneConfig("batch", max_waiting=1))
    engine, _ = make_engine(live_config(lanes, max_num_seqs=1))
    d = Driver(engine)
    assert d.add("b1", prompt(1, 8), lane="batch").accepted
    rejected = d.add("b2", prompt(2, 8), lane="batch")
    assert (rejected.accepted, rejected.reason) == (False, "queue_full")
    assert "'batch'" in rejected.message
    assert d.add("i1", prompt(3, 8), lane="interactive").accepted
    d.run()


def test_deadline_in_the_past_is_rejected():
    engine, clock = make_engine()
    d = Driver(engine)
    decision = d.add("late", prompt(1, 8), deadline=clock.now - 0.001)
    assert (decision.accepted, decision.reason) == (False, "deadline")
    assert d.add("ok", prompt(2, 8), deadline=clock.now + 60).accepted
    d.run()


def test_deadline_too_close_for_measured_throughput_is_rejected():
    engine, clock, d = warm_engine(ONE_LANE)  # measured: 1000 tokens/s

    too_close = d.add("a", prompt(1, 500), deadline=clock.now + 0.2)
    assert (too_close.accepted, too_close.reason) == (False, "deadline")
    assert too_close.estimated_wait_s == pytest.approx(0.5)
    assert d.add("b", prompt(2, 500), deadline=clock.now + 5.0).accepted
    # 500 queued tokens ahead: the next 500-token prompt needs about 1 s
    behind = d.add("c", prompt(3, 500), deadline=clock.now + 0.8)
    assert (behind.accepted, behind.reason) == (False, "deadline")
    d.run()


def test_prefix_hits_do_not_inflate_the_estimated_wait():
    engine, clock = make_engine(live_config(ONE_LANE), prefill_token_cost_s=1e-3,
                                decode_token_cost_s=1e-3)
    d = Driver(engine)
    system = prompt(99, 64)
    for i in range(20):  # each after the first hits the cached system prompt
        d.add(f"u{i}", system + prompt(i, 8), SamplingParams(max_tokens=2, ignore_eos=True))
        d.run()
    assert d.finished_records()["u19"].num_cached_tokens == 64
    # Nothing is queued: a 100-token prompt waits 100 tokens at 1000 tokens/s.
    decision = d.add("next", prompt(7, 100), deadline=clock.now + 0.5)
    assert decision.accepted
    assert decision.estimated_wait_s == pytest.approx(0.1)
    d.run()


def test_waiting_request_past_queue_timeout_times_out():
    lanes = (LaneConfig("interactive"), LaneConfig("batch", queue_timeout_ms=50))
    engine, clock = make_engine(live_config(lanes, max_num_seqs=1, queue_timeout_ms=100))
    d = Driver(engine)
    d.add("r0", prompt(0, 8), SamplingParams(max_tokens=30, ignore_eos=True))
    d.step()
    d.add("i1", prompt(1, 8))
    d.add("b1", prompt(2, 8), lane="batch")
    d.add("dl", prompt(3, 8), deadline=clock.now + 0.02)
    clock.advance(0.06)  # past the batch lane's 50 ms and dl's deadline, not the 100 ms
    out = d.step()
    ended = {r.request_id: r for r in out.finished}
    assert ended["b1"].status == "TIMEOUT" and ended["b1"].finish_detail == "queue timeout"
    assert ended["dl"].status == "TIMEOUT" and "deadline" in ended["dl"].finish_detail
    assert "i1" not in ended
    assert ended["b1"].first_scheduled_time is None
    clock.advance(0.05)
    out = d.step()
    assert [r.request_id for r in out.finished if r.status == "TIMEOUT"] == ["i1"]
    assert {dl.request_id: dl.finish_reason for dl in out.deltas}["i1"] == "timeout"
    d.run()
    assert d.logs["r0"].finish_reason == "length"  # a running request never times out


def test_above_reject_watermark_new_requests_are_rejected():
    live = live_config(ONE_LANE, max_num_seqs=8, max_num_batched_tokens=512,
                       prefill_chunk_size=512, kv_cache_high_watermark=0.8,
                       kv_cache_reject_watermark=0.9)
    engine, _ = make_engine(live, num_kv_blocks=32, max_model_len=512)
    d = Driver(engine)
    d.add("hog", prompt(1, 480), SamplingParams(max_tokens=16, ignore_eos=True))
    d.step()
    assert engine.block_manager.usage > 0.9
    decision = d.add("late", prompt(2, 8))
    assert (decision.accepted, decision.reason) == (False, "kv_reject_watermark")
    assert decision.retry_after_s is not None
    d.run()
    assert d.add("later", prompt(3, 8)).accepted
    d.run()


def test_prompt_plus_max_tokens_over_max_model_len_is_too_long():
    engine, _ = make_engine(live_config(ONE_LANE, prefill_chunk_size=256), max_model_len=256)
    d = Driver(engine)
    assert d.add("fits", prompt(1, 200), SamplingParams(max_tokens=56)).accepted
    decision = d.add("over", prompt(2, 200), SamplingParams(max_tokens=57))
    assert (decision.accepted, decision.reason) == (False, "too_long")
    assert "256" in decision.message
    d.run()


def test_request_larger_than_the_kv_pool_is_rejected_not_spun_forever():
    # 8 blocks of 16 tokens hold 128 tokens; max_model_len allows more.
    live = live_config(ONE_LANE, max_num_seqs=4, prefill_chunk_size=256)
    engine, _ = make_engine(live, num_kv_blocks=8, max_model_len=256)
    d = Driver(engine)
    decision = d.add("huge", prompt(1, 100), SamplingParams(max_tokens=40))
    assert (decision.accepted, decision.reason) == (False, "too_long")
    assert "128" in decision.message
    assert d.add("fits", prompt(2, 100), SamplingParams(max_tokens=28)).accepted
    d.run(max_steps=200)


def test_a_request_id_in_use_is_refused_and_the_first_request_goes_on():
    engine, _ = make_engine(live_config(ONE_LANE))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    assert engine.add_request("a", prompt(1, 8), params).accepted
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("a", prompt(2, 8), params)
    (record,) = [r for out in engine.run_until_done() for r in out.finished]
    assert record.request_id == "a" and record.num_output_tokens == 4


def test_refusing_a_request_whose_id_a_running_one_uses_leaves_that_one_running():
    """A refusal (the server draining) only records the refused request: a running one
    that happens to use the same id keeps its stream and finishes with all its tokens."""
    engine, _ = make_engine(live_config(ONE_LANE))
    engine.add_request("a", prompt(1, 8), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    decision = engine.refuse("a", prompt(2, 8), "draining", "the server is shutting down")
    assert not decision.accepted
    assert engine.get_request("a") is not None
    records = [r for out in engine.run_until_done() for r in out.finished]
    assert sorted((r.status, r.num_output_tokens) for r in records) == [
        ("LENGTH", 4), ("REJECTED", 0)]


def test_run_until_done_reports_a_refusal_that_is_all_there_is():
    """The offline API steps while requests are unfinished: a refusal alone still comes
    out, with its record, rather than an empty run."""
    engine, _ = make_engine(live_config(ONE_LANE))
    engine.refuse("r0", prompt(1, 8), "draining", "the server is shutting down")
    assert engine.has_unfinished_requests()
    records = [r for out in engine.run_until_done() for r in out.finished]
    assert [(r.request_id, r.status) for r in records] == [("r0", "REJECTED")]
