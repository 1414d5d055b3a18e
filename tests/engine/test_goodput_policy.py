"""Goodput-aware step sizing and SLO shedding (engine/scheduling/goodput.py): the model's
algebra, each of its three choices, the budgets a grown step may take, and on the simulated
engine whose steps cost what the law says: more requests meet their SLO than with steps held
to the target, and a request the queue keeps from its TTFT is refused at arrival (shed,
the default). Deferral (slo_unreachable: defer) is tested in test_slo_deferral.py."""

from __future__ import annotations

import math

import pytest
from engine_helpers import prompt
from fixtures.law_engine import LAW, timed_engine

from engine.config import LaneConfig, LaneSLO, LiveConfig
from engine.lanes.queues import LaneSet
from engine.request import Request, SamplingParams
from engine.scheduling.goodput import MAX_GROWTH, QueueModel, grown_budgets
from engine.scheduling.step_time import HEADROOM

BASE = 0.25
SLO = LaneSLO(ttft_s=3.0, tpot_s=1.0)


def live(**changes) -> LiveConfig:
    settings = {"lanes": (LaneConfig("chat", slo=SLO), LaneConfig("bulk")),
                "default_lane": "chat", "long_context_lane": None, "max_num_seqs": 64,
                "prefill_chunk_size": 128, "max_num_batched_tokens": 192}
    return LiveConfig(**(settings | changes))


def model(running: list[Request] = (), cfg: LiveConfig | None = None) -> QueueModel:
    cfg = cfg or live()
    return QueueModel.of(LAW, 1.0, BASE, list(running), cfg, LaneSet(cfg.lanes))


def test_bigger_steps_clear_a_queue_faster_and_step_for_rate_inverts_rate():
    m = model()
    rates = [m.rate(s) for s in (0.25, 0.5, 1.0, 2.0)]
    assert rates == sorted(rates) and rates[0] > 0
    for step in (0.3, 0.7, 1.9):
        assert m.step_for_rate(m.rate(step)) == pytest.approx(step)
    assert m.step_for_rate(1.0) == math.inf  # all of every second on prompts: no step


def test_an_empty_or_easy_queue_keeps_the_base_target():
    m = model()
    assert m.choose([], 0.0).reason == "target"
    easy = [(10.0, 0.05), (12.0, 0.05)]
    choice = m.choose(easy, 0.0)
    assert (choice.seconds, choice.growth, choice.reason) == (BASE, 1.0, "target")


def test_a_queue_the_base_step_misses_but_a_bigger_one_meets_grows_the_step():
    m = model()
    work = 0.9 * m.rate(1.0) * 2.0  # meetable within 2 s at a 1 s step, not at the base
    assert work / 2.0 > m.rate(BASE)
    choice = m.choose([(2.0, work)], 0.0)
    assert choice.reason == "grow_for_slo"
    assert BASE < choice.seconds <= m.cap_s
    assert m.rate(choice.seconds) * 2.0 >= work  # the grown step meets it


def test_a_queue_past_saving_grows_the_step_to_the_largest_allowed():
    m = model()
    choice = m.choose([(1.0, 50.0)], 0.0)  # 50 law-seconds in 1 s: no step does that
    assert choice.reason == "grow_for_throughput" and choice.seconds == m.cap_s
    assert m.cap_s == MAX_GROWTH * BASE  # nothing runs: no stream's TPOT bounds it


def test_the_tightest_running_tpot_target_bounds_the_step():
    cfg = live()
    stream = Request("s", prompt(1, 10), SamplingParams(max_tokens=5), 0.0, lane="chat")
    stream.num_computed_tokens = 10
    m = model([stream], cfg)
    assert m.cap_s == SLO.tpot_s
    assert m.choose([(1.0, 50.0)], 0.0).seconds == SLO.tpot_s
    # decodes cost the rate: the running set's overhead is in it
    assert m.overhead_s == pytest.approx(LAW.fixed_s + LAW.decode_s(10))


def run_burst(cfg: LiveConfig, n: int = 12, length: int = 600) -> tuple[list, list, list]:
    """`n` prompts at once; (records, rejections, step records)."""
    engine, _ = timed_engine(cfg)
    rejected = []
    for i in range(n):
        d = engine.add_request(f"r{i}", prompt(i, length),
                               SamplingParams(max_tokens=4, ignore_eos=True))
        if not d.accepted:
            rejected.append(d)
    records, steps = [], []
    while engine.has_unfinished_requests():
        out = engine.step()
        records += out.finished
        if out.record is not None and out.record.tokens_used:
            steps.append(out.record)
    return records, rejected, steps


def met(records) -> int:
    return sum(r.outcome == "finished" and SLO.met(r.ttft_s, r.tpot_s) for r in records)


