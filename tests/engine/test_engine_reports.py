"""What the engine reports (engine/reports.py, engine/records.py): a step's phase times, the
gauges' waiting reasons, and each request's record at its end, on the simulated executor."""

from __future__ import annotations

import pytest
from engine_helpers import live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.config.slo import LaneSLO
from engine.reports import step_record
from engine.request import SamplingParams

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def test_a_step_record_times_each_phase_between_its_own_marks():
    """schedule from the step's start to the schedule mark, execute from there to the
    execute mark, update from there to the end: the three add up to the step."""
    engine, clock = make_engine()
    engine.add_request("a", prompt(1, 20), PARAMS)
    run = engine.run_step(clock())
    run.marks = (10.5, 12.0, 12.25)  # perf_counter after schedule, execute, update
    rec = step_record(run, engine.scheduler, clock(), 10.0, (0, 0))
    assert (rec.schedule_s, rec.execute_s, rec.update_s) == (0.5, 1.5, 0.25)
    assert rec.duration_s == 2.25


def test_gauges_count_every_lanes_waiting_requests_under_their_reason():
    live = live_config((LaneConfig("a"), LaneConfig("b")))
    engine, _ = make_engine(live)
    for i, lane in enumerate(("a", "a", "b")):
        assert engine.add_request(f"r{i}", prompt(i, 20), PARAMS, lane=lane).accepted
    gauges = engine.gauges()
    assert gauges.waiting_by_lane == {"a": 2, "b": 1}
    assert gauges.waiting_by_reason == {"not_yet_scheduled": 3}  # both lanes' requests


def test_a_record_carries_whether_its_client_resent_it():
    engine, _ = make_engine()
    engine.add_request("again", prompt(1, 20), PARAMS, resent=True)
    engine.add_request("fresh", prompt(2, 20), PARAMS)
    records = {r.request_id: r for out in engine.run_until_done() for r in out.finished}
    assert records["again"].resent and not records["fresh"].resent


def test_tpot_is_the_mean_gap_between_output_tokens():
    """(last - first) / (n - 1): four tokens one 0.25 s step apart are 0.25 s a token."""
    engine, _ = make_engine(step_cost_s=0.25)  # one token a step
    engine.add_request("a", prompt(1, 20), PARAMS)
    (record,) = [r for out in engine.run_until_done() for r in out.finished]
    assert record.num_output_tokens == 4 and len(record.token_times) == 4
    assert record.tpot_s == pytest.approx(0.25)
    assert record.decode_time_s == pytest.approx(0.75)


def test_gauges_count_waiting_requests_under_the_reason_the_last_step_gave():
    """After a step in which the lane's one running slot held the queue back, the gauges
    say so, not that the requests were never looked at."""
    engine, _ = make_engine(live_config((LaneConfig("a", max_running=1),)))
    for i in range(3):
        engine.add_request(f"r{i}", prompt(i, 20), PARAMS)
    engine.step()
    gauges = engine.gauges()
    assert gauges.waiting_by_lane == {"a": 2}
    assert "not_yet_scheduled" not in gauges.waiting_by_reason
    assert sum(gauges.waiting_by_reason.values()) == 2


def test_stats_queue_slo_share_is_the_worst_lanes():
    """A server whose one lane's queue has used its whole TTFT target reports that share,
    whatever an idle lane beside it shows (what the fleet's autoscaler reads)."""
    slo = LaneSLO(ttft_s=1.0)
    live = live_config((LaneConfig("a", max_running=1, slo=slo), LaneConfig("b", slo=slo)))
    engine, clock = make_engine(live)
    engine.add_request("run", prompt(1, 20), SamplingParams(max_tokens=100, ignore_eos=True),
                       lane="a")
    engine.step()
    engine.add_request("queued", prompt(2, 20), PARAMS, lane="a")
    clock.advance(0.5)
    assert engine.stats()["queue_slo_share"] == pytest.approx(0.5)


def test_stats_count_the_running_and_the_queued_apart():
    """What the server's health and load figures read: one request runs, two wait."""
    engine, _ = make_engine(live_config((LaneConfig("a", max_running=1),)))
    for i in range(3):
        engine.add_request(f"r{i}", prompt(i, 20), PARAMS)
    engine.step()
    stats = engine.stats()
    assert (stats["running"], stats["waiting"]) == (1, 2)


def test_a_record_carries_when_its_request_was_admitted():
    """Arrival, admission, first schedule: the trace splits a request's wait by them."""
    engine, clock = make_engine()
    arrived = clock() - 2.0
    engine.add_request("a", prompt(1, 20), PARAMS, arrival_time=arrived)
    admitted = clock()
    (record,) = [r for out in engine.run_until_done() for r in out.finished]
    assert (record.arrival_time, record.admitted_time) == (arrived, admitted)
