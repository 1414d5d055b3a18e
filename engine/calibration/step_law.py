"""What a step costs on this device, by its composition: the law the scheduler holds each
step to `target_step_ms` with (engine/calibration/budget_fit.py measures it at start-up).

A step with a prompt chunk (its decodes ride along as rows of the same matrices):

    step_s ~= fixed_s + token_s * tokens
              + prefill_pair_s * prefill_pairs + decode_kv_s * decode_context

A step of decodes alone may run other code (on this CPU the native decode layers on the
AMX tiles, one row on the Q4_1 GEMV), with its own fixed and per-decode costs:

    step_s ~= decode_fixed_s + decode_row_s * decodes + decode_kv_s * decode_context

`tokens`: every token the step runs (one per decode, a chunk's worth per prefill chunk);
`decodes`: how many of them are decodes (a step is decodes alone when decodes == tokens).
`prefill_pairs`: the (query, key) pairs of the prefill chunks' attention: a chunk of n
tokens from position `start` attends n * start + n * (n + 1) / 2 of them (compute-bound).
`decode_context`: the KV tokens the decodes read, each decode its whole context
(memory-bound: on this CPU a decode's context token costs ~10x a prefill pair).

A chunk's tokens grow its cost linearly through `token_s` and quadratically through its own
attention, so at the same budget a chunk deep into a 4k prompt costs ~4x the first chunk:
a law in tokens alone (the budgets' unit) cannot keep such steps under a target. And one
law for both kinds of step was off by 2x either way on this CPU's decode steps (a lone
decode predicted at 19 ms took 8-13; 48 decodes predicted at 47 ms took 71), so the
measured/predicted ratio moved with the number of requests running and read as drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.calibration.least_squares import fit_nonnegative

FEATURES = ("fixed", "tokens", "prefill_pairs", "decode_context", "decode_fixed", "decodes")
StepFeatures = tuple[int, int, int, int]  # (tokens, decodes, prefill pairs, decode context)


def decodes_alone(tokens: int, decodes: int) -> bool:
    """Whether a step of `tokens` tokens, `decodes` of them decodes, has no prompt chunk."""
    return decodes >= tokens


def chunk_pairs(start: int, num_tokens: int) -> int:
    """(query, key) pairs of a causal chunk of `num_tokens` after `start` cached tokens."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


@dataclass(frozen=True)
class StepLaw:
    """Seconds per step from its composition (see the module docstring); all >= 0. A law
    made without the decode-step terms prices a decode-only step as a prompt step (the
    one law of old traces and of tests)."""

    fixed_s: float
    token_s: float
    prefill_pair_s: float
    decode_kv_s: float
    decode_fixed_s: float | None = None  # None: fixed_s
    decode_row_s: float | None = None  # None: token_s

    def __post_init__(self) -> None:
        if self.decode_fixed_s is None:
            object.__setattr__(self, "decode_fixed_s", self.fixed_s)
        if self.decode_row_s is None:
            object.__setattr__(self, "decode_row_s", self.token_s)

    def step_s(self, tokens: int, decodes: int, prefill_pairs: int, decode_context: int,
               ) -> float:
        """A step of `tokens` tokens, `decodes` of them decodes (StepFeatures' order)."""
        if decodes_alone(tokens, decodes):
            return (self.decode_fixed_s + self.decode_row_s * decodes
                    + self.decode_kv_s * decode_context)
        return self.with_prompt_s(tokens, prefill_pairs, decode_context)

    def with_prompt_s(self, tokens: int, prefill_pairs: int, decode_context: int) -> float:
        """A step with a prompt chunk: what a step becomes once a chunk joins it."""
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
            # (+1e-9: a fitted law's float error must not cost the last whole token)
            return math.floor(seconds / linear + 1e-9) if linear > 0 else 1 << 30
        n = (-linear + math.sqrt(linear * linear + 2 * p * seconds)) / p
        return max(0, math.floor(n + 1e-9))

    def to_dict(self) -> dict:
        return {"fixed_ms": round(1000 * self.fixed_s, 3),
                "token_ms": round(1000 * self.token_s, 5),
                "prefill_pair_us": round(1e6 * self.prefill_pair_s, 6),
                "decode_kv_us": round(1e6 * self.decode_kv_s, 6),
                "decode_fixed_ms": round(1000 * self.decode_fixed_s, 3),
                "decode_row_ms": round(1000 * self.decode_row_s, 5)}

    @classmethod
    def from_dict(cls, d: dict) -> StepLaw:
        """The inverse of `to_dict` (e.g. from a trace's run settings; a trace written
        before the decode-step terms has none: its law prices decode steps as before)."""
        decode_fixed, decode_row = d.get("decode_fixed_ms"), d.get("decode_row_ms")
        return cls(d["fixed_ms"] / 1000, d["token_ms"] / 1000, d["prefill_pair_us"] / 1e6,
                   d["decode_kv_us"] / 1e6,
                   None if decode_fixed is None else decode_fixed / 1000,
                   None if decode_row is None else decode_row / 1000)


@dataclass(frozen=True)
class StepProbe:
    """One measured step: what it ran (StepFeatures) and how long it took."""

    tokens: int
    decodes: int
    prefill_pairs: int
    decode_context: int
    seconds: float
    label: str  # e.g. "prefill 64 @0", "decode 16 x 1024"

    @property
    def features(self) -> StepFeatures:
        return self.tokens, self.decodes, self.prefill_pairs, self.decode_context

    def row(self) -> list[float]:
        """The step's values of FEATURES: each kind of step has its own fixed and per-token
        columns, zero in the other kind's."""
        alone = float(decodes_alone(self.tokens, self.decodes))
        prompt = 1.0 - alone
        return [prompt, prompt * self.tokens, float(self.prefill_pairs),
                float(self.decode_context), alone, alone * self.decodes]


def fit_law(probes: list[StepProbe]) -> StepLaw:
    """The non-negative least-squares law over the probes; ValueError with none. Without
    steps of decodes alone (or of prompts), that kind is priced as the other."""
    if not probes:
        raise ValueError("no probe steps to fit a step law to")
    if len(probes) < len(FEATURES) - 2:  # too few to separate the terms: tokens alone
        slope = sum(p.seconds for p in probes) / max(sum(p.tokens for p in probes), 1)
        return StepLaw(0.0, slope, 0.0, 0.0)
    kinds = {decodes_alone(p.tokens, p.decodes) for p in probes}
    columns = list(range(len(FEATURES)))
    if kinds != {True, False}:  # one kind: fit the prompt step's columns to it
        probes = [StepProbe(p.tokens, 0, p.prefill_pairs, p.decode_context, p.seconds,
                            p.label) for p in probes]
        columns = columns[:4]
    X = np.array([p.row() for p in probes])[:, columns]
    y = np.array([p.seconds for p in probes])
    coef = fit_nonnegative(X, y)
    return StepLaw(*(float(c) for c in coef))


def law_error_pct(law: StepLaw, probes: list[StepProbe]) -> float:
    """The largest |predicted - measured| / measured over the probes, in %."""
    worst = 0.0
    for p in probes:
        predicted = law.step_s(*p.features)
        worst = max(worst, abs(predicted - p.seconds) / max(p.seconds, 1e-9) * 100)
    return worst