def test_a_burst_meets_more_slos_with_grown_steps_than_held_to_the_target():
    fixed, _, fixed_steps = run_burst(live(step_policy="fixed", slo_unreachable="serve"), 30, 200)
    grown, _, grown_steps = run_burst(live(slo_unreachable="serve"), 30, 200)
    assert met(grown) > met(fixed)  # 15 and 12 when written
    assert {s.step_reason for s in fixed_steps} == {"fixed"}
    assert {s.target_step_s for s in fixed_steps} == {BASE}
    reasons = {s.step_reason for s in grown_steps}
    assert reasons & {"grow_for_slo", "grow_for_throughput"} and "target" in reasons
    grown_budget = max(s.token_budget for s in grown_steps)
    assert grown_budget > 192  # the fitted budget grew with the step
    for s in grown_steps:  # the scheduler's own prediction stays within its target
        assert s.predicted_step_s <= HEADROOM * s.target_step_s + LAW.decode_s(300) * 30


def test_the_operators_budgets_never_grow():
    engine, _ = timed_engine(live(), growable=())
    assert grown_budgets(engine.scheduler, 4.0) == (192, 128)
    engine, _ = timed_engine(live())
    tokens, chunk = grown_budgets(engine.scheduler, 4.0)
    assert (tokens, chunk) == (768, 512)
    assert grown_budgets(engine.scheduler, 1000.0) == (8192, 2048)  # the built-in defaults


def test_a_request_the_queue_keeps_from_its_ttft_is_shed_with_retry_after():
    records, rejected, _ = run_burst(live(), n=30)
    assert rejected and {d.reason for d in rejected} == {"slo_unreachable"}
    for d in rejected:
        assert d.retry_after_s >= 1.0 and d.estimated_wait_s > SLO.ttft_s
        assert "slo.ttft_s" in d.message
    kept, _, _ = run_burst(live(slo_unreachable="serve"), n=30)
    assert met(records) >= met(kept)  # shedding the hopeless never costs goodput here


@pytest.mark.parametrize("changes", [{"slo_unreachable": "serve"}, {"step_policy": "fixed"}])
def test_no_shedding_when_turned_off_or_steps_fixed(changes):
    engine, _ = timed_engine(live(**changes))
    for i in range(30):
        d = engine.add_request(f"r{i}", prompt(i, 600), SamplingParams(max_tokens=4))
        assert d.accepted and d.reason is None  # neither refused nor deferred


def test_a_lane_without_a_ttft_target_and_a_prompt_too_long_alone_are_never_shed():
    engine, _ = timed_engine(live())
    for i in range(30):
        assert engine.add_request(f"b{i}", prompt(i, 600), SamplingParams(max_tokens=4),
                                  lane="bulk").accepted
    engine, _ = timed_engine(live())
    # alone it takes longer than the 3 s target: the queue is not what keeps it from it
    assert LAW.chunk_s(0, 5000) > SLO.ttft_s
    assert engine.add_request("long", prompt(1, 5000), SamplingParams(max_tokens=4)).accepted


def live_with_long_lane(long_ttft: float | None = 30.0, **changes) -> LiveConfig:
    lanes = (LaneConfig("chat", slo=SLO), LaneConfig("long", slo=LaneSLO(ttft_s=long_ttft)),
             LaneConfig("bulk"))
    return live(lanes=lanes, long_context_lane="long", long_context_threshold=8192,
                **changes)


def test_a_prompt_that_misses_the_default_lanes_ttft_alone_goes_to_the_long_lane():
    """5,000 tokens take longer than chat's 3 s alone but well under long's 30 s: routed by
    length it would be chat's (under the 8,192-token threshold), where it would miss anyway
    and hold up every chat request behind it; it goes to the long-context lane."""
    assert LAW.chunk_s(0, 5000) > SLO.ttft_s
    engine, _ = timed_engine(live_with_long_lane())
    assert engine.add_request("long", prompt(1, 5000), SamplingParams(max_tokens=4)).lane \
        == "long"
    assert engine.add_request("short", prompt(2, 300), SamplingParams(max_tokens=4)).lane \
        == "chat"
    # what the request names, what the config maps its tenant to, steps held to the target
    # and a long lane whose own target it misses too: routing as configured
    assert engine.add_request("named", prompt(3, 5000), SamplingParams(max_tokens=4),
                              lane="chat").lane == "chat"
    engine, _ = timed_engine(live_with_long_lane(tenant_lanes={"acme": "chat"}))
    assert engine.add_request("t", prompt(4, 5000), SamplingParams(max_tokens=4),
                              tenant="acme").lane == "chat"
    engine, _ = timed_engine(live_with_long_lane(step_policy="fixed"))
    assert engine.add_request("f", prompt(5, 5000), SamplingParams(max_tokens=4)).lane \
        == "chat"
    engine, _ = timed_engine(live_with_long_lane(long_ttft=3.5))
    assert engine.add_request("m", prompt(6, 5000), SamplingParams(max_tokens=4)).lane \
        == "chat"
