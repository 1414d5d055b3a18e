"""The step cost's drift: served steps against the start-up law. On the simulated engine
with CPU-like costs and a law fitted by the start-up probe, the device's steps become twice
as costly at t=60 s (another tenant on the machine); the reading stays near 1 before and
shows the change within WINDOW_S of it, and the scheduler's price of a step follows (by
its correction of the law, law_scale, or by a refit law). Without a law there is no
reading, so no metric to misread."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from engine.calibration.budget_fit import fit_step_budgets
from engine.calibration.drift import (
    BASELINE_STEPS,
    MAX_WINDOW_STEPS,
    MIN_WINDOW_STEPS,
    WARMUP_STEPS,
    WINDOW_S,
    StepCostWatch,
)
from engine.calibration.online_law import ANCHOR_STEPS
from engine.calibration.probe import measure
from engine.calibration.step_law import chunk_pairs, fit_law
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.step_cost import CostProber, CpuLikeStepCost
from engine.sim.workload import TraceRequest

SLOWED_AT_S = 60.0
STATIC = StaticConfig(num_kv_blocks=1024, max_model_len=2048, target_step_ms=250)


@dataclasses.dataclass
class SlowedAfter:
    """CpuLikeStepCost, `factor` times as costly once the clock passes `at`."""

    clock: FakeClock
    at: float
    factor: float
    cost: CpuLikeStepCost = dataclasses.field(default_factory=CpuLikeStepCost)

    def __call__(self, out) -> float:
        return self.cost(out) * (self.factor if self.clock.now >= self.at else 1.0)


def steady_trace(seconds: float) -> list[TraceRequest]:
    """A request every 0.5 s: 200-token prompts, 40-token answers (under capacity)."""
    return [TraceRequest(arrival_s=0.5 * i, prompt_tokens=200, output_tokens=40)
            for i in range(int(seconds / 0.5))]


def run(factor: float, law: bool = True) -> tuple[list[tuple[float, object]], Engine]:
    """(seconds since the start, the engine's step-cost reading) after every step of 120 s
    of traffic, and the engine."""
    config, fit = fit_step_budgets(EngineConfig(STATIC, LiveConfig()), set(),
                                   CostProber(CpuLikeStepCost()))
    clock = FakeClock()
    start = clock.now
    executor = SimulatedExecutor(clock=clock, cost_model=SlowedAfter(clock,
                                                                     start + SLOWED_AT_S,
                                                                     factor),
                                 shadow_kv=False)
    engine = Engine(config, executor, clock=clock, step_law=fit.law if law else None)
    readings = []
    simulate(engine, clock, steady_trace(120.0),
             on_step=lambda out: readings.append((clock.now - start,
                                                  engine.gauges().step_cost)))
    return readings, engine


def priced_over_startup(engine: Engine) -> float:
    """How much dearer the scheduler now prices steps (its law in force, times law_scale)
    than the start-up law did: the median over the online refit's typical steps."""
    state = engine.scheduler
    return statistics.median(state.law_slowdown.value * state.step_law.step_s(*f)
                             / engine.startup_law.step_s(*f) for f in ANCHOR_STEPS)


def test_a_device_twice_as_slow_is_seen_within_the_window_and_the_law_follows():
    readings, engine = run(factor=2.0)
    before = [r for t, r in readings if 30 < t < SLOWED_AT_S and r.drift is not None]
    assert before and all(0.8 < r.drift < 1.25 for r in before), before[:3]
    assert all(r.law_scale < 1.5 for r in before)
    flagged = next(t for t, r in readings
                   if t > SLOWED_AT_S and r.drift is not None and r.drift > 1.5)
    assert flagged - SLOWED_AT_S <= WINDOW_S
    late = [r for t, r in readings if t > SLOWED_AT_S + WINDOW_S + 5]
    assert late and all(r.drift > 1.6 for r in late if r.drift is not None)
    assert priced_over_startup(engine) > 1.6  # the scheduler's price followed the device


def test_a_device_that_stays_as_it_was_reads_near_one_throughout():
    readings, _ = run(factor=1.0)
    drifts = [r.drift for _, r in readings if r.drift is not None]
    assert len(drifts) > 100 and max(drifts) < 1.3 and min(drifts) > 0.75


def test_without_a_law_there_is_no_reading():
    assert all(r is None for _, r in run(factor=2.0, law=False)[0])


def test_steps_are_compared_with_steps_of_their_own_size():
    """Small steps run 3x their prediction, large ones 1.1x, from the start: no drift,
    however the mix changes; then every step 2x as long as before: drift 2."""
    watch, t = StepCostWatch(), 0.0

    def serve(count: int, predicted_s: float, ratio: float) -> None:
        nonlocal t
        for _ in range(count):
            t += 0.05
            watch.observe(t, predicted_s, predicted_s * ratio)

    serve(WARMUP_STEPS, 0.001, 50.0)  # warm-up: not anyone's baseline
    assert watch.reading(t, 1.0).drift is None and not watch.baselines
    serve(BASELINE_STEPS, 0.001, 3.0)
    serve(BASELINE_STEPS, 0.2, 1.1)
    assert watch.reading(t, 1.0).drift is None  # baselines only, no evidence yet
    serve(MIN_WINDOW_STEPS, 0.001, 3.0)
    assert watch.reading(t, 1.0).drift == pytest.approx(1.0)
    serve(200, 0.2, 1.1)  # the traffic turns to large steps: the same device
    assert watch.reading(t, 1.0).drift == pytest.approx(1.0)
    serve(200, 0.2, 2.2)
    serve(200, 0.001, 6.0)
    assert watch.reading(t, 1.0).drift == pytest.approx(2.0)
    steps = watch.reading(t, 1.0).window_steps
    assert steps == min(MAX_WINDOW_STEPS, round(WINDOW_S / 0.05))
    watch.observe(t, None, 1.0)  # a step the law did not predict: no evidence
    assert watch.reading(t, 1.0).window_steps == steps
    # an idle server: the window empties, and with it the evidence
    assert watch.reading(t + WINDOW_S + 1, 1.0).drift is None


class DecodeStepsOwnCode:
    """A device whose steps of decodes alone run other code than prompt steps (as this
    CPU's native decode layers do): 8 ms + 0.5 ms a decode, against a prompt step's 20 ms +
    0.2 ms a token; both read 2 us per decode context token. `prefill`/`decodes` are the
    start-up probe's StepProber; `step_s` a served step's time."""

    def step_s(self, tokens: int, decodes: int, pairs: int, context: int) -> float:
        if decodes == tokens:
            return 0.008 + 0.0005 * decodes + 2e-6 * context
        return 0.020 + 0.0002 * tokens + 1e-9 * pairs + 2e-6 * context

    def prefill(self, start: int, num_tokens: int) -> float:
        return self.step_s(num_tokens, 0, chunk_pairs(start, num_tokens), 0)

    def decodes(self, batch: int, context: int) -> float:
        return self.step_s(batch, batch, 0, batch * context)


def test_more_requests_running_on_the_same_device_is_not_drift():
    """2 running decodes, then 16: the steps' shape changes, the device does not. With one
    law for both kinds of step, a lone decode was priced as a prompt step and the reading
    rose with the load (2.5-2.9 on the tests' tiny model under 16 clients, idle machine)."""
    device = DecodeStepsOwnCode()
    law = fit_law(measure(device, 0.25, max_tokens=512, max_context=2048, pool_tokens=32768,
                          max_batch=64, block_size=16))
    watch, t = StepCostWatch(), 0.0
    for running in [2] * (WARMUP_STEPS + BASELINE_STEPS + 50) + [16] * 400:
        t += 0.05
        features = (running, running, 0, running * 300)
        watch.observe(t, law.step_s(*features), device.step_s(*features))
    assert 0.9 < watch.reading(t, 1.0).drift < 1.1
