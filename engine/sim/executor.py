"""A model-free executor: deterministic tokens, EOS by a rule, optional time cost.

Tokens depend only on the request's content and position, so a request recomputed
after preemption produces the same tokens, and runs are reproducible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.records import SchedulerOutput
from engine.request import Request


class FakeClock:
    """A clock tests and simulations advance by hand (seconds)."""

    def __init__(self, start: float = 1_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class SimulatedExecutor:
    vocab_size: int = 32000
    eos_token_id: int = 2
    eos_every: int | None = None  # about 1 in eos_every tokens is EOS; None: never
    step_cost_s: float = 0.0  # fixed cost of a step
    prefill_token_cost_s: float = 0.0  # per prompt token computed
    decode_token_cost_s: float = 0.0  # per decode token
    clock: FakeClock | None = None  # advanced by the cost; else the cost is slept

    def next_token(self, req: Request) -> int:
        tokens = req.token_ids
        h = (tokens[0] * 1_000_003 + tokens[-1] * 7919 + len(tokens) * 104_729) & 0x7FFFFFFF
        if self.eos_every and h % self.eos_every == 0:
            return self.eos_token_id
        token = 3 + h % (self.vocab_size - 3)  # 0..2 are special ids
        return token

    def execute(self, out: SchedulerOutput) -> list[int]:
        sampled = [self.next_token(r) for r in out.sample_requests()]
        cost = (self.step_cost_s + self.prefill_token_cost_s * out.num_prefill_tokens
                + self.decode_token_cost_s * out.num_decode_tokens)
        if self.clock is not None:
            self.clock.advance(cost)
        elif cost > 0:
            time.sleep(cost)
        return sampled
