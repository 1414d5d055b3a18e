"""The CPU-like step cost of simulations (engine/sim/step_cost.py): it reproduces the measured
steps it was built from (bench/RESULTS.md), its attention is quadratic in a prompt's length,
its noise has mean 1 and is seeded, and the SimulatedExecutor advances its clock by it."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from engine.records import SchedulerOutput
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.step_cost import CpuLikeStepCost


def step(prompts: list[tuple[int, int]] = (), contexts: list[int] = ()) -> SchedulerOutput:
    """prompts: (cached tokens, chunk tokens) per prefill chunk; contexts: computed tokens
    per decode. Stand-in requests carry only what the cost reads."""
    chunks = [SimpleNamespace(request=SimpleNamespace(num_computed_tokens=start), num_tokens=n)
              for start, n in prompts]
    decodes = [SimpleNamespace(num_computed_tokens=c) for c in contexts]
    return SchedulerOutput(0, decodes, chunks, 0, 0, num_decode_tokens=len(decodes),
                           num_prefill_tokens=sum(n for _, n in prompts))


@pytest.mark.parametrize(("out", "measured_ms", "rel"), [
    (step([(0, 93)] * 22), 472.2, 0.02),  # 2046 tokens in 22 prompts
    (step([(0, 2046)]), 1760.0, 0.02),  # one 2046-token prompt: mostly attention
    (step(contexts=[128] * 128), 106.4, 0.06),  # 128 decodes at context 128
    (step(contexts=[128] * 64), 69.1, 0.15),
    (step(contexts=[128] * 24), 41.9, 0.2),
])
def test_the_defaults_reproduce_the_measured_cpu_steps(out, measured_ms, rel):
    assert 1000 * CpuLikeStepCost().exact_s(out) == pytest.approx(measured_ms, rel=rel)


def test_a_chunk_deep_into_a_prompt_costs_more_than_the_first():
    cost = CpuLikeStepCost(noise=0)
    first, deep = cost(step([(0, 128)])), cost(step([(1792, 128)]))
    # 128 x 1792 more (query, key) pairs at 0.64 us: ~147 ms on top of ~53 ms
    assert deep - first == pytest.approx(128 * 1792 * cost.prefill_pair_s)
    assert deep > 3 * first


def test_the_noise_has_mean_one_and_is_seeded():
    out = step(contexts=[500] * 8)
    exact = CpuLikeStepCost().exact_s(out)
    a, b = CpuLikeStepCost(seed=3), CpuLikeStepCost(seed=3)
    series = [a(out) / exact for _ in range(4000)]  # one factor per step
    assert series == [b(out) / exact for _ in range(4000)]
    assert statistics.fmean(series) == pytest.approx(1.0, abs=0.005)
    assert statistics.stdev(series) == pytest.approx(0.05, rel=0.1)
    assert CpuLikeStepCost(seed=4)(out) / exact != series[0]
    # a wide noise keeps its mean too: each step's factor is exp(N(-sigma^2 / 2, sigma))
    wide = CpuLikeStepCost(noise=0.5, seed=3)
    assert statistics.fmean(wide(out) / exact for _ in range(4000)) == pytest.approx(1.0,
                                                                                   abs=0.05)


def test_a_negative_constant_is_refused():
    with pytest.raises(ValueError, match="decode_kv_s=-1.0 must be a finite number >= 0"):
        CpuLikeStepCost(decode_kv_s=-1.0)


def test_the_executor_advances_its_clock_by_the_cost_model():
    clock = FakeClock(0.0)
    cost = CpuLikeStepCost(noise=0)
    executor = SimulatedExecutor(clock=clock, cost_model=cost, step_cost_s=5.0,
                                 shadow_kv=False)
    out = step([(0, 100)])
    out.prefills[0].sample = False
    executor.execute(out)
    assert clock.now == pytest.approx(cost.exact_s(out))  # the linear costs do not apply
