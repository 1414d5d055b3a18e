"""The scheduler's own invariants fail loudly, with the numbers, even under `python -O`:
work over the step's budget, sampled tokens that do not match the sample rows, a request
ended twice, a start out of its lane's order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import Driver, make_engine, prompt

from engine.config import LaneConfig, LiveConfig
from engine.errors import SchedulerInvariantError
from engine.lanes.queues import LaneQueue
from engine.request import Request, RequestStatus, SamplingParams
from engine.scheduling.budget import StepPlan


def test_a_step_over_its_budget_is_an_error_naming_the_numbers():
    budget = StepPlan.new(7, LiveConfig(max_num_seqs=4, max_num_batched_tokens=16)).budget
    budget.take(17)
    with pytest.raises(SchedulerInvariantError,
                       match=r"step 7 scheduled 17 tokens .* max_num_batched_tokens=16"):
        budget.check(7, 17, 1)
    budget.give_back(17)
    budget.take(3, 5)
    with pytest.raises(SchedulerInvariantError, match=r"5 sequences.*max_num_seqs=4"):
        budget.check(8, 3, 5)


def test_the_budget_check_survives_python_O():
    code = ("from engine.config import LiveConfig\n"
            "from engine.errors import SchedulerInvariantError\n"
            "from engine.scheduling.budget import StepPlan\n"
            "b = StepPlan.new(1, LiveConfig(max_num_seqs=4, max_num_batched_tokens=16)).budget\n"
            "b.take(17)\n"
            "try:\n    b.check(1, 17, 1)\nexcept SchedulerInvariantError:\n    print('caught')\n")
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == "caught"


def test_an_executor_returning_too_few_tokens_is_an_error_naming_the_counts():
    engine, _ = make_engine()
    d = Driver(engine)
    d.add("a", prompt(1, 8))
    d.add("b", prompt(2, 8))
    d.step()  # both decoding from now on
    engine.executor.execute = lambda out: [5]  # one token for two sample rows
    failure = engine.step().failure  # contained (engine/fault_isolation.py): the step's
    assert isinstance(failure.error, SchedulerInvariantError)  # requests end, it goes on
    assert "1 sampled tokens for 2 sample rows" in str(failure.error)
    assert failure.request_ids == ("a", "b") and failure.phase == "update"


def test_ending_a_request_twice_is_an_error():
    engine, _ = make_engine()
    Driver(engine).add("a", prompt(1, 8))
    req = engine.get_request("a")
    engine.scheduler.finish(req, RequestStatus.CANCELLED, 1.0)
    with pytest.raises(SchedulerInvariantError, match="'a', CANCELLED.*CANCELLED request"):
        engine.scheduler.finish(req, RequestStatus.CANCELLED, 2.0)
    with pytest.raises(SchedulerInvariantError, match="finished status"):
        engine.scheduler.finish(Request("b", [5], SamplingParams(), 0.0),
                                RequestStatus.PREEMPTED, 2.0)


def test_starting_a_request_that_is_not_its_lanes_next_is_an_error():
    lane = LaneQueue(LaneConfig("interactive"))
    first, second = (Request(rid, [5, 6], SamplingParams(), t) for rid, t in (("a", 1.0),
                                                                               ("b", 2.0)))
    lane.push(first)
    lane.push(second)
    assert lane.peek() is first
    with pytest.raises(SchedulerInvariantError, match="pop\\('b'\\) must follow peek\\(\\)"):
        lane.pop(second)
    lane.pop(first)
    assert (lane.num_waiting, lane.peek()) == (1, second)
