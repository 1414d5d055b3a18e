"""A canary's goodput counts a request good only within its lane's SLO
(control/fleet/replica_window.py): the same requests are good under loose targets and not
under tight ones; one that finished past its own deadline is not good."""

from __future__ import annotations

from types import SimpleNamespace

from control.fleet.replica_window import RequestWindow
from engine.config import EngineConfig, LaneConfig, LaneSLO, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor


def ended_under(slo: LaneSLO) -> dict:
    clock = FakeClock(1000.0)
    executor = SimulatedExecutor(clock=clock, step_cost_s=0.05)
    live = LiveConfig(lanes=(LaneConfig("chat", slo=slo),), default_lane="chat",
                      long_context_lane=None, max_num_seqs=16)
    engine = Engine(EngineConfig(StaticConfig(num_kv_blocks=64), live), executor, clock=clock)
    for i in range(4):
        engine.add_request(f"r{i}", [5 + i] * 8, SamplingParams(max_tokens=3, ignore_eos=True))
    window = RequestWindow()
    while engine.has_unfinished_requests():
        window.add(engine.step(), 1, engine.live_config)
    return window.since(0.0)


def test_good_means_within_the_lanes_slo():
    loose = ended_under(LaneSLO(ttft_s=10.0, tpot_s=1.0))
    assert loose["outcomes"] == {"finished": 4} and loose["good"] == 4
    tight = ended_under(LaneSLO(ttft_s=0.01))  # every first token takes a 50 ms step
    assert tight["outcomes"] == {"finished": 4} and tight["good"] == 0
    assert ended_under(LaneSLO())["good"] == 4  # no targets: finished is good


def test_a_request_that_finished_past_its_deadline_is_not_good():
    def ended(finished_time: float, deadline: float | None) -> SimpleNamespace:
        return SimpleNamespace(finished_time=finished_time, outcome="finished",
                               deadline=deadline, lane="chat", ttft_s=0.1, tpot_s=0.01)

    window = RequestWindow()
    window.add(SimpleNamespace(finished=[ended(100.0, 101.0), ended(100.0, 99.5),
                                         ended(100.0, None)], admissions=[]), 1)
    got = window.since(0.0)
    assert got["outcomes"] == {"finished": 3} and got["good"] == 2
