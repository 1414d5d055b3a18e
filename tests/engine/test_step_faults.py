"""A step that fails (issue 17, item 9): only the requests of the failing part of the
batch end, with ERROR and their blocks freed; the others go on with the tokens an
undisturbed run gives; the engine's state stays consistent (`check_integrity`)."""

from __future__ import annotations

from engine_helpers import Driver, live_config, make_engine, prompt

from engine.config import LaneConfig
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import RequestStatus, SamplingParams
from engine.sim.faults import Fault, FaultyExecutor

ONE_LANE = (LaneConfig("interactive"),)
EXECUTE_FAILED = "step failed: execute raised InjectedFault"


def _driver(**engine_kwargs) -> tuple[Driver, FaultyExecutor]:
    live = live_config(ONE_LANE, max_num_seqs=8, max_num_batched_tokens=512,
                       prefill_chunk_size=256)
    engine, _ = make_engine(live, **engine_kwargs)
    faulty = engine.executor = FaultyExecutor(engine.executor)
    d = Driver(engine)
    d.allow_step_failures = True
    return d, faulty


def _idle_and_consistent(d: Driver) -> None:
    d.engine.check_integrity()
    assert not d.engine.requests
    assert d.engine.block_manager.num_used == 0  # every block back: none leaked


def test_a_failing_prefill_ends_only_its_request():
    # An out-of-memory on a large prefill: the executor raises whenever "huge" runs.
    d, faulty = _driver()
    faulty.add(Fault(match=lambda r: r.request_id == "huge", prefill_only=True))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i in range(5):
        d.add(f"r{i}", prompt(i, 20), params)
    d.step()
    d.step()
    d.add("huge", prompt(9, 200), params)
    out = d.step()  # five decodes and the huge prefill in one batch
    assert out.failure is not None
    assert out.failure.request_ids == ("huge",)
    assert out.failure.num_succeeded == 5 and out.failure.phase == "execute"
    assert [delta.new_token_ids for delta in out.deltas if delta.request_id != "huge"] == [
        [d.logs[f"r{i}"].tokens[-1]] for i in range(5)]  # the others got this step's token
    d.run()
    records = d.finished_records()
    assert records["huge"].finish_reason == "error"
    assert records["huge"].finish_detail == EXECUTE_FAILED
    assert records["huge"].status == RequestStatus.ERROR.name
    assert all(records[f"r{i}"].finish_reason == "length" for i in range(5))
    d.check_all_finished()  # the others' tokens are those of an undisturbed run
    _idle_and_consistent(d)


def test_a_lost_device_ends_the_batch_and_spares_the_queued_and_the_preempted():
    # Three one-block requests in a four-block pool: step 2's decodes need a block each,
    # so the latest arrival (r3) is preempted; then every executor call of step 2 fails.
    live = live_config(ONE_LANE, max_num_seqs=4, prefill_chunk_size=64)
    engine, _ = make_engine(live, num_kv_blocks=4, max_model_len=64)
    faulty = engine.executor = FaultyExecutor(engine.executor, Fault(steps={2}))
    d = Driver(engine)
    d.allow_step_failures = True
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for i in (1, 2, 3):
        d.add(f"r{i}", prompt(i, 16), params)
    d.step()
    d.add("later", prompt(4, 16), params)  # queued: not in step 2's batch
    out = d.step()
    assert out.record.decisions.preempted == ["r3"]
    assert out.failure.request_ids == ("r1", "r2") and out.failure.whole_step
    assert faulty.calls == 1 + 1 + 2  # step 1, step 2 whole, then each half once
    d.run()
    reasons = {rid: rec.finish_reason for rid, rec in d.finished_records().items()}
    assert reasons == {"r1": "error", "r2": "error", "r3": "length", "later": "length"}
    d.check_all_finished()
    _idle_and_consistent(d)


