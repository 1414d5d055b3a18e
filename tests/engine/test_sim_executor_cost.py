"""The simulated executor's linear step cost (engine/sim/executor.py): fixed per step, per
prompt token computed (not per chunk), per decode token; advanced on its FakeClock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.records import PrefillChunk, SchedulerOutput
from engine.sim.executor import FakeClock, SimulatedExecutor


def test_a_step_costs_its_fixed_cost_plus_each_prompt_and_decode_token():
    clock = FakeClock(0.0)
    ex = SimulatedExecutor(step_cost_s=0.01, prefill_token_cost_s=0.001,
                           decode_token_cost_s=0.002, clock=clock, shadow_kv=False)
    req = SimpleNamespace(token_ids=[5, 6, 7])
    chunks = [PrefillChunk(req, 8, False), PrefillChunk(req, 24, True)]
    out = SchedulerOutput(1, [req, req, req], chunks, 1, 64, num_decode_tokens=3,
                          num_prefill_tokens=32)
    assert len(ex.execute(out)) == 4  # three decodes and the sampled chunk
    assert clock.now == pytest.approx(0.01 + 32 * 0.001 + 3 * 0.002)
