"""The start-up measurement behind the step law: a few real steps of known composition.

    probes = measure(prober, target_s, max_tokens=2048, max_context=8192,
                     pool_tokens=23296, max_batch=64)
    law = fit_law(probes)                       # engine/calibration/step_law.py

Three families of probe steps, each the best of two runs after a warm-up of the family
(first calls allocate buffers and build kernels for new shapes: not the law), in order of
growing work; a step measured slower than a bigger one of its family ran beside another
process (start-up under load: CI, a neighbour) and is run again (`_settle`):
  1. prefill chunks of 16, 32, 64, ... tokens from position 0, until one takes half the
     target, `max_tokens` or PROBE_MAX_S (the fixed cost and the cost per token);
  2. one chunk deep into a long prompt, at two depths (the chunk's attention over what is
     cached: it grows with the position, and dominates chunks deep into 4k prompts);
  3. a batch of decodes at two context lengths (KV read per decode token: memory-bound),
     and one and a quarter batch of decodes at the shorter (a step of decodes alone runs
     its own code: its fixed cost and cost per decode are not a prompt step's).
Every probe runs in blocks 0.. of a still-empty KV pool; `RunnerProbe.clear` zeroes them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import torch

from engine.calibration.step_law import StepProbe, chunk_pairs
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request, SamplingParams

MIN_CHUNK = 16  # tokens; also the first probe size
PROBE_MAX_S = 2.0  # the prefill ramp starts no new size after this long (past MIN_POINTS)
MIN_POINTS = 3
DEEP_CHUNK = 64  # tokens of the deep-prefill probes
DECODE_BATCH = 16  # sequences of the decode probes (fewer if max_num_seqs is lower)
MAX_PROBE_CONTEXT = 2048  # deeper contexts cost linearly more: no need to probe them
# Rounds of re-runs for a family's out-of-order steps. On 2 busy cores a 16-token probe of
# the tests' tiny model took longer than its 512-token one (0.9 against 2.1 ms alone), and
# the non-negative fit priced every step the same (12.6 ms, every per-token term 0).
SETTLE_ROUNDS = 4


class StepProber(Protocol):
    def prefill(self, start: int, num_tokens: int) -> float: ...
    def decodes(self, batch: int, context: int) -> float: ...


def measure(prober: StepProber, target_s: float, *, max_tokens: int, max_context: int,
            pool_tokens: int, max_batch: int, block_size: int = 1,
            clock: Callable[[], float] = time.perf_counter) -> list[StepProbe]:
    """The probe steps of the three families (module docstring); `max_context`: the
    longest sequence (model length, KV pool), `pool_tokens`: the KV pool's tokens, in
    blocks of `block_size` (every decode of a probe has whole blocks of its own),
    `max_batch`: the most decodes a step holds."""
    probes = _prefill_ramp(prober, target_s, max_tokens, clock)
    deep = min(DEEP_CHUNK, max_tokens)
    deepest = min(max_context, MAX_PROBE_CONTEXT) - deep
    starts = [s for s in sorted({deepest // 4, deepest}) if s >= 4 * deep]  # shallower:
    probes += _family([(deep, s) for s in starts],  # the ramp's own chunks already say it
                      lambda n, s: prober.prefill(s, n),
                      lambda n, s, t: StepProbe(n, 0, chunk_pairs(s, n), 0, t,
                                                f"prefill {n} @{s}"))
    batch = max(1, min(DECODE_BATCH, max_batch))
    per_decode = pool_tokens // block_size // batch * block_size  # whole blocks each
    longest = min(per_decode, max_context, MAX_PROBE_CONTEXT)
    short = max(1, longest // 4)
    shapes = [(b, short) for b in sorted({1, max(1, batch // 4), batch})]
    shapes += [(batch, longest)] if longest > short else []
    probes += _family(shapes, prober.decodes,
                      lambda b, c, t: StepProbe(b, b, 0, b * c, t, f"decode {b} x {c}"))
    return probes


def _prefill_ramp(prober: StepProber, target_s: float, max_tokens: int,
                  clock: Callable[[], float]) -> list[StepProbe]:
    sizes = [MIN_CHUNK << i for i in range(32) if MIN_CHUNK << i <= max_tokens]
    if len(sizes) < 2:
        sizes = [max(1, max_tokens // 2), max_tokens]
    started = clock()
    prober.prefill(0, sizes[0])  # warm-up: first-call allocations are not the law
    probes: list[StepProbe] = []
    for tokens in sizes:
        seconds = min(prober.prefill(0, tokens), prober.prefill(0, tokens))
        probes.append(StepProbe(tokens, 0, chunk_pairs(0, tokens), 0, seconds,
                                f"prefill {tokens} @0"))
        long_enough = seconds >= target_s / 2 or clock() - started > PROBE_MAX_S
        if len(probes) >= MIN_POINTS and long_enough:
            break
    return _settle(probes, [lambda n=p.tokens: prober.prefill(0, n) for p in probes])


def _family(shapes: list[tuple[int, int]], run: Callable[[int, int], float],
            probe: Callable[[int, int, float], StepProbe]) -> list[StepProbe]:
    """Each shape's best of two runs, after one warm-up run of the family's first;
    `shapes` in order of growing work."""
    if not shapes:
        return []
    run(*shapes[0])
    probes = [probe(*shape, min(run(*shape), run(*shape))) for shape in shapes]
    return _settle(probes, [lambda shape=shape: run(*shape) for shape in shapes])


def _settle(probes: list[StepProbe], reruns: list[Callable[[], float]]) -> list[StepProbe]:
    """`probes` of one family in order of growing work, each with its re-run: a step
    slower than a later, bigger one keeps the best of itself and two more runs, for up to
    SETTLE_ROUNDS rounds (a bigger step of the same code does not run faster; a
    measurement that says so was slowed by something else)."""
    probes = list(probes)
    for _ in range(SETTLE_ROUNDS):
        faster_after = math.inf
        late = []
        for i in reversed(range(len(probes))):
            if probes[i].seconds > faster_after:
                late.append(i)
            faster_after = min(faster_after, probes[i].seconds)
        if not late:
            break
        for i in late:
            best = min(probes[i].seconds, reruns[i](), reruns[i]())
            probes[i] = replace(probes[i], seconds=best)
    return probes


class RunnerProbe:
    """`StepProber` over the real ModelRunner, before any engine owns its KV pool. Probe
    requests take blocks 0..; `clear` zeroes every block a probe touched, so the pool is
    handed over as allocated."""

    def __init__(self, runner):
        self.runner = runner
        self.blocks_used = 0

    @property
    def pool_tokens(self) -> int:
        return self.runner.num_kv_blocks * self.runner.block_size

    def prefill(self, start: int, num_tokens: int) -> float:
        req = self._request("step-fit-prefill", start + num_tokens, first_block=0)
        req.num_computed_tokens = start
        return self._time(SchedulerOutput(
            step_id=-1, decodes=[], prefills=[PrefillChunk(req, num_tokens, True)],
            config_version=0, token_budget=num_tokens, num_prefill_tokens=num_tokens))

    def decodes(self, batch: int, context: int) -> float:
        per_seq = -(-context // self.runner.block_size)
        reqs = []
        for i in range(batch):  # each its own blocks: shared ones would sit in cache
            req = self._request(f"step-fit-decode-{i}", context, first_block=i * per_seq)
            req.num_computed_tokens = context - 1
            reqs.append(req)
        return self._time(SchedulerOutput(
            step_id=-1, decodes=reqs, prefills=[], config_version=0, token_budget=batch,
            num_decode_tokens=batch))

    def _request(self, request_id: str, num_tokens: int, first_block: int) -> Request:
        num_blocks = -(-num_tokens // self.runner.block_size)
        if first_block + num_blocks > self.runner.num_kv_blocks:
            raise ValueError(f"a probe of {num_tokens} tokens from block {first_block} needs"
                             f" more than the pool's {self.runner.num_kv_blocks} blocks")
        self.blocks_used = max(self.blocks_used, first_block + num_blocks)
        req = Request(request_id, [0] * num_tokens, SamplingParams(temperature=0.0,
                                                                    max_tokens=1), 0.0)
        req.block_ids = list(range(first_block, first_block + num_blocks))
        return req

    def _time(self, out: SchedulerOutput) -> float:
        runner = self.runner
        cuda = runner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(runner.device)
        start = time.perf_counter()
        runner.execute(out)
        if cuda:
            torch.cuda.synchronize(runner.device)
        return time.perf_counter() - start

    def clear(self) -> None:
        with torch.inference_mode():
            for k_cache, v_cache in self.runner.kv_caches:
                k_cache[: self.blocks_used].zero_()
                v_cache[: self.blocks_used].zero_()
