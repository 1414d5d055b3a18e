"""The replay's modelled step time (control/whatif/lean.py LeanExecutor) counts each
feature as the calibration read it from the trace (control/whatif/window.py): a decode
attends to its computed tokens and the one it adds; a prompt step costs its own fixed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from control.whatif.calibrate import FEATURES
from control.whatif.lean import LeanExecutor
from engine.records import PrefillChunk, SchedulerOutput
from engine.sim.executor import FakeClock


def _lean(feature: str) -> tuple[LeanExecutor, FakeClock]:
    """Each unit of `feature` costs 1 ms; nothing else costs anything."""
    coef = tuple(1e-3 if name == feature else 0.0 for name in FEATURES)
    model = SimpleNamespace(coef=coef, seen_max=(1e9,) * len(FEATURES))
    clock = FakeClock(0.0)
    return LeanExecutor(model, clock), clock


def _decodes(*computed: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(num_computed_tokens=n) for n in computed]


def test_each_decode_attends_to_its_tokens_so_far_and_the_one_it_adds():
    lean, clock = _lean("decode_context_tokens")
    out = SchedulerOutput(1, _decodes(10, 20), [], 1, 64, num_decode_tokens=2)
    assert lean.execute(out) == [7, 7]
    assert clock.now == pytest.approx(0.032)  # (10 + 1) + (20 + 1) tokens of KV
    assert lean.largest[FEATURES.index("decode_context_tokens")] == 32


def test_the_prompt_step_cost_applies_to_steps_with_a_prompt_chunk_only():
    lean, clock = _lean("prompt_step")
    lean.execute(SchedulerOutput(1, _decodes(5), [], 1, 64, num_decode_tokens=1))
    assert clock.now == 0.0
    chunk = PrefillChunk(SimpleNamespace(num_computed_tokens=0), 16, True)
    assert lean.execute(SchedulerOutput(2, [], [chunk], 1, 64, num_prefill_tokens=16)) == [7]
    assert clock.now == pytest.approx(1e-3)
