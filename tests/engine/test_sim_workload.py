"""Trace workloads for the simulator (engine/sim/workload.py, simulate.py): a replay forces
each request's output length from the trace, keeps each arrival time, scales lengths with
their floor, and the scale a report prints is the one used."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.workload import TraceRequest, TraceScale, forced_params, load_trace


def test_a_replay_gets_the_trace_output_lengths_whatever_the_model_samples():
    """The trace gives token counts, not text: a replay ignores EOS, so a model that samples
    EOS early (here about one token in two) still produces each request's length."""
    clock = FakeClock()
    executor = SimulatedExecutor(clock=clock, eos_every=2)
    config = EngineConfig(StaticConfig(num_kv_blocks=64, max_model_len=256),
                          LiveConfig(max_num_seqs=4, prefill_chunk_size=128,
                                     max_num_batched_tokens=128))
    engine = Engine(config, executor, clock=clock, eos_token_id=executor.eos_token_id)
    trace = [TraceRequest(arrival_s=0.1 * i, prompt_tokens=8, output_tokens=12 + i)
             for i in range(4)]
    result = simulate(engine, clock, trace)
    assert sorted(r.num_output_tokens for r in result.records) == [12, 13, 14, 15]
    assert {r.finish_reason for r in result.records} == {"length"}
    assert result.output_tokens == 12 + 13 + 14 + 15
    assert forced_params(7).max_tokens == 7


def test_the_scale_a_report_prints_is_each_of_its_own_factors():
    scale = TraceScale(prompt_div=4, output_div=2, time_div=1.5, min_tokens=3)
    assert scale.describe() == ("prompt lengths / 4, output lengths / 2 (at least 3 each),"
                                " arrival times / 1.5")


def test_scaled_lengths_keep_the_floor_of_min_tokens():
    """Lengths divided far down are held at `min_tokens`, prompts and outputs alike."""
    trace = load_trace(limit=50, scale=TraceScale(prompt_div=1e6, output_div=1e6,
                                                  min_tokens=4))
    assert len(trace) == 50
    assert {(t.prompt_tokens, t.output_tokens) for t in trace} == {(4, 4)}


def test_a_request_arriving_during_a_step_keeps_its_trace_arrival_time():
    """A request the trace sends while a step runs arrived then, not when the step ended:
    its queue delay and TTFT count from its trace time."""
    clock = FakeClock()
    executor = SimulatedExecutor(clock=clock, step_cost_s=0.5)
    config = EngineConfig(StaticConfig(num_kv_blocks=64, max_model_len=256),
                          LiveConfig(max_num_seqs=4, prefill_chunk_size=128,
                                     max_num_batched_tokens=128))
    engine = Engine(config, executor, clock=clock)
    start = clock.now
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=8, output_tokens=4),
             TraceRequest(arrival_s=0.2, prompt_tokens=8, output_tokens=4)]
    records = {r.request_id: r for r in simulate(engine, clock, trace).records}
    later = records["req-1"]
    assert later.arrival_time - start == pytest.approx(0.2)
    assert later.queue_delay_s >= 0.3  # waited for the step that ran at its arrival
