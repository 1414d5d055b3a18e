"""The scheduler's state and a step's budget at their edges (engine/scheduling/state.py,
budget.py): what a preemption leaves in a request's record and its resumed chunk, a victim's
chunk taken back in the step that gave it, and deferred work counted once."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt
from fixtures.law_engine import LAW, timed_engine

from engine.config import LaneConfig
from engine.records import SchedulingDecisions
from engine.request import SamplingParams


def test_a_preempted_request_counts_its_preemption_and_is_admitted_once():
    """Three one-block requests in a four-block pool: step 2's decodes need a block each,
    so the latest arrival is preempted, then resumes. Its record counts one preemption,
    the steps admit it once, and its queue delay is to its first start, not its resume."""
    live = live_config((LaneConfig("only"),), max_num_seqs=4, prefill_chunk_size=64)
    engine, clock = make_engine(live, num_kv_blocks=4, max_model_len=64, step_cost_s=0.01)
    d = Driver(engine)
    for i in (1, 2, 3):
        d.add(f"r{i}", prompt(i, 16), SamplingParams(max_tokens=8, ignore_eos=True))
    arrived = clock()
    d.step()
    assert d.step().record.decisions.preempted == ["r3"]
    d.run()
    admitted = [rid for rec in d.records() for rid in rec.decisions.admitted]
    assert sorted(admitted) == ["r1", "r2", "r3"]
    record = d.finished_records()["r3"]
    assert record.num_preemptions == 1
    assert record.first_scheduled_time == arrived and record.queue_delay_s == 0.0
    assert d.finished_records()["r1"].num_preemptions == 0


def test_a_preempted_request_recomputes_its_whole_context_when_blocks_are_free_at_once():
    """Preempted, its KV is gone: when it starts again on its first try (blocks free), its
    chunk is the prompt and the token it had sampled, not just what it had not computed."""
    engine, _ = make_engine(live_config((LaneConfig("only"),), max_num_seqs=4),
                            enable_prefix_caching=False)  # else its full block is a hit
    d = Driver(engine)
    d.add("a", prompt(1, 16), SamplingParams(max_tokens=4, ignore_eos=True))
    d.step()  # a's prompt: 16 tokens computed, one sampled
    a = engine.get_request("a")
    engine.scheduler.preempt(a, SchedulingDecisions())
    assert (a.num_computed_tokens, a.block_ids) == (0, [])
    assert d.step().record.scheduled == [("a", "prefill", 17)]
    d.run()


def test_a_victim_preempted_after_its_chunk_was_given_runs_nothing_in_that_step():
    """Two prompts take a 16-token chunk (one block) a step from a five-block pool; in step
    3 the urgent one's chunk needs a sixth block: the other, its chunk already given this
    step, is the victim, and that chunk is taken back with its tokens."""
    live = live_config((LaneConfig("only"),), max_num_seqs=4, prefill_chunk_size=16)
    engine, _ = make_engine(live, num_kv_blocks=5, max_model_len=128)
    d = Driver(engine)
    d.add("lazy", prompt(1, 64), SamplingParams(max_tokens=2, ignore_eos=True), priority=5)
    d.add("urgent", prompt(2, 64), SamplingParams(max_tokens=2, ignore_eos=True))
    d.step()
    d.step()
    record = d.step().record
    assert record.decisions.preempted == ["lazy"]
    assert record.scheduled == [("urgent", "prefill", 16)] and record.tokens_used == 16
    d.run()


def test_a_deferred_start_counts_once_in_the_device_time_deferred_requests_get():
    """A deferred prompt started in a step is that step's deferred work (its law time);
    the next observation with nothing started since adds none: work counted every step
    again would credit deferred requests with device time they never got, and admission
    would defer requests that then time out in the queue."""
    engine, clock = timed_engine(live_config((LaneConfig("only"),), max_num_seqs=8))
    state = engine.scheduler
    state.spare_rate.observe(clock() - 10.0, False, 0.0)
    state.spare_rate.observe(clock(), True, 0.0)  # deferred requests waited 10 s
    engine.add_request("late", prompt(1, 100), SamplingParams(max_tokens=2, ignore_eos=True))
    engine.get_request("late").slo_deferred = True  # as admission marks one it defers
    engine.step()  # starts it
    now = clock()
    state.observe_deferred(now)
    once = state.spare_rate.per_s()
    assert once == pytest.approx(LAW.chunk_s(0, 100) / 10.0, rel=0.01)
    state.observe_deferred(now)
    assert state.spare_rate.per_s() == once
