"""Logits processors: the changes to a row's logits that move which token is most likely.

min_tokens (the stop tokens banned until then), logit_bias, repetition, frequency and
presence penalties, in vLLM's order, apply to every sample row, greedy ones included, from
a `ProcessorTensors` built once per step; a step where no row uses one builds nothing and
leaves the logits untouched. Each is elementwise per row (a neutral row's logits come out
bit-identical), so a row's token never depends on its neighbours (engine/execution/sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request


@dataclass(frozen=True)
class ProcessorTensors:
    """The logits processors of one step's R sample rows (greedy rows too), V the vocab.

    Each part is None when no row uses it. Token-id lists are padded with V (a column past
    the vocabulary, dropped after the scatter). output_ids: int64 [R, L], the tokens each row
    generated so far; presence, frequency: float32 [R, 1] (0: off); seen_ids: int64 [R, L'],
    prompt + output; repetition: float32 [R, 1] (1: off); bias: (rows, ids, values) of
    every (row, token, bias); banned: (rows, ids) of the stop tokens of rows short of
    min_tokens.
    """

    output_ids: torch.Tensor | None = None
    presence: torch.Tensor | None = None
    frequency: torch.Tensor | None = None
    seen_ids: torch.Tensor | None = None
    repetition: torch.Tensor | None = None
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    banned: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_requests(cls, requests: list[Request], vocab: int,
                      device: torch.device) -> ProcessorTensors | None:
        """None when no row uses a processor (the common step: nothing is built)."""
        params = [r.sampling_params for r in requests]
        if not any(p.uses_processors for p in params):
            return None
        parts: dict[str, object] = {}

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)[:, None]

        if any(p.presence_penalty or p.frequency_penalty for p in params):
            parts["output_ids"] = _padded([r.output_token_ids for r in requests], vocab, device)
            parts["presence"] = column([p.presence_penalty for p in params])
            parts["frequency"] = column([p.frequency_penalty for p in params])
        if any(p.repetition_penalty != 1.0 for p in params):
            parts["seen_ids"] = _padded([r.token_ids for r in requests], vocab, device)
            parts["repetition"] = column([p.repetition_penalty for p in params])
        pairs = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
        if pairs:
            rows, ids, values = zip(*pairs, strict=True)
            parts["bias"] = (torch.tensor(rows, device=device), torch.tensor(ids, device=device),
                             torch.tensor(values, dtype=torch.float32, device=device))
        banned = [(i, t) for i, r in enumerate(requests)
                  if r.num_output_tokens < r.sampling_params.min_tokens
                  for t in sorted(r.stop_token_ids) if t < vocab]  # others never sampled
        if banned:
            rows, ids = zip(*banned, strict=True)
            parts["banned"] = (torch.tensor(rows, device=device),
                               torch.tensor(ids, device=device))
        return cls(**parts)  # type: ignore[arg-type]


def _padded(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """int64 [R, max len] (at least one column), each row padded with `vocab`."""
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [vocab] * (width - len(r)) for r in rows], dtype=torch.int64,
                        device=device)


def apply_processors(logits: torch.Tensor, procs: ProcessorTensors) -> torch.Tensor:
    """min_tokens, logit_bias, repetition, frequency, presence (vLLM's order) on logits
    [R, V] (float32) -> a new [R, V] tensor (`logits` is not changed).

    The penalties touch only the tokens a row has seen: gather, change, scatter back (a
    token seen twice is written twice with the same value), in a [R, V + 1] buffer whose
    last column takes the padding's writes and is dropped.
    """
    rows, vocab = logits.shape
    buf = torch.empty(rows, vocab + 1, dtype=logits.dtype, device=logits.device)
    buf[:, :vocab] = logits
    buf[:, vocab] = 0.0  # the padding's column: defined values, never read back
    if procs.banned is not None:
        buf.index_put_(procs.banned, torch.tensor(float("-inf"), device=buf.device))
    if procs.bias is not None:
        buf.index_put_(procs.bias[:2], procs.bias[2], accumulate=True)
    if procs.seen_ids is not None:
        # transformers' RepetitionPenaltyLogitsProcessor: < 0 multiplied, >= 0 divided
        ids, rep = procs.seen_ids, procs.repetition
        seen = buf.gather(1, ids)
        buf.scatter_(1, ids, torch.where(seen < 0, seen * rep, seen / rep))
    if procs.output_ids is not None:
        ids = procs.output_ids
        # each output token's count in its row [R, L], from the row's sorted ids (not a
        # dense [R, V] count matrix: three passes over it cost more than the sort of L)
        ordered = ids.sort(dim=1).values
        count = (torch.searchsorted(ordered, ids, right=True)
                 - torch.searchsorted(ordered, ids)).to(buf.dtype)
        seen = buf.gather(1, ids)
        buf.scatter_(1, ids, seen - (procs.frequency * count + procs.presence * (count > 0)))
    return buf[:, :vocab]
