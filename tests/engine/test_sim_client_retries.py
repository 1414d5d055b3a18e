"""Simulated clients that resend refused requests (engine/sim/simulate.py `retry`): a
refusal comes back as a new request after the client's delay, `first_arrival` keeps when
its user first sent it, and a refusal the client gives up on is final."""

from __future__ import annotations

from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.workload import TraceRequest

BURST = [TraceRequest(arrival_s=0.0, prompt_tokens=16, output_tokens=4) for _ in range(4)]


def engine_and_clock() -> tuple[Engine, FakeClock]:
    """One request queued at most: of a burst of four, one is taken and three refused."""
    clock = FakeClock()
    config = EngineConfig(StaticConfig(num_kv_blocks=64, max_model_len=256),
                          LiveConfig(max_num_seqs=1, max_waiting_requests=1,
                                     prefill_chunk_size=128, max_num_batched_tokens=128))
    executor = SimulatedExecutor(clock=clock, shadow_kv=False)
    return Engine(config, executor, clock=clock), clock


def test_refusals_are_final_without_a_retry():
    engine, clock = engine_and_clock()
    result = simulate(engine, clock, BURST)
    assert len(result.records) == 1 and len(result.rejected) == 3
    assert not result.retried and not result.first_arrival


def test_resent_requests_come_back_after_the_delay_and_keep_their_first_send():
    engine, clock = engine_and_clock()
    start = clock.now
    sends: list[int] = []

    def retry(decision, sent: int) -> float | None:
        sends.append(sent)
        return 5.0 if sent <= 3 else None  # resend up to three times, 5 s apart

    result = simulate(engine, clock, BURST, retry=retry)
    # each round of resends gets one more in: 3 refused at 0 s, 2 at 5 s, 1 at 10 s
    assert not result.rejected and len(result.records) == 4
    assert sorted(sends) == [1, 1, 1, 2, 2, 3] and len(result.retried) == 6
    resent = sorted(r.arrival_time - start for r in result.records
                    if r.request_id in result.first_arrival)
    assert resent == [5.0, 10.0, 15.0]
    for r in result.records:
        assert r.resent == (r.request_id in result.first_arrival)  # marked as its client's
        if r.request_id in result.first_arrival:
            assert result.first_arrival[r.request_id] == start
            resends = round((r.arrival_time - start) / 5.0)
            assert r.request_id.endswith(f".{resends}")


def test_a_client_that_gives_up_leaves_the_refusal_final():
    engine, clock = engine_and_clock()
    result = simulate(engine, clock, BURST, retry=lambda decision, sent: None)
    assert len(result.rejected) == 3 and not result.retried


def test_a_resend_due_before_the_next_arrival_is_sent_on_time():
    """An idle engine's clock jumps to the earlier of the next arrival and the next resend:
    a refusal resent after 5 s is sent at 5 s, not held until a request 100 s later comes."""
    engine, clock = engine_and_clock()
    start = clock.now
    late = TraceRequest(arrival_s=100.0, prompt_tokens=16, output_tokens=4)
    result = simulate(engine, clock, BURST + [late],
                      retry=lambda decision, sent: 5.0 if sent == 1 else None)
    resent = [r for r in result.records if r.request_id in result.first_arrival]
    assert resent and all(r.arrival_time - start == 5.0 for r in resent)
    assert all(r.admitted_time - start < 10.0 and r.finished_time - start < 10.0
               for r in resent)
