"""The start-up probe (engine/calibration/probe.py) under a busy CPU: a step measured slower
than a bigger one of its family is run again, so the fitted law still grows with the
step; a quiet start-up runs no extra step."""

from __future__ import annotations

from types import SimpleNamespace

from engine.calibration.probe import RunnerProbe, measure
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


def test_decode_probes_fit_a_pool_that_is_not_a_whole_number_of_blocks_per_decode():
    """Each decode of a probe has whole blocks of its own: in a pool of 62 blocks of 16, a
    batch of 16 decodes gets 3 blocks (48 tokens) each, not 62 tokens (4 blocks each, 64 in
    all: more than the pool, and the start-up would fail)."""
    runner = SimpleNamespace(num_kv_blocks=62, block_size=16, kv_caches=[],
                             device=SimpleNamespace(type="cpu"), execute=lambda out: None)
    prober = RunnerProbe(runner)
    probes = measure(prober, 0.25, max_tokens=256, max_context=512,
                     pool_tokens=prober.pool_tokens, max_batch=64, block_size=16)
    decodes = [p.label for p in probes if p.label.startswith("decode")]
    assert "decode 16 x 48" in decodes and prober.blocks_used <= 62


def test_a_decode_probe_computes_the_last_token_of_its_context_inside_its_blocks():
    """A decode probe of context c computes position c - 1 (the step a real decode is):
    reading the other c - 1 from its own blocks, and writing inside them too."""
    steps = []
    runner = SimpleNamespace(num_kv_blocks=4096, block_size=16, kv_caches=[],
                             device=SimpleNamespace(type="cpu"), execute=steps.append)
    RunnerProbe(runner).decodes(4, 64)
    (out,) = steps
    assert [len(r.token_ids) for r in out.decodes] == [64] * 4
    for req in out.decodes:
        assert req.num_computed_tokens == 63
        assert req.num_computed_tokens < len(req.block_ids) * 16


def test_a_decode_probe_records_the_context_every_decode_of_its_batch_reads():
    """`decode 16 x 1024` reads 16 contexts of 1024: the law's KV term is fitted on 16384
    context tokens, not 1024 (which would price a batch's KV reads 16 times too high)."""
    probes = probe(BusyAtFirst("none", 0))
    decodes = {p.label: p for p in probes if p.label.startswith("decode")}
    assert decodes["decode 16 x 1024"].decode_context == 16 * 1024
    assert all(p.decode_context == p.decodes * int(label.split(" x ")[1])
               for label, p in decodes.items())


def test_decode_probes_may_fill_the_whole_pool():
    """A pool of 64 blocks of 16 gives a batch of 16 decodes 4 blocks each: all 64, which
    fit (a pool whose blocks divide evenly among the batch is the usual case)."""
    runner = SimpleNamespace(num_kv_blocks=64, block_size=16, kv_caches=[],
                             device=SimpleNamespace(type="cpu"), execute=lambda out: None)
    prober = RunnerProbe(runner)
    probes = measure(prober, 0.25, max_tokens=256, max_context=512,
                     pool_tokens=prober.pool_tokens, max_batch=64, block_size=16)
    assert "decode 16 x 64" in [p.label for p in probes] and prober.blocks_used == 64


def test_a_step_budget_under_two_ramp_sizes_still_probes_two_prefill_sizes():
    """max_num_batched_tokens of 16 leaves one size of the 16, 32, ... ramp: the ramp
    probes 8 and 16 tokens instead, so the law still has a cost per prompt token."""
    probes = measure(BusyAtFirst("none", 0), 0.25, max_tokens=16, max_context=2048,
                     pool_tokens=16384, max_batch=64, block_size=16)
    assert [p.tokens for p in probes if p.label.endswith("@0")] == [8, 16]
    law = fit_law(probes)
    assert law.step_s(16, 0, chunk_pairs(0, 16), 0) > law.step_s(8, 0, chunk_pairs(0, 8), 0)
