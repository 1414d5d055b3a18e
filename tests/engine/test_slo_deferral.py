"""SLO deferral (slo_unreachable: defer; engine/lanes/admission.py): a request
the queue keeps from its lane's TTFT target is admitted behind every request that can still
meet its own, shorter prompts first, and refused only when so queued it would not start
within its queue timeout, by the queue as it stands or by the device time deferred
requests have lately got. On the simulated engine whose steps cost what the law says, it
meets as many SLOs as shedding and finishes more requests (bench/RESULTS.md has the real
engine's figures). A client's resend is deferred under shed and defer alike."""

from __future__ import annotations

import pytest
from engine_helpers import Driver, live_config, make_engine, prompt
from fixtures.law_engine import law_cost, timed_engine
from test_goodput_policy import live as shed_live
from test_goodput_policy import met, run_burst

from engine.config import LaneConfig
from engine.lanes.admission import SLO_DEFERRED
from engine.lanes.queues import LaneQueue
from engine.request import Request, SamplingParams
from engine.scheduling.slo_estimates import deferred_start_s, predicted_ttft_s
from engine.scheduling.spare_rate import MIN_WAIT_S, TAU_S, SpareRate


def live(**changes):
    return shed_live(**({"slo_unreachable": "defer"} | changes))


def queued(policy: str, *specs: tuple[str, bool, int, int]) -> list[str]:
    """Push (id, deferred, prompt tokens, priority) in order; the ids in start order."""
    lane = LaneQueue(LaneConfig("chat", policy=policy))
    for i, (rid, deferred, tokens, priority) in enumerate(specs):
        req = Request(rid, list(range(1, tokens + 1)), SamplingParams(), float(i),
                      lane="chat", priority=priority)
        req.slo_deferred = deferred
        lane.push(req)
    order = []
    while (head := lane.peek()) is not None:
        lane.pop(head)
        order.append(head.request_id)
    return order


@pytest.mark.parametrize("policy", ["fifo", "deadline"])
def test_deferred_requests_start_after_the_others_and_the_shortest_first(policy):
    order = queued(policy, ("late-long", True, 50, 0), ("a", False, 90, 0),
                   ("late-short", True, 5, 0), ("b", False, 10, 0))
    assert order == ["a", "b", "late-short", "late-long"]


def test_priority_still_orders_the_deferred_before_their_length():
    order = queued("priority", ("late-short-p1", True, 5, 1), ("late-long-p0", True, 50, 0),
                   ("on-time-p9", False, 90, 9))
    assert order == ["on-time-p9", "late-long-p0", "late-short-p1"]


def burst_decisions(**changes) -> tuple[list, list]:
    """30 prompts of 600 tokens at once: (admission decisions, request records)."""
    engine, _ = timed_engine(live(**changes))
    decisions = [engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4,
                                                                          ignore_eos=True))
                 for i in range(30)]
    records = []
    while engine.has_unfinished_requests():
        records += engine.step().finished
    return decisions, records


def test_a_burst_defers_what_would_miss_its_ttft_and_serves_it_after_the_rest():
    decisions, records = burst_decisions()
    deferred = {d.request_id for d in decisions if d.reason == SLO_DEFERRED}
    on_time = {d.request_id for d in decisions if d.accepted} - deferred
    assert deferred and on_time and all(d.accepted for d in decisions)
    for d in decisions:
        if d.request_id in deferred:
            assert "slo.ttft_s" in d.message and "queue timeout" in d.message
    started = {r.request_id: r.first_scheduled_time for r in records}
    assert max(started[i] for i in on_time) <= min(started[i] for i in deferred)
    assert {r.outcome for r in records} == {"finished"}  # nothing lost: all 30 served


def test_deferral_meets_as_many_slos_as_shedding_and_finishes_more():
    deferred, _, _ = run_burst(live(), n=30)
    shed, refused, _ = run_burst(live(slo_unreachable="shed"), n=30)
    assert refused  # shedding refused some of this burst
    assert met(deferred) >= met(shed)
    finished = [sum(r.outcome == "finished" for r in rs) for rs in (deferred, shed)]
    assert finished[0] > finished[1]


def test_a_request_that_would_not_start_within_its_queue_timeout_is_refused():
    """With a 4 s queue timeout the burst's tail cannot start in time even deferred."""
    decisions, records = burst_decisions(queue_timeout_ms=4000)
    refused = [d for d in decisions if not d.accepted]
    assert refused and {d.reason for d in refused} == {"slo_unreachable"}
    for d in refused:
        assert "queue timeout (4s)" in d.message and d.retry_after_s >= 1.0
        assert d.estimated_wait_s > 4.0  # the estimated start it was refused for
    assert any(d.reason == SLO_DEFERRED for d in decisions)  # others were deferred


