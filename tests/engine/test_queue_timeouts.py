"""Queue timeouts fire on time whatever order requests joined their lane in (issue 17.7).

A request can join a lane behind newer ones: moved there from a removed lane, or replayed
with its original `arrival_time`. Each must time out when IT has waited the lane's
timeout, not when the request ahead of it in the queue does.
"""

from __future__ import annotations

from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.request import SamplingParams

TIMEOUT_MS = 30_000
LONG = SamplingParams(max_tokens=1_000, ignore_eos=True)  # runs through the whole test


def _statuses(out) -> dict[str, str]:
    return {r.request_id: r.status for r in out.finished}


def one_slot_taken():
    """One lane with one running slot, which a long request ("runner") holds: whatever
    arrives next waits in the queue -> (engine, clock, driver)."""
    live = live_config((LaneConfig("only", max_running=1, queue_timeout_ms=TIMEOUT_MS),),
                       max_num_seqs=8)
    engine, clock = make_engine(live, max_model_len=2048)
    d = Driver(engine)
    d.add("runner", prompt(0, 8), LONG)
    d.step()
    return engine, clock, d


def test_a_request_replayed_with_an_older_arrival_times_out_on_time():
    live = live_config((LaneConfig("only", max_running=1, queue_timeout_ms=TIMEOUT_MS),),
                       max_num_seqs=8)
    engine, clock = make_engine(live, max_model_len=2048)
    d = Driver(engine)
    d.add("runner", prompt(0, 8), LONG)  # holds the lane's one running slot
    d.step()
    now = clock()
    d.add("newer", prompt(1, 8))  # pushed first, arrived now
    d.add("older", prompt(2, 8), arrival_time=now - 20.0)  # pushed second, arrived 20 s ago
    clock.advance(10.5)  # older has waited 30.5 s, newer 10.5 s
    out = d.step()
    assert _statuses(out) == {"older": "TIMEOUT"}, _statuses(out)
    assert d.finished_records()["older"].e2e_s == 30.5  # arrival to its end
    assert engine.get_request("newer") is not None


def test_a_request_moved_from_a_removed_lane_times_out_on_time():
    lanes = (LaneConfig("a", max_running=1), LaneConfig("b", max_running=1))
    live = live_config(lanes, max_num_seqs=8, queue_timeout_ms=TIMEOUT_MS)
    engine, clock = make_engine(live, max_model_len=2048)
    d = Driver(engine)
    d.add("run_a", prompt(0, 8), LONG, lane="a")
    d.add("run_b", prompt(1, 8), LONG, lane="b")
    d.step()  # both lanes now full (max_running=1)
    d.add("x", prompt(2, 8), lane="a")
    clock.advance(20.0)
    d.step()
    d.add("y", prompt(3, 8), lane="b")  # newer than x, queued in b first
    d.update_config(live_config((lanes[1],), max_num_seqs=8, queue_timeout_ms=TIMEOUT_MS),
                    lane_moves={"a": "b"})  # x joins b's queue behind y
    clock.advance(11.0)  # x has waited 31 s, y 11 s
    out = d.step()
    assert _statuses(out) == {"x": "TIMEOUT"}, _statuses(out)
    assert d.finished_records()["x"].e2e_s == 31.0
    assert engine.get_request("y") is not None


def test_a_live_timeout_change_applies_to_requests_already_queued():
    engine, clock, d = one_slot_taken()
    d.add("first", prompt(1, 8))
    clock.advance(6.0)
    d.add("second", prompt(2, 8))
    clock.advance(4.0)  # first waited 10 s, second 4 s
    d.step()
    assert {"first", "second"} <= set(engine.requests)
    d.update_config(live_config((LaneConfig("only", max_running=1, queue_timeout_ms=5_000),),
                                max_num_seqs=8))
    out = d.step()  # from this step on: 5 s
    assert _statuses(out) == {"first": "TIMEOUT"}
    clock.advance(1.5)
    assert _statuses(d.step()) == {"second": "TIMEOUT"}


def test_a_request_times_out_after_waiting_more_than_the_timeout_not_at_it():
    """The queue timeout is the longest a request may wait (as admission tells it): at
    exactly 30 s it is still queued; any longer and it ends."""
    engine, clock, d = one_slot_taken()
    d.add("waiting", prompt(1, 8))
    clock.advance(TIMEOUT_MS / 1000)  # exactly the timeout: not more
    assert _statuses(d.step()) == {}
    clock.advance(0.001)
    assert _statuses(d.step()) == {"waiting": "TIMEOUT"}


def test_a_request_past_its_queue_timeout_and_its_deadline_ends_once():
    """Both limits passed by the same step: the request is in both of the lane's heaps and
    must end there once, as TIMEOUT, not be ended a second time (an invariant error that
    fails the step)."""
    engine, clock, d = one_slot_taken()
    assert d.add("both", prompt(1, 8), deadline=clock() + 25.0).accepted
    clock.advance(31.0)  # past its deadline (25 s) and its queue timeout (30 s)
    out = d.step()
    assert [(r.request_id, r.status) for r in out.finished] == [("both", "TIMEOUT")]
    assert engine.get_request("runner") is not None


def test_a_preempted_request_queued_again_is_past_its_queue_timeout():
    """y started, streamed, and was preempted for a block: queued again, it waits to resume,
    not for a first start, so the queue timeout (counted from its arrival) no longer
    applies. The request that never started times out beside it; y resumes and ends."""
    lanes = (LaneConfig("only", policy="priority", queue_timeout_ms=5_000),)
    live = live_config(lanes, max_num_seqs=2, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, clock = make_engine(live, num_kv_blocks=8, max_model_len=128,
                                enable_prefix_caching=False)
    d = Driver(engine)
    d.add("never", prompt(0, 8), priority=9)  # arrived first: its timeout entry goes first
    d.add("x", prompt(1, 40), SamplingParams(max_tokens=60))
    d.add("y", prompt(2, 40), SamplingParams(max_tokens=60))
    while engine.get_request("y").status.name != "PREEMPTED":
        d.step()
    assert d.logs["y"].tokens  # it had streamed tokens
    clock.advance(10.0)  # both waited past the 5 s queue timeout since they arrived
    assert _statuses(d.step()) == {"never": "TIMEOUT"}
    d.run()
    assert d.finished_records()["y"].finish_reason == "length"


def test_timeout_bookkeeping_stays_bounded_behind_a_request_that_waits():
    """A request that waits long (lowest priority) must not pin the entries of every
    request that started after it: they are dropped once they outnumber the queued."""
    lanes = (LaneConfig("only", max_running=1, policy="priority",
                        queue_timeout_ms=3_600_000),)
    engine, clock = make_engine(live_config(lanes, max_num_seqs=8), max_model_len=2048)
    d = Driver(engine)
    d.add("patient", prompt(0, 8), priority=9)
    for i in range(600):  # each starts (priority 0) ahead of patient, and ends
        d.add(f"r{i}", prompt(i + 1, 4), SamplingParams(max_tokens=1, ignore_eos=True))
        d.step()
        clock.advance(0.1)
    lane = engine.scheduler.lanes["only"]
    assert engine.get_request("patient") is not None and lane.num_waiting <= 2
    assert len(lane.timeouts) <= 2 * lane.num_waiting + 64 + 1
