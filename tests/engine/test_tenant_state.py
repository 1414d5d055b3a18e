"""Per-tenant scheduler state follows the ACTIVE tenants, not every tenant ever seen
(issue 17.4).

The tenant comes from `X-Tenant` or the OpenAI `user` field: often one per end user. 20,000
one-off tenants each send one short request through the engine; afterwards the lanes hold
no state for any of them, and a step does exactly the same Python-level work as after 200
(counted with a line tracer over engine/*.py, not timed: the timing is a benchmark's job).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from engine_helpers import live_config, make_engine, prompt

import engine as engine_pkg
from engine.config import LaneConfig
from engine.request import SamplingParams

LANES = (LaneConfig("fair", tenant_fair_share=True), LaneConfig("plain"))
ONE_OFF = SamplingParams(max_tokens=2, ignore_eos=True)  # a prefill, then one decode
ENGINE_DIR = str(Path(engine_pkg.__file__).parent)


def _one_off_tenants(engine, first: int, count: int, wave: int = 100) -> None:
    """Tenants first..first+count-1 send one request each (waves of `wave` a step, half
    per lane), and all finish; the integrity check runs after every step."""
    for start in range(first, first + count, wave):
        for i in range(start, min(start + wave, first + count)):
            decision = engine.add_request(f"r{i}", prompt(i, 4), ONE_OFF, tenant=f"user-{i}",
                                          lane=LANES[i % 2].name)
            assert decision.accepted, decision
        engine.step()
        engine.check_integrity()
    while len(engine.requests) > 1:  # all but the steady stream
        engine.step()
        engine.check_integrity()


def _traced_lines(fn) -> int:
    """Python lines run by the engine core (engine/*.py, not the simulated executor in
    engine/sim/, whose work grows with the steady stream's length) while `fn` runs: a
    count of work, not a time."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if str(Path(frame.f_code.co_filename).parent) != ENGINE_DIR:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _idle_ish_step_lines(engine, tag: str) -> int:
    """Lines run by: one new tenant's request arriving, and the two steps that serve it
    (prefill, decode) next to the one steady stream."""
    def work():
        engine.add_request(tag, prompt(7, 4), ONE_OFF, tenant=tag, lane="fair")
        engine.step()
        engine.step()
    lines = _traced_lines(work)
    assert engine.get_request(tag) is None  # served and finished
    return lines


@pytest.fixture(scope="module")
def history():
    live = live_config(LANES, max_num_seqs=256, max_num_batched_tokens=1024,
                       prefill_chunk_size=64)
    engine, _ = make_engine(live, num_kv_blocks=1024, max_model_len=4096)
    # one steady stream decodes throughout: every step has a running tenant to charge
    engine.add_request("steady", prompt(0, 16), SamplingParams(max_tokens=4000, ignore_eos=True),
                       tenant="steady", lane="fair")
    _one_off_tenants(engine, 0, 200)
    after_200 = _idle_ish_step_lines(engine, "probe-200")
    _one_off_tenants(engine, 200, 19_800)
    after_20k = _idle_ish_step_lines(engine, "probe-20k")
    return engine, after_200, after_20k


def test_a_step_does_no_work_per_tenant_that_has_left(history):
    _, after_200, after_20k = history
    # equal up to a few lines (a block boundary of the steady stream); old main: ~50x more
    print(f"lines per idle-ish step: {after_200} after 200 tenants, {after_20k} after 20k")
    assert after_20k <= after_200 + 20, (after_200, after_20k)


def test_departed_tenants_leave_no_scheduler_state(history):
    engine, _, _ = history
    assert set(engine.requests) == {"steady"}
    for lane in engine.scheduler.lanes:
        assert lane.tenants.decoding == ({"steady": 1} if lane.name == "fair" else {})
        assert lane.buckets() == {}
        book = lane.tenants
        assert book.waiting == {}
        assert set(book.running) | set(book.vtimes) <= {"steady"}
        assert len(lane.timeouts) <= 64  # dead entries: bounded, whatever the history


def test_a_returning_tenant_joins_at_the_current_virtual_time():
    """Forgetting a tenant costs it nothing and gains it nothing over a newcomer: it joins
    level with the queued tenant furthest behind."""
    live = live_config(LANES[:1], max_num_seqs=1, max_num_batched_tokens=64,
                       prefill_chunk_size=64)
    engine, _ = make_engine(live, num_kv_blocks=256, max_model_len=4096)
    book = engine.scheduler.lanes["fair"].tenants
    engine.add_request("a1", prompt(1, 32), ONE_OFF, tenant="a")
    engine.run_until_done()
    assert "a" not in book.vtimes and book.vtime_high > 0  # a left: forgotten
    engine.add_request("b1", prompt(2, 32), SamplingParams(max_tokens=50, ignore_eos=True),
                       tenant="b")
    engine.add_request("b2", prompt(3, 32), ONE_OFF, tenant="b")
    for _ in range(3):
        engine.step()
    b_vtime = book.vtimes["b"]  # b is running b1 and queued with b2
    engine.add_request("a2", prompt(4, 32), ONE_OFF, tenant="a")
    assert book.vtimes["a"] == b_vtime  # level with the only queued tenant
    engine.check_integrity()


def test_a_newcomer_joins_level_with_the_queued_tenant_furthest_behind_whoever_joined_first():
    """A tenant already running and ahead (a) queues another request just before a new
    tenant (c) arrives: c still joins level with b, the queued tenant furthest behind, not
    with a's lead (which would serve c after b, having never run)."""
    live = live_config(LANES[:1], max_num_seqs=1, max_num_batched_tokens=64,
                       prefill_chunk_size=64)
    engine, _ = make_engine(live, num_kv_blocks=256, max_model_len=4096)
    book = engine.scheduler.lanes["fair"].tenants
    long = SamplingParams(max_tokens=50, ignore_eos=True)
    engine.add_request("a1", prompt(1, 32), long, tenant="a")
    for _ in range(3):
        engine.step()
    engine.add_request("b1", prompt(2, 32), ONE_OFF, tenant="b")  # waits: one sequence
    for _ in range(3):
        engine.step()
    assert book.vtimes["a"] > book.vtimes["b"]
    engine.add_request("a2", prompt(3, 32), ONE_OFF, tenant="a")
    engine.add_request("c1", prompt(4, 32), ONE_OFF, tenant="c")
    assert book.vtimes["c"] == book.vtimes["b"]
    engine.check_integrity()


def test_tenants_are_charged_the_decodes_of_a_step_too_small_for_all_of_them():
    """max_num_seqs lowered under load: a step serves only some decodes, and their tenants
    are charged for them all the same (else they would look idle to the fair share)."""
    engine, _ = make_engine(live_config(LANES, max_num_seqs=8))
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    for i, tenant in enumerate(("x", "x", "y", "y")):
        engine.add_request(f"r{i}", prompt(i, 4), params, tenant=tenant, lane="fair")
    engine.step()
    engine.step()
    engine.update_config(engine.live_config.replace(max_num_seqs=2))
    book = engine.scheduler.lanes["fair"].tenants
    before = dict(book.vtimes)
    out = engine.step()
    assert len(out.record.scheduled) == 2  # two of the four decodes
    assert sum(book.vtimes.values()) - sum(before.values()) == pytest.approx(2.0)