def test_bisection_stays_within_its_budget():
    d, faulty = _driver()
    d.engine.fault_isolation_runs = 4
    faulty.add(Fault(steps={2}))  # every call of step 2 fails
    for i in range(8):
        d.add(f"r{i}", prompt(i, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    d.step()
    calls = faulty.calls
    out = d.step()
    assert faulty.calls - calls == 1 + 4
    assert sorted(out.failure.request_ids) == [f"r{i}" for i in range(8)]
    d.run()
    _idle_and_consistent(d)


def test_without_isolation_the_whole_batch_ends():
    d, faulty = _driver()
    d.engine.fault_isolation_runs = 0
    faulty.add(Fault(match=lambda r: r.request_id == "r1"))
    for i in range(3):
        d.add(f"r{i}", prompt(i, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    out = d.step()
    assert out.failure.request_ids == ("r0", "r1", "r2") and faulty.calls == 1
    d.run()
    _idle_and_consistent(d)


def test_a_step_where_one_request_ran_is_not_a_whole_step_failure():
    """One of two requests fails: the other's part ran, so the engine works (readiness
    counts only whole-step failures)."""
    d, faulty = _driver()
    faulty.add(Fault(match=lambda r: r.request_id == "r1"))
    for i in range(2):
        d.add(f"r{i}", prompt(i, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    out = d.step()
    assert out.failure.request_ids == ("r1",) and out.failure.num_succeeded == 1
    assert not out.failure.whole_step
    d.run()
    _idle_and_consistent(d)


def test_a_transient_fault_is_retried_in_parts_and_ends_nothing():
    d, faulty = _driver()
    faulty.add(Fault(steps={3}, times=1))  # the first call of step 3 fails, not the retries
    for i in range(4):
        d.add(f"r{i}", prompt(i, 20), SamplingParams(max_tokens=6, ignore_eos=True))
    d.step()
    d.step()
    out = d.step()
    assert out.failure is not None and out.failure.request_ids == ()
    assert out.failure.num_succeeded == 4 and not out.failure.whole_step
    assert len(out.rows) == 4
    d.run()
    assert {rec.finish_reason for rec in d.finished_records().values()} == {"length"}
    d.check_all_finished()
    _idle_and_consistent(d)


def test_an_update_failure_after_a_request_finished_ends_the_step_and_goes_on():
    # r0 and r1 decode side by side; in step 3 r0 takes its last token (update() finishes
    # it, LENGTH), then r1's token cannot be applied: update() raises part-way.
    live = live_config(ONE_LANE, max_num_seqs=8)
    engine, _ = make_engine(live)
    engine.executor = FaultyExecutor(engine.executor, Fault(steps={3}, mode="corrupt"))
    engine.add_request("r0", prompt(0, 20), SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("r1", prompt(1, 20), SamplingParams(max_tokens=9, ignore_eos=True))
    engine.step()
    engine.step()
    out = engine.step()
    engine.check_integrity()
    assert out.failure.phase == "update" and out.failure.request_ids == ("r0", "r1")
    assert {r.request_id: (r.finish_reason, r.finish_detail) for r in out.finished} == {
        "r0": ("error", "step failed: update raised InjectedFault"),
        "r1": ("error", "step failed: update raised InjectedFault")}
    assert [(dl.request_id, dl.new_token_ids, dl.finish_reason) for dl in out.deltas] == [
        ("r0", [], "error"), ("r1", [], "error")]  # one final delta each, nothing more
    engine.add_request("r2", prompt(2, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    outputs = engine.run_until_done()
    engine.check_integrity()
    assert [r.finish_reason for o in outputs for r in o.finished] == ["length"]
    assert engine.block_manager.num_used == 0


def test_fail_all_ends_requests_update_already_finished():
    # What the engine loop does when step() itself raised (a scheduler bug): a request
    # that update() had ended must not trip the error path.
    live = live_config(ONE_LANE, max_num_seqs=8)
    engine, _ = make_engine(live)
    engine.add_request("r0", prompt(0, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.add_request("r1", prompt(1, 20), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    engine.scheduler.finish(engine.requests["r0"], RequestStatus.LENGTH, 0.0)  # as update()
    out = engine.fail_all("step failed: step raised RuntimeError")
    engine.check_integrity()
    assert {r.request_id: r.finish_reason for r in out.finished} == {"r0": "error",
                                                                    "r1": "error"}
    assert [(dl.request_id, dl.finish_reason) for dl in out.deltas] == [("r0", "error"),
                                                                       ("r1", "error")]
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used == 0


def test_split_keeps_batch_order_and_token_counts():
    from engine.fault_isolation import split

    reqs = [object() for _ in range(5)]
    chunks = [PrefillChunk(reqs[3], 30, True), PrefillChunk(reqs[4], 7, False)]
    out = SchedulerOutput(9, reqs[:3], chunks, 2, 64, num_decode_tokens=3,
                          num_prefill_tokens=37)
    first, second = split(out)
    assert (first.decodes, first.prefills) == (reqs[:2], [])
    assert (second.decodes, second.prefills) == (reqs[2:3], chunks)
    assert (first.num_tokens, second.num_tokens) == (2, 38)
    assert first.step_id == second.step_id == 9
    a, b = split(second)
    assert (a.decodes, a.prefills, b.decodes, b.prefills) == ([reqs[2]], [], [], chunks)


def test_a_failed_steps_time_leaves_the_measured_throughput_alone():
    """Admission's deadline estimates read the measured tokens/s: a step that failed (its
    batch split and run again to find the culprit) says nothing of the device's speed."""
    d, faulty = _driver(step_cost_s=0.01, prefill_token_cost_s=1e-4)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i in range(3):
        d.add(f"r{i}", prompt(i, 20), params)
    d.step()
    d.step()
    measured = d.engine.throughput.tokens_per_s
    assert measured is not None
    faulty.add(Fault(match=lambda r: r.request_id == "huge", prefill_only=True))
    d.add("huge", prompt(9, 200), params)
    assert d.step().failure is not None
    assert d.engine.throughput.tokens_per_s == measured
