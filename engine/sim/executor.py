"""A model-free executor: deterministic tokens, EOS by a rule, optional time cost.

Tokens depend only on the request's content and position, so a request recomputed
after preemption produces the same tokens, and runs are reproducible.

With a shadow KV (the default once the engine has told it the pool's block size, see
`bind_kv_pool`), each step also writes every token it computes into its slot through the
request's block table and reads each sequence's whole context back, as a model would
(engine/sim/shadow_kv.py): a block table, prefix hit or chunk the scheduler got wrong
raises `ShadowKVMismatch` in `execute()` (an AssertionError: a bug, never a fault of
the step; the engine contains it like any executor error, so tests also find each one in
`shadow_mismatches`). The sampled token is derived from the read-back context, which the
check has shown equal to the request's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.records import SchedulerOutput
from engine.request import Request
from engine.sim.shadow_kv import SeqRun, ShadowKV, ShadowKVMismatch

__all__ = ["FakeClock", "ShadowKVMismatch", "SimulatedExecutor"]


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
    """`execute()` returns one token per sample row. Tokens are a function of the
    request's first and last token and its length; EOS about 1 in `eos_every`.

    shadow_kv: check every step through a shadow KV pool (needs `block_size`, given here or
    by the engine through `bind_kv_pool`; without one no check runs). One executor serves
    one engine: a second engine's block ids would clobber the first's shadow slots.
    """

    vocab_size: int = 32000
    eos_token_id: int = 2
    eos_every: int | None = None  # about 1 in eos_every tokens is EOS; None: never
    step_cost_s: float = 0.0  # fixed cost of a step
    prefill_token_cost_s: float = 0.0  # per prompt token computed
    decode_token_cost_s: float = 0.0  # per decode token
    # replaces the three linear costs above: seconds of a step from its work (e.g.
    # engine/sim/step_cost.py's CpuLikeStepCost: attention, per-sequence cost, noise)
    cost_model: Callable[[SchedulerOutput], float] | None = None
    clock: FakeClock | None = None  # advanced by the cost; else the cost is slept
    shadow_kv: bool = True
    block_size: int | None = None  # the KV pool's; None until bind_kv_pool
    shadow: ShadowKV | None = field(default=None, init=False, repr=False)
    # every mismatch raised, also when the engine contains the step's failure (StepFailure)
    shadow_mismatches: list[ShadowKVMismatch] = field(default_factory=list, init=False,
                                                      repr=False)

    def __post_init__(self) -> None:
        if self.block_size is not None:
            self.bind_kv_pool(0, self.block_size)

    def bind_kv_pool(self, num_blocks: int, block_size: int) -> None:
        """Called by the engine with its pool's shape; starts an empty shadow pool."""
        if self.block_size is not None and block_size != self.block_size:
            raise ValueError(f"{block_size=} must equal the executor's block_size="
                             f"{self.block_size} (one executor per engine)")
        self.block_size = block_size
        self.shadow = ShadowKV(block_size, num_blocks) if self.shadow_kv else None

    def next_token(self, req: Request) -> int:
        """The token after `req.token_ids` (the reference the shadow path must match)."""
        tokens = req.token_ids
        return self._token(tokens[0], tokens[-1], len(tokens))

    def _token(self, first: int, last: int, length: int) -> int:
        h = (first * 1_000_003 + last * 7919 + length * 104_729) & 0x7FFFFFFF
        if self.eos_every and h % self.eos_every == 0:
            return self.eos_token_id
        return 3 + h % (self.vocab_size - 3)  # 0..2 are special ids

    def execute(self, out: SchedulerOutput) -> list[int]:
        if self.shadow is not None:
            try:
                sampled = self._execute_shadow(out)
            except ShadowKVMismatch as exc:
                self.shadow_mismatches.append(exc)
                raise
        else:
            sampled = [self.next_token(r) for r in out.sample_requests()]
        if self.cost_model is not None:
            cost = self.cost_model(out)
        else:
            cost = (self.step_cost_s + self.prefill_token_cost_s * out.num_prefill_tokens
                    + self.decode_token_cost_s * out.num_decode_tokens)
        if self.clock is not None:
            self.clock.advance(cost)
        elif cost > 0:
            time.sleep(cost)
        return sampled

    def _execute_shadow(self, out: SchedulerOutput) -> list[int]:
        """Write every computed token's slot, then read back every sequence's context;
        sample from what was read. Sample rows: decodes, then sampled prefill chunks."""
        shadow = self.shadow
        assert shadow is not None
        seqs = [SeqRun(r.request_id, r.block_ids, r.token_ids, r.num_computed_tokens,
                       r.num_computed_tokens + 1) for r in out.decodes]  # one token each
        seqs += [SeqRun(c.request.request_id, c.request.block_ids, c.request.token_ids,
                        c.request.num_computed_tokens,
                        c.request.num_computed_tokens + c.num_tokens) for c in out.prefills]
        read = shadow.run_step(seqs, out.step_id)
        is_row = [True] * len(out.decodes) + [c.sample for c in out.prefills]
        # read back and checked: the request's own tokens, position by position
        return [self._token(*r) for r, row in zip(read, is_row, strict=True) if row]
