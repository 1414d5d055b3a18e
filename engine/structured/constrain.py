"""The engine thread's part of structured output: each constrained request's matcher, and the
step's token mask on the logits of the rows that have a grammar.

A request's matcher (`GrammarState`, on `Request.grammar`) is created at its first sample
from the grammar its frontend compiled. Before each sample it first accepts the output
tokens it has not seen (normally the one sampled last step): catching up from the request's
own tokens, rather than accepting at sampling time, keeps it right when a failed step is
re-run in halves (engine/fault_isolation.py) or a preempted request is recomputed. A token the
grammar refuses raises, which fails the request (ERROR) instead of emitting invalid JSON.

Masking is batched: one int32 bitmask [R, ceil(V / 32)] for the step's R sample rows
(rows without a grammar stay all ones), filled row by row by xgrammar (microseconds a row)
and and-ed with the cache's token filter, applied once by xgrammar's kernel to a copy of
the logits (the input is not changed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr

from engine.request import Request


@dataclass(slots=True)
class GrammarState:
    """One request's position in its grammar: `num_accepted` output tokens accepted;
    token_filter: the tokens that may appear at all (grammar.CompiledFormat)."""

    matcher: xgr.GrammarMatcher
    token_filter: torch.Tensor
    num_accepted: int = 0


def grammar_state(req: Request, vocab_size: int) -> GrammarState:
    """The request's matcher, caught up with its output tokens. Raises ValueError when the
    spec was never compiled, was compiled for another vocabulary, or a token breaks it."""
    state = req.grammar
    if state is None:
        spec = req.sampling_params.structured_output
        compiled = spec.compiled  # a grammar.CompiledFormat
        if compiled is None:
            raise ValueError(f"request {req.request_id}: structured_output was not compiled;"
                             " submit it through LLM or the server, or bind it with"
                             " engine.structured.grammar.cache_for(...).bind(spec)")
        compiled_vocab = compiled.grammar.tokenizer_info.vocab_size
        if compiled_vocab != vocab_size:
            raise ValueError(f"request {req.request_id}: its grammar was compiled for"
                             f" {compiled_vocab} tokens, the model's logits have {vocab_size}")
        state = req.grammar = GrammarState(xgr.GrammarMatcher(compiled.grammar),
                                           compiled.token_filter)
    start = req.num_prompt_tokens + state.num_accepted
    for token in req.token_ids[start:]:
        if not state.matcher.accept_token(token):
            raise ValueError(f"request {req.request_id}: output token {token} (at output"
                             f" position {state.num_accepted}) breaks its grammar")
        state.num_accepted += 1
    return state


def constrain_logits(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Logits [R, V] (float32) -> a new [R, V] tensor where, in every row whose request has
    a structured output, the tokens its grammar cannot take next are -inf. Rows without one
    are copied unchanged."""
    rows, vocab = logits.shape
    bitmask = xgr.allocate_token_bitmask(rows, vocab)  # all ones: every token allowed
    constrained = []
    by_filter: dict[int, tuple[torch.Tensor, list[int]]] = {}  # one filter per model
    for i, req in enumerate(requests):
        if req.sampling_params.structured_output is not None:
            state = grammar_state(req, vocab)
            state.matcher.fill_next_token_bitmask(bitmask, i)
            by_filter.setdefault(id(state.token_filter), (state.token_filter, []))[1].append(i)
            constrained.append(i)
    for token_filter, filtered in by_filter.values():  # no raw control characters
        bitmask[filtered] &= token_filter
    out = logits.clone(memory_format=torch.contiguous_format)
    xgr.apply_token_bitmask_inplace(out, bitmask.to(out.device, non_blocking=True),
                                    vocab_size=vocab, indices=constrained)
    return out
