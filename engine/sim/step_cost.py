"""Step times shaped like the CPU engine's, for simulations that must not be linear.

The SimulatedExecutor's own cost (fixed + per prefill token + per decode token) is exactly
the law the what-if fit assumes, so a trace recorded under it cannot show what a fit misses.
CpuLikeStepCost has the shapes a real step has:

    step_s = (fixed_s + prefill_token_s * prefill_tokens + decode_token_s * decodes
              + seq_s * sequences
              + prefill_pair_s * sum over chunks of (query x key) pairs    # quadratic
              + decode_kv_s * sum over decodes of context) * noise

A chunk of n tokens after `start` cached ones attends n * start + n (n + 1) / 2 pairs
(engine/step_law.chunk_pairs): a whole prompt costs its length squared; a decode reads its
whole context (its computed tokens and the one it adds). noise: lognormal with mean 1,
seeded, one draw per step.

The defaults are SmolLM2-135M on 2 threads of the CPU engine (bench/RESULTS.md, "Fused work
between projections": quiet VM, ms per ModelRunner.execute):
- prefill_pair_s 0.64 us: one 2046-token prompt took 1760 ms, 2046 tokens in 22 prompts
  472 ms: 1288 ms more for ~2.0 M more (query, key) pairs;
- prefill_token_s 0.19 ms: the 22-prompt step less the fixed cost and its 96 k pairs,
  over 2046 tokens (the model predicts 475 and 1750 ms for those two steps);
- decode_kv_s 2.6 us: decode attention of 64 decodes over 150 tokens took 25.3 ms;
- fixed_s 20 ms, decode_token_s + seq_s 0.3 ms: decode steps at context 128 took 41.9 /
  69.1 / 106.4 ms at 24 / 64 / 128 decodes (0.62 ms a decode, 0.33 of it attention) and
  13-20 ms at one; the model gives 35 / 61 / 101 and 21;
- seq_s 0.2 ms (assumed): the per-sequence calls of a step (one SDPA call per prompt per
  layer, 30 layers; a sampling row, 4.4 ms for 64);
- noise 0.05: the rounds of those benchmarks spread about +-5% around their medians.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from engine.calibration.step_law import chunk_pairs
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import Request, SamplingParams

__all__ = ["CostProber", "CpuLikeStepCost"]


@dataclass
class CpuLikeStepCost:
    """`cost(out)`: seconds of the step `out`, noise included (see the module docstring).
    Deterministic for a seed and the same sequence of steps."""

    fixed_s: float = 0.020
    prefill_token_s: float = 0.19e-3
    decode_token_s: float = 0.1e-3
    seq_s: float = 0.2e-3
    prefill_pair_s: float = 0.64e-6
    decode_kv_s: float = 2.6e-6
    noise: float = 0.05  # sigma of the lognormal factor; 0: none
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("fixed_s", "prefill_token_s", "decode_token_s", "seq_s",
                     "prefill_pair_s", "decode_kv_s", "noise"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value} must be a finite number >= 0")
        self._rng = random.Random(self.seed)

    def exact_s(self, out: SchedulerOutput) -> float:
        """The step's time without noise."""
        pairs = sum(chunk_pairs(c.request.num_computed_tokens, c.num_tokens)
                    for c in out.prefills)
        # each decode attends to its computed tokens and the one it adds
        context = sum(r.num_computed_tokens for r in out.decodes) + len(out.decodes)
        return (self.fixed_s + self.prefill_token_s * out.num_prefill_tokens
                + self.decode_token_s * out.num_decode_tokens + self.seq_s * out.num_seqs
                + self.prefill_pair_s * pairs + self.decode_kv_s * context)

    def __call__(self, out: SchedulerOutput) -> float:
        if self.noise == 0:
            return self.exact_s(out)
        # mean 1: exp(N(-sigma^2 / 2, sigma))
        return self.exact_s(out) * self._rng.lognormvariate(-self.noise ** 2 / 2, self.noise)


class CostProber:
    """The start-up probe's `StepProber` (engine/calibration/probe.py) over a step cost
    instead of a model: each probe step costs what `cost` says of it (noise included), so
    a simulated server fits its step law as a real one does."""

    def __init__(self, cost: CpuLikeStepCost):
        self.cost = cost

    def prefill(self, start: int, num_tokens: int) -> float:
        req = _probe_request(start + num_tokens)
        req.num_computed_tokens = start
        return self.cost(SchedulerOutput(-1, [], [PrefillChunk(req, num_tokens, True)], 0,
                                         num_tokens, num_prefill_tokens=num_tokens))

    def decodes(self, batch: int, context: int) -> float:
        reqs = []
        for _ in range(batch):
            req = _probe_request(context)
            req.num_computed_tokens = context - 1
            reqs.append(req)
        return self.cost(SchedulerOutput(-1, reqs, [], 0, batch, num_decode_tokens=batch))


def _probe_request(num_tokens: int) -> Request:
    return Request("probe", [0] * num_tokens, SamplingParams(temperature=0.0, max_tokens=1),
                   0.0)
