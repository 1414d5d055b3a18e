"""Lane stories: preemption victims, lane limits, queue policies and fair share."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.request import SamplingParams

TWO_LANES = (LaneConfig("interactive"), LaneConfig("batch", preempt_first=True))


def _victim_of(specs: list[tuple[str, str, int]]) -> list[str]:
    """Three one-block requests in a four-block pool: the second decode needs a victim."""
    live = live_config(TWO_LANES, max_num_seqs=4, prefill_chunk_size=64)
    engine, clock = make_engine(live, num_kv_blocks=4, max_model_len=64)
    d = Driver(engine)
    for i, (rid, lane, priority) in enumerate(specs):
        d.add(rid, prompt(i, 16), SamplingParams(max_tokens=8, ignore_eos=True), lane=lane,
              priority=priority)
        clock.advance(0.01)  # distinct arrival times, in list order
    first = d.step()
    assert len(first.record.decisions.admitted) == 3 and first.record.kv_blocks_used == 3
    preempted = d.step().record.decisions.preempted
    d.run()
    return preempted


@pytest.mark.parametrize(("specs", "victim"), [
    # the batch lane goes first, even though it arrived first
    ([("r1", "batch", 0), ("r2", "interactive", 0), ("r3", "interactive", 0)], "r1"),
    # then the lowest priority (largest number), even before a later arrival
    ([("r1", "interactive", 0), ("r2", "interactive", 5), ("r3", "interactive", 0)], "r2"),
    # then the latest arrival
    ([("r1", "interactive", 0), ("r2", "interactive", 0), ("r3", "interactive", 0)], "r3"),
])
def test_preemption_victim_order(specs, victim):
    assert _victim_of(specs) == [victim]


def test_lane_max_running_caps_that_lane_only():
    lanes = (LaneConfig("interactive"), LaneConfig("batch", max_running=1))
    engine, _ = make_engine(live_config(lanes, max_num_seqs=8))
    d = Driver(engine)
    for i in range(3):
        d.add(f"b{i}", prompt(i, 20), SamplingParams(max_tokens=5, ignore_eos=True),
              lane="batch")
        d.add(f"i{i}", prompt(10 + i, 20), SamplingParams(max_tokens=5, ignore_eos=True))
    d.run()
    records = d.records()
    assert max(r.running_by_lane["batch"] for r in records) == 1
    assert max(r.running_by_lane["interactive"] for r in records) == 3
    assert records[0].decisions.waiting_by_reason == {"lane_max_running": 2}


def _start_order(policy: str, requests: list[tuple[str, int, float | None]]) -> list[str]:
    """Queue requests behind a running one (max_num_seqs=1); the order they start in."""
    engine, clock = make_engine(live_config((LaneConfig("only", policy=policy),),
                                            max_num_seqs=1))
    d = Driver(engine)
    d.add("running", prompt(0, 8), SamplingParams(max_tokens=3, ignore_eos=True))
    d.step()
    for i, (rid, priority, deadline_in) in enumerate(requests):
        deadline = clock.now + deadline_in if deadline_in is not None else None
        d.add(rid, prompt(i + 1, 8), SamplingParams(max_tokens=2, ignore_eos=True),
              priority=priority, deadline=deadline)
        clock.advance(0.001)
    d.run()
    admitted = [rid for rec in d.records() for rid in rec.decisions.admitted]
    return [rid for rid in admitted if rid != "running"]


def test_queue_policies_order_requests():
    reqs = [("p3", 3, 30.0), ("p1", 1, None), ("p2", 2, 10.0), ("p1b", 1, 20.0)]
    assert _start_order("fcfs", reqs) == ["p3", "p1", "p2", "p1b"]
    assert _start_order("priority", reqs) == ["p1", "p1b", "p2", "p3"]
    assert _start_order("deadline", reqs) == ["p2", "p1b", "p3", "p1"]  # no deadline: last


def _prefill_tokens(d: Driver, steps, key) -> dict[str, int]:
    """New-prefill tokens per key(request id) over the given StepRecords."""
    totals: dict[str, int] = {}
    for rec in steps:
        for rid, kind, n in rec.scheduled:
            if kind == "prefill":
                totals[key(rid)] = totals.get(key(rid), 0) + n
    return totals


def test_backlogged_lanes_share_tokens_by_weight():
    lanes = (LaneConfig("heavy", weight=3.0), LaneConfig("light", weight=1.0))
    live = live_config(lanes, max_num_seqs=16, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live)
    d = Driver(engine)
    for i in range(40):  # both lanes stay backlogged for the whole window
        d.add(f"h{i}", prompt(i, 100), SamplingParams(max_tokens=1), lane="heavy")
        d.add(f"l{i}", prompt(100 + i, 100), SamplingParams(max_tokens=1), lane="light")
    for _ in range(30):
        d.step()
    window = d.records()[2:]
    tokens = {lane: sum(r.decisions.tokens_by_lane.get(lane, 0) for r in window)
              for lane in ("heavy", "light")}
    assert all(r.waiting_by_lane["heavy"] and r.waiting_by_lane["light"] for r in window)
    assert tokens["heavy"] / sum(tokens.values()) == pytest.approx(0.75, abs=0.05)
    d.run()


def test_lane_joining_late_gets_no_credit_from_a_decode_only_lane():
    # A batch lane with one long decode keeps a low virtual time; a lane that starts
    # queueing later must not use that to starve a lane that has been queueing all along.
    lanes = (LaneConfig("interactive"), LaneConfig("long_context"), LaneConfig("batch"))
    live = live_config(lanes, max_num_seqs=64, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live, num_kv_blocks=1024)
    d = Driver(engine)
    d.add("decoder", prompt(0, 10), SamplingParams(max_tokens=300, ignore_eos=True),
          lane="batch")
    for i in range(120):
        d.add(f"i{i}", prompt(1 + i, 100), SamplingParams(max_tokens=1))
    for _ in range(40):
        d.step()
    for i in range(40):
        d.add(f"l{i}", prompt(500 + i, 100), SamplingParams(max_tokens=1), lane="long_context")
    for _ in range(20):
        d.step()
    window = d.records()[-20:]
    assert all(r.waiting_by_lane["interactive"] for r in window)
    tokens = _prefill_tokens(d, window, key=lambda rid: rid[0])
    assert tokens["i"] / (tokens["i"] + tokens["l"]) == pytest.approx(0.5, abs=0.1)
    d.run()


def _tenant_shares(first_tenants: list[str]) -> float:
    """Share of tenant x over a window in a tenant-fair lane where x and y are backlogged."""
    lanes = (LaneConfig("shared", tenant_fair_share=True),)
    live = live_config(lanes, max_num_seqs=32, max_num_batched_tokens=128,
                       prefill_chunk_size=128)
    engine, _ = make_engine(live, num_kv_blocks=1024)
    d = Driver(engine)
    n = 0
    for tenant in first_tenants:  # a warm-up phase with only these tenants
        for _ in range(10):
            d.add(f"{tenant}{n}", prompt(n, 100), SamplingParams(max_tokens=1), tenant=tenant)
            n += 1
    d.run()
    for tenant in ("y", "x") * 30:  # y queues first
        d.add(f"{tenant}{n}", prompt(n, 100), SamplingParams(max_tokens=1), tenant=tenant)
        n += 1
    start = len(d.records())
    for _ in range(20):
        d.step()
    tokens = _prefill_tokens(d, d.records()[start:], key=lambda rid: rid[0])
    d.run()
    return tokens["x"] / (tokens["x"] + tokens["y"])


def test_tenants_share_a_fair_lane_equally():
    assert _tenant_shares([]) == pytest.approx(0.5, abs=0.1)


def test_tenant_that_ran_alone_before_is_not_starved_later():
    # x ran alone earlier; y was idle then. Idling must not earn y credit over x.
    assert _tenant_shares(["x"]) == pytest.approx(0.5, abs=0.1)


def test_requests_without_a_lane_are_routed_and_unknown_lanes_rejected():
    lanes = (LaneConfig("interactive"), LaneConfig("long_context"), LaneConfig("batch"))
    engine, _ = make_engine(live_config(lanes, long_context_threshold=100))
    d = Driver(engine)
    assert d.add("short", prompt(1, 99)).lane == "interactive"
    assert d.add("long", prompt(2, 100)).lane == "long_context"
    unknown = d.add("lost", prompt(3, 10), lane="nope")
    assert (unknown.accepted, unknown.reason) == (False, "unknown_lane")
    empty = d.add("empty", [])
    assert (empty.accepted, empty.reason) == (False, "empty_prompt")
    d.run()
    assert d.finished_records()["long"].lane == "long_context"


def test_a_tenants_lane_comes_before_routing_by_length():
    """tenant_lanes names the lane for everything its tenant sends, long prompts included;
    other tenants' long prompts still go to the long-context lane."""
    lanes = (LaneConfig("interactive"), LaneConfig("long_context"), LaneConfig("batch"))
    engine, _ = make_engine(live_config(lanes, long_context_threshold=100,
                                        tenant_lanes={"acme": "batch"}))
    d = Driver(engine)
    assert d.add("acme-long", prompt(1, 150), tenant="acme").lane == "batch"
    assert d.add("acme-short", prompt(2, 10), tenant="acme").lane == "batch"
    assert d.add("other-long", prompt(3, 150), tenant="other").lane == "long_context"
    d.run()
