"""The fault injector's own rules (engine/sim/faults.py), on hand-built batches: `times`
caps how often a fault fires, `prefill_only` spares decodes, and a step's corrupt fault
spoils the last sample row so the rows before it are applied first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.records import PrefillChunk, SchedulerOutput
from engine.sim.faults import CorruptToken, Fault, FaultyExecutor, InjectedFault


class _Inner:
    """An executor whose token for each sample row is the row's position + 100."""

    def execute(self, out: SchedulerOutput) -> list[int]:
        return [100 + i for i, _ in enumerate(out.sample_requests())]


def _req(rid: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, tenant="t")


def _batch(step_id: int, decodes: list, prefills: list) -> SchedulerOutput:
    chunks = [PrefillChunk(r, 8, True) for r in prefills]
    return SchedulerOutput(step_id, decodes, chunks, 1, 64, num_decode_tokens=len(decodes),
                           num_prefill_tokens=8 * len(chunks))


def test_a_fault_with_times_fires_exactly_that_many_times():
    faulty = FaultyExecutor(_Inner(), Fault(steps={3}, times=2))
    out = _batch(3, [_req("a"), _req("b")], [])
    for _ in range(2):
        with pytest.raises(InjectedFault):
            faulty.execute(out)
    assert faulty.execute(out) == [100, 101]  # the third call of step 3 runs
    assert faulty.fired == [(3, "raise"), (3, "raise")]
    assert faulty.calls == 3


def test_a_prefill_only_fault_spares_the_request_while_it_decodes():
    faulty = FaultyExecutor(_Inner(), Fault(match=lambda r: r.request_id == "x",
                                            prefill_only=True))
    x = _req("x")
    assert faulty.execute(_batch(1, [x, _req("b")], [])) == [100, 101]  # x decodes
    with pytest.raises(InjectedFault, match=r"step 2 \(x\)"):
        faulty.execute(_batch(2, [_req("b")], [x]))  # x runs a prompt chunk
    assert faulty.fired == [(2, "raise")]


def test_a_request_fault_without_prefill_only_fires_on_its_decode_too():
    faulty = FaultyExecutor(_Inner(), Fault(match=lambda r: r.request_id == "x"))
    with pytest.raises(InjectedFault, match=r"\(x\)"):
        faulty.execute(_batch(1, [_req("a"), _req("x")], []))


def test_a_corrupt_step_fault_spoils_only_the_last_sample_row():
    faulty = FaultyExecutor(_Inner(), Fault(steps={4}, mode="corrupt"))
    got = faulty.execute(_batch(4, [_req("a"), _req("b")], [_req("c")]))
    assert got[:2] == [100, 101]  # the rows before it are applied first
    assert isinstance(got[2], CorruptToken)
    with pytest.raises(InjectedFault):
        int(got[2])


def test_a_corrupt_request_fault_spoils_only_that_requests_row():
    faulty = FaultyExecutor(_Inner(), Fault(match=lambda r: r.request_id == "b",
                                            mode="corrupt"))
    got = faulty.execute(_batch(1, [_req("a"), _req("b"), _req("c")], []))
    assert got[0] == 100 and got[2] == 102
    assert isinstance(got[1], CorruptToken)
