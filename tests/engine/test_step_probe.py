"""The start-up probe (engine/calibration/probe.py) under a busy CPU: a step measured slower
than a bigger one of its family is run again, so the fitted law still grows with the
step; a quiet start-up runs no extra step."""

from __future__ import annotations

from engine.calibration.probe import measure
from engine.calibration.step_law import StepLaw, chunk_pairs, fit_law

# The tests' tiny model on this CPU: ~1 ms a step, a 512-token prefill ~2 ms.
TINY = StepLaw(fixed_s=1e-3, token_s=2e-6, prefill_pair_s=1e-9, decode_kv_s=1e-8,
               decode_fixed_s=0.8e-3, decode_row_s=5e-6)
BUSY_S = 0.012  # what any step took while another process held the CPU


class BusyAtFirst:
    """Steps that cost `TINY`, except the first `busy_calls` of `kind`, which take BUSY_S
    (a neighbour that finishes while the probe runs)."""

    def __init__(self, kind: str, busy_calls: int):
        self.kind, self.busy_left = kind, busy_calls
        self.calls = 0

    def _took(self, kind: str, seconds: float) -> float:
        self.calls += 1
        if kind == self.kind and self.busy_left > 0:
            self.busy_left -= 1
            return BUSY_S
        return seconds

    def prefill(self, start: int, num_tokens: int) -> float:
        return self._took("prefill", TINY.step_s(num_tokens, 0, chunk_pairs(start, num_tokens),
                                                 0))

    def decodes(self, batch: int, context: int) -> float:
        return self._took("decode", TINY.step_s(batch, batch, 0, batch * context))


def probe(prober) -> list:
    return measure(prober, 0.25, max_tokens=512, max_context=2048, pool_tokens=16384,
                   max_batch=64, block_size=16)


def test_prefill_steps_slowed_at_start_up_are_run_again_and_the_law_grows_with_tokens():
    # warm-up, 16 x2, 32 x2: the two smallest sizes both measured at 12 ms
    probes = probe(BusyAtFirst("prefill", 5))
    ramp = [p for p in probes if p.label.endswith("@0")]
    assert [p.tokens for p in ramp] == [16, 32, 64, 128, 256, 512]
    assert all(a.seconds < b.seconds for a, b in zip(ramp, ramp[1:], strict=False)), ramp
    law = fit_law(probes)
    assert law.step_s(512, 0, chunk_pairs(0, 512), 0) > 1.5 * law.step_s(
        16, 0, chunk_pairs(0, 16), 0)


def test_decode_steps_slowed_at_start_up_are_run_again():
    probes = probe(BusyAtFirst("decode", 4))  # warm-up, 1 x short twice, 4 x short once
    decodes = [p for p in probes if p.label.startswith("decode")]
    assert all(p.seconds < BUSY_S for p in decodes), decodes
    law = fit_law(probes)
    assert law.step_s(16, 16, 0, 16 * 512) > law.step_s(1, 1, 0, 512)


def test_a_quiet_start_up_runs_no_step_twice_more():
    quiet, busy = BusyAtFirst("none", 0), BusyAtFirst("prefill", 5)
    probe(quiet)
    probe(busy)
    # the ramp (warm-up + 6 sizes x2), 2 deep chunks (warm-up + 2 x2), 4 decode shapes
    # (warm-up + 4 x2)
    assert quiet.calls == 13 + 5 + 9
    assert busy.calls == quiet.calls + 4  # the two slowed sizes, two more runs each