def test_a_lane_whose_ttft_is_met_defers_nothing():
    engine, _ = timed_engine(live())
    for i in range(3):
        d = engine.add_request(f"r{i}", prompt(i, 100), SamplingParams(max_tokens=4))
        assert d.accepted and d.reason is None


def test_slo_unreachable_takes_only_its_three_values():
    with pytest.raises(ValueError, match="slo_unreachable.*one of defer, shed, serve"):
        live(slo_unreachable="drop").validate_fields()


def test_the_spare_rate_is_unknown_until_deferred_requests_have_waited_a_while():
    rate = SpareRate()
    rate.observe(0.0, False, 0.0)
    rate.observe(3.0, True, 0.6)  # 3 s of waiting: under MIN_WAIT_S
    assert rate.per_s() is None
    rate.observe(3.0 + MIN_WAIT_S, True, 0.4)
    assert rate.per_s() == pytest.approx(1.0 / (3.0 + MIN_WAIT_S), rel=0.2)
    rate.observe(3.0 + MIN_WAIT_S + 10 * TAU_S, False, 0.0)  # an old overload fades
    assert rate.per_s() is None


def test_the_spare_rate_falls_while_deferred_requests_wait_and_none_starts():
    """Deferred prompts got 5 s of device time over 10 s of waiting; then a minute of
    waiting with nothing started: both sums fade alike, so the rate falls to a small part
    of what it was. (Work that never faded would keep crediting that old burst, and
    admission would defer requests that then time out in the queue.)"""
    rate = SpareRate()
    rate.observe(0.0, False, 0.0)
    rate.observe(10.0, True, 5.0)
    before = rate.per_s()
    assert before == pytest.approx(0.5)
    for second in range(11, 71):
        rate.observe(float(second), True, 0.0)
    assert rate.per_s() < 0.1 * before


def test_deferred_requests_that_got_no_device_time_lately_mean_the_next_is_refused():
    """The queue alone would let the request start in time; what deferred requests got
    lately (nothing, over 10 s of waiting) says it would not."""
    engine, clock = timed_engine(live())
    for i in range(30):
        engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4))
    state = engine.scheduler
    model_says = deferred_start_s(state, Request("x", prompt(99, 600), SamplingParams(),
                                                 clock(), lane="chat"), clock())
    assert model_says is not None and model_says < 30.0  # the queue timeout
    assert predicted_ttft_s(state, Request("y", prompt(99, 600), SamplingParams(), clock(),
                                           lane="chat"), clock()) > 3.0  # so: deferred
    state.spare_rate.observe(clock() - 10.0, False, 0.0)
    state.spare_rate.observe(clock(), True, 0.0)
    d = engine.add_request("x", prompt(99, 600), SamplingParams(max_tokens=4))
    assert not d.accepted and d.reason == "slo_unreachable" and "queue timeout" in d.message


def test_the_device_time_deferred_requests_get_counts_from_the_requests_arrival():
    """Deferred requests lately got 0.66 s of prompt work a second: behind this queue one
    would start about 25 s after it arrives, within the 30 s queue timeout. One that
    arrived 8 s before the engine saw it (tokenizing, a proxy's queue) has 8 s less left:
    refused with a retry-after, rather than admitted to time out in the queue."""
    engine, clock = timed_engine(live())
    for i in range(30):
        engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4))
    state = engine.scheduler
    state.spare_rate.observe(clock() - 10.0, False, 0.0)
    state.spare_rate.observe(clock(), True, 6.6)
    now = clock()
    fresh = deferred_start_s(state, Request("x", prompt(99, 600), SamplingParams(), now,
                                            lane="chat"), now)
    late = deferred_start_s(state, Request("y", prompt(99, 600), SamplingParams(), now - 8.0,
                                           lane="chat"), now)
    assert 20.0 < fresh < 30.0 and late == pytest.approx(fresh + 8.0)
    d = engine.add_request("y", prompt(99, 600), SamplingParams(max_tokens=4),
                           arrival_time=now - 8.0)
    assert not d.accepted and d.reason == "slo_unreachable" and "queue timeout" in d.message


def deferred_prompt_under_way():
    """The burst, stepped until a deferred prompt is under way with nothing ahead of it:
    (engine, the executor's batches so far, that request)."""
    engine, _ = timed_engine(live())
    outs = []
    engine.executor.cost_model = lambda out: outs.append(out) or law_cost(out)
    for i in range(30):
        engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4))
    running, lane = engine.scheduler.running, engine.scheduler.lanes["chat"]

    def deferred_under_way() -> Request | None:
        busy = lane.num_waiting > lane.num_deferred or any(
            not r.slo_deferred and r.num_computed_tokens < r.num_prompt_tokens
            for r in running)
        return None if busy else next((r for r in running if r.slo_deferred
                                       and 0 < r.num_computed_tokens < r.num_prompt_tokens),
                                      None)

    while (late := deferred_under_way()) is None:
        assert engine.has_unfinished_requests()
        engine.step()
    return engine, outs, late


