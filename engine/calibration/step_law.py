"""What a step costs on this device, by its composition: the law the scheduler holds each
step to `target_step_ms` with (engine/calibration/budget_fit.py measures it at start-up).

    step_s ~= fixed_s + token_s * tokens
              + prefill_pair_s * prefill_pairs + decode_kv_s * decode_context

`tokens`: every token the step runs (one per decode, a chunk's worth per prefill chunk).
`prefill_pairs`: the (query, key) pairs of the prefill chunks' attention: a chunk of n
tokens from position `start` attends n * start + n * (n + 1) / 2 of them (compute-bound).
`decode_context`: the KV tokens the decodes read, each decode its whole context
(memory-bound: on this CPU a decode's context token costs ~10x a prefill pair).

A chunk's tokens grow its cost linearly through `token_s` and quadratically through its own
attention, so at the same budget a chunk deep into a 4k prompt costs ~4x the first chunk:
a law in tokens alone (the budgets' unit) cannot keep such steps under a target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.calibration.least_squares import fit_nonnegative

FEATURES = ("fixed", "tokens", "prefill_pairs", "decode_context")


def chunk_pairs(start: int, num_tokens: int) -> int:
    """(query, key) pairs of a causal chunk of `num_tokens` after `start` cached tokens."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


@dataclass(frozen=True)
class StepLaw:
    """Seconds per step from its composition (see the module docstring); all >= 0."""

    fixed_s: float
    token_s: float
    prefill_pair_s: float
    decode_kv_s: float

    def step_s(self, tokens: int, prefill_pairs: int, decode_context: int) -> float:
        return (self.fixed_s + self.token_s * tokens + self.prefill_pair_s * prefill_pairs
                + self.decode_kv_s * decode_context)

    def decode_s(self, context: int) -> float:
        """One decode whose token attends `context` KV tokens (its own included)."""
        return self.token_s + self.decode_kv_s * context

    def chunk_s(self, start: int, num_tokens: int) -> float:
        return self.token_s * num_tokens + self.prefill_pair_s * chunk_pairs(start, num_tokens)

    def affordable_chunk(self, start: int, seconds: float) -> int:
        """The most tokens a chunk from `start` may run within `seconds` (0 if none)."""
        if seconds <= 0:
            return 0
        # chunk_s(start, n) = (p/2) n^2 + (t + p (start + 1/2)) n: solve for its root.
        p, linear = self.prefill_pair_s, self.token_s + self.prefill_pair_s * (start + 0.5)
        if p <= 0:
            return math.floor(seconds / linear) if linear > 0 else 1 << 30
        n = (-linear + math.sqrt(linear * linear + 2 * p * seconds)) / p
        return max(0, math.floor(n + 1e-9))

    def to_dict(self) -> dict:
        return {"fixed_ms": round(1000 * self.fixed_s, 3),
                "token_ms": round(1000 * self.token_s, 5),
                "prefill_pair_us": round(1e6 * self.prefill_pair_s, 6),
                "decode_kv_us": round(1e6 * self.decode_kv_s, 6)}

    @classmethod
    def from_dict(cls, d: dict) -> StepLaw:
        """The inverse of `to_dict` (e.g. from a trace's run settings)."""
        return cls(d["fixed_ms"] / 1000, d["token_ms"] / 1000, d["prefill_pair_us"] / 1e6,
                   d["decode_kv_us"] / 1e6)


@dataclass(frozen=True)
class StepProbe:
    """One measured step: what it ran and how long it took."""

    tokens: int
    prefill_pairs: int
    decode_context: int
    seconds: float
    label: str  # e.g. "prefill 64 @0", "decode 16 x 1024"

    def row(self) -> list[float]:
        return [1.0, float(self.tokens), float(self.prefill_pairs), float(self.decode_context)]


def fit_law(probes: list[StepProbe]) -> StepLaw:
    """The non-negative least-squares law over the probes; ValueError with none."""
    if not probes:
        raise ValueError("no probe steps to fit a step law to")
    X = np.array([p.row() for p in probes])
    y = np.array([p.seconds for p in probes])
    if len(probes) < len(FEATURES):  # too few to separate the terms: tokens alone
        slope = float(y.sum() / max(X[:, 1].sum(), 1.0))
        return StepLaw(0.0, slope, 0.0, 0.0)
    coef = fit_nonnegative(X, y)
    return StepLaw(*(float(c) for c in coef))


def law_error_pct(law: StepLaw, probes: list[StepProbe]) -> float:
    """The largest |predicted - measured| / measured over the probes, in %."""
    worst = 0.0
    for p in probes:
        predicted = law.step_s(p.tokens, p.prefill_pairs, p.decode_context)
        worst = max(worst, abs(predicted - p.seconds) / max(p.seconds, 1e-9) * 100)
    return worst
