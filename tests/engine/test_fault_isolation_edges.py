"""A failed step at its edges (engine/fault_isolation.py): an odd budget of extra runs, a
part that runs but whose tokens cannot be applied, and the phase a transient fault is
reported in."""

from __future__ import annotations

from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.request import SamplingParams
from engine.sim.faults import Fault, FaultyExecutor

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def _driver(*faults: Fault) -> tuple[Driver, FaultyExecutor]:
    live = live_config((LaneConfig("only"),), max_num_seqs=8, max_num_batched_tokens=512,
                       prefill_chunk_size=256)
    engine, _ = make_engine(live)
    faulty = engine.executor = FaultyExecutor(engine.executor, *faults)
    d = Driver(engine)
    d.allow_step_failures = True
    return d, faulty


def _idle_and_consistent(d: Driver) -> None:
    d.engine.check_integrity()
    assert not d.engine.requests and d.engine.block_manager.num_used == 0


def test_an_odd_budget_of_extra_runs_is_never_exceeded():
    """Three extra runs allow one split (two calls); a second split would be a fourth."""
    d, faulty = _driver(Fault(steps={1}))  # every call of step 1 fails: a lost device
    d.engine.fault_isolation_runs = 3
    for i in range(8):
        d.add(f"r{i}", prompt(i, 20), PARAMS)
    out = d.step()
    assert faulty.calls == 1 + 2
    assert out.failure.request_ids == tuple(f"r{i}" for i in range(8))
    d.run()
    _idle_and_consistent(d)


def test_a_part_whose_tokens_cannot_be_applied_ends_only_its_requests():
    """r3's prefill raises; of the parts that then run, [r0 r1] returns a token update()
    cannot apply: that part ends (its update may have applied part of it), r2 goes on."""
    engine, _ = make_engine(live_config((LaneConfig("only"),), max_num_seqs=8))
    engine.executor = FaultyExecutor(
        engine.executor, Fault(match=lambda r: r.request_id == "r3"),
        Fault(match=lambda r: r.request_id == "r0", mode="corrupt"))
    for i in range(4):
        engine.add_request(f"r{i}", prompt(i, 20), PARAMS)
    out = engine.step()
    engine.check_integrity()
    # in batch order, though r3's part failed (in execute) before r0's update raised
    assert out.failure.request_ids == ("r0", "r1", "r3")
    assert out.failure.phase == "execute" and out.failure.num_succeeded == 1
    assert {r.request_id: r.finish_detail for r in out.finished} == {
        "r0": "step failed: update raised InjectedFault",
        "r1": "step failed: update raised InjectedFault",
        "r3": "step failed: execute raised InjectedFault"}
    assert [(dl.request_id, dl.finish_reason) for dl in out.deltas if dl.finished] == [
        ("r0", "error"), ("r1", "error"), ("r3", "error")]
    assert [r.request_id for r in out.rows] == ["r2"]
    engine.executor.clear()
    finished = [r for o in engine.run_until_done() for r in o.finished]
    assert [(r.request_id, r.finish_reason, r.num_output_tokens) for r in finished] == [
        ("r2", "length", 4)]
    engine.check_integrity()
    assert not engine.requests and engine.block_manager.num_used == 0


def test_a_transient_fault_is_reported_in_the_phase_that_raised():
    """The first call of step 1 fails and every retry runs: nothing ends, and the failure
    is the executor's (execute), not update()'s."""
    d, _ = _driver(Fault(steps={1}, times=1))
    for i in range(2):
        d.add(f"r{i}", prompt(i, 20), PARAMS)
    out = d.step()
    assert out.failure.request_ids == () and out.failure.num_succeeded == 2
    assert out.failure.phase == "execute"
    assert out.failure.detail == "step failed: execute raised InjectedFault"
    d.run()
    _idle_and_consistent(d)