def test_a_deferred_prompt_under_way_runs_after_a_request_that_can_meet_its_ttft():
    """Steps until a deferred prompt is under way with nothing ahead of it, then a short
    request that can still meet its TTFT arrives: in the next step it gets its chunk first
    and the deferred prompt only what is left; without that rule the running prompt would
    take the step first."""
    engine, outs, late = deferred_prompt_under_way()
    d = engine.add_request("new", prompt(77, 100), SamplingParams(max_tokens=4))
    assert d.accepted and d.reason is None  # it can meet its target
    engine.step()
    chunks = [(c.request.request_id, c.num_tokens) for c in outs[-1].prefills]
    assert chunks[0] == ("new", 100), chunks
    assert late.status.name == "RUNNING"  # it yields the step's head, it is not dropped


@pytest.mark.parametrize("policy", ["shed", "defer"])
def test_a_resent_request_is_deferred_behind_the_fresh_ones_whatever_the_queue(policy):
    """Its user has waited since a refused first send: it starts after the requests that
    can still meet their target, even where the queue would let it meet its own."""
    engine, _ = timed_engine(live(slo_unreachable=policy))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    resent = engine.add_request("again", prompt(0, 600), params, resent=True)
    fresh = [engine.add_request(f"r{i}", prompt(i + 1, 600), params) for i in range(3)]
    assert resent.accepted and resent.reason == SLO_DEFERRED
    assert "sent again after a refusal" in resent.message and "queue timeout" in resent.message
    assert all(d.accepted and d.reason is None for d in fresh)  # an idle queue: on time
    records = []
    while engine.has_unfinished_requests():
        records += engine.step().finished
    started = {r.request_id: r.first_scheduled_time for r in records}
    assert max(started[f"r{i}"] for i in range(3)) <= started["again"]
    assert {r.outcome for r in records} == {"finished"}


@pytest.mark.parametrize("changes", [{"slo_unreachable": "serve"}, {"step_policy": "fixed"}])
def test_a_resent_request_is_served_in_its_place_when_nothing_is_deferred(changes):
    """`serve` defers nothing; with steps held to the target there is no model to
    defer by (nor to refuse by: a resend must never be refused where a first send is not)."""
    engine, _ = timed_engine(live(**changes))
    decision = engine.add_request("again", prompt(0, 600), SamplingParams(max_tokens=4),
                                  resent=True)
    assert decision.accepted and decision.reason is None


def test_a_deferred_prompts_chunks_count_in_its_lanes_tokens():
    """A deferred prompt's chunks run after the step's other work, and are its lane's
    tokens all the same: the step's tokens by lane add up to what it ran (the fair share
    and the per-lane token counters read them)."""
    engine, _ = timed_engine(live())
    for i in range(30):
        engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4))
    steps = 0
    while engine.has_unfinished_requests():
        rec = engine.step().record
        if rec is not None:
            steps += 1
            assert sum(rec.decisions.tokens_by_lane.values()) == rec.tokens_used, rec.step_id
    assert steps


def test_a_deferred_prompt_that_arrived_a_queue_timeout_ago_runs_in_its_place():
    """Its wait counts from its arrival at the server, not its admission: one that has
    waited its lane's queue timeout since then takes the step's head like any running
    prompt, ahead of a newcomer."""
    engine, outs, late = deferred_prompt_under_way()
    state = engine.scheduler
    # it reached the server a queue timeout before it was admitted (a proxy's queue)
    late.arrival_time = late.admitted_time - state.lanes["chat"].queue_timeout_s(state.live)
    engine.add_request("new", prompt(77, 100), SamplingParams(max_tokens=4))
    engine.step()
    assert outs[-1].prefills[0].request is late


def test_a_deferred_prompt_preempted_in_a_step_runs_nothing_in_it():
    """A deferred prompt's chunk waits for the end of the step; when a decode's new block
    preempted it meanwhile, it is queued again: no chunk, and no block held while queued."""
    live = live_config((LaneConfig("only"),), max_num_seqs=2, prefill_chunk_size=16)
    engine, _ = make_engine(live, num_kv_blocks=3, max_model_len=64)
    d = Driver(engine)
    d.add("late", prompt(1, 40), SamplingParams(max_tokens=1, ignore_eos=True), priority=1)
    engine.get_request("late").slo_deferred = True  # as admission marks one it defers
    d.step()
    d.add("a", prompt(2, 16), SamplingParams(max_tokens=8, ignore_eos=True))
    d.step()  # a starts, late takes its second chunk: the pool's three blocks are used
    late = engine.get_request("late")
    out = d.step()  # a's first decode needs a block: late, the lower priority, gives it
    assert late.status.name == "PREEMPTED"
    assert [rid for rid, _, _ in out.record.scheduled] == ["a"]
    assert late.block_ids == [] and late.num_computed_tokens == 0
    d.run()
