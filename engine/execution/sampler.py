"""Token sampling: greedy, temperature, top-k, top-p, with a generator per request.

Each request draws its noise from its own `torch.Generator` (seeded from
`SamplingParams.seed`, or from a process-wide source when unseeded), one draw of the
vocabulary's size per sampled token. So a seeded request samples the same tokens whatever
else shares its batch, and whatever order the rows come in.

Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. picks index i
with probability p_i, so one noise vector per row replaces a multinomial call.

One step samples in batch: greedy rows in one argmax; all other rows go through
temperature, top-k, top-p, min_p, softmax and the race together, their per-row parameters
held as tensors in a `SamplingTensors` built once per step. A new per-row filter is one more
field there and one more batched function in `filter_logits`. The only loop over rows draws
the noise: torch generators fill one tensor each, and a row's noise must come from its own
request's generator.

Before that split, the logits processors (engine/execution/logits_processors.py) apply to
every row, greedy ones included.

Logprobs (engine/logprobs.py) are scored on the raw logits, before all of the above, for
the rows that ask only (`score_rows`: one log_softmax, one topk at the batch's largest N);
a step where no row asks computes none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.execution.exponential_race import (
    Candidates,
    candidates,
    in_vocabulary_order,
    race,
    row_argmax,
)
from engine.execution.logits_processors import ProcessorTensors, apply_processors
from engine.logprobs import SampledTokens, TokenLogprob
from engine.request import Request, SamplingParams
from kernels.workspace import workspace


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row parameters of the non-greedy rows of one step, R rows, as tensors.

    temperature: float32 [R, 1], > 0; top_k: int64 [R], in 1..V where it filters, V where it
    is off (0 or >= vocab); top_p: float32 [R], +inf where it is off (1.0); min_p: float32
    [R, 1], 0 where it is off. max_top_k is the largest k that filters (0: no row filters by
    top-k); any_top_p / any_min_p: some row filters by top-p / min_p.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    max_top_k: int
    any_top_p: bool
    min_p: torch.Tensor | None = None
    any_min_p: bool = False

    @classmethod
    def from_params(cls, params: list[SamplingParams], vocab: int,
                    device: torch.device) -> SamplingTensors:
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]
        return cls(
            temperature=torch.tensor([[p.temperature] for p in params], dtype=torch.float32,
                                     device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            max_top_k=max((k for k in top_k if k < vocab), default=0),
            any_top_p=any(p < 1.0 for p in top_p),
            min_p=torch.tensor([[p.min_p] for p in params], dtype=torch.float32,
                               device=device),
            any_min_p=any(p.min_p > 0.0 for p in params),
        )


def filter_logits(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Temperature, then top-k, top-p and min_p on rows of logits [R, V] (float32) -> [R, V],
    filtered tokens at -inf, in the "sampler.logits" workspace (`logits` is not changed)."""
    return filter_logits_and_candidates(logits, params)[0]


def filter_logits_and_candidates(logits: torch.Tensor, params: SamplingTensors
                                 ) -> tuple[torch.Tensor, Candidates | None]:
    """filter_logits, and each row's surviving logits with their token ids where top-p
    gathered them on the way ([R, n] in vocabulary order, -inf where dropped: what
    exponential_race.candidates would find again in the filtered rows); None where it did not,
    or min_p ran after it."""
    scaled = workspace("sampler.logits", tuple(logits.shape), torch.float32, logits.device)
    torch.div(logits, params.temperature, out=scaled)
    top_k_kept = _top_k(scaled, params.top_k, params.max_top_k) if params.max_top_k else None
    # without top-p the race gathers the candidates itself: top-k's are by falling logit,
    # and a row not top-k'd (or with ties past max_top_k) has more than they hold
    kept = _top_p(scaled, params.top_p, top_k_kept) if params.any_top_p else None
    if params.any_min_p:
        _min_p(scaled, params.min_p)
        kept = None
    return scaled, kept


def _min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """In place: drop tokens whose probability is below min_p [R, 1] times the row's top
    probability (transformers' MinPLogitsWarper); the top token always stays (min_p <= 1),
    and rows with min_p = 0 keep everything."""
    probs = torch.softmax(logits, dim=-1)
    logits.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, float("-inf"))


def _top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> Candidates:
    """In place: keep each row's tokens at or above its k-th largest logit (ties at the
    k-th stay). Rows with k = V keep everything. Returns each row's max_top_k largest logits
    (-inf where dropped) and their ids, by falling logit: every survivor of a row that kept
    at most max_top_k (not of one with ties past it, or with k = V)."""
    largest, ids = torch.topk(logits, max_top_k, dim=-1)  # (R, max_k), descending
    kth = largest.gather(1, (top_k.clamp(max=max_top_k) - 1)[:, None])  # (R, 1)
    kth = torch.where(top_k[:, None] < logits.shape[-1], kth, float("-inf"))
    logits.masked_fill_(logits < kth, float("-inf"))
    return largest.masked_fill_(largest < kth, float("-inf")), ids


def _top_p(logits: torch.Tensor, top_p: torch.Tensor,
           top_k_kept: Candidates | None = None) -> Candidates | None:
    """In place: drop a token when the more likely tokens before it already cover the row's
    top_p; the most likely token always stays. Rows with top_p = +inf keep everything.
    top_k_kept: what _top_k returned, if it ran. Returns the rows' candidates where it
    gathered them (see filter_logits_and_candidates)."""
    most = int((logits > float("-inf")).sum(dim=-1).max())  # finite or -inf: one pass
    if top_k_kept is not None and most <= top_k_kept[0].shape[1]:  # top-k holds them all
        return _top_p_of_candidates(logits, top_p, in_vocabulary_order(*top_k_kept))
    if most <= logits.shape[-1] // 4:
        return _top_p_of_candidates(logits, top_p, candidates(logits, most))
    shape, device = tuple(logits.shape), logits.device
    sorted_logits = workspace("sampler.sorted", shape, torch.float32, device)
    order = workspace("sampler.order", shape, torch.int64, device)
    # stable: tied logits keep vocabulary order, so the cut is the same in any batch
    torch.sort(logits, dim=-1, descending=True, stable=True, out=(sorted_logits, order))
    _cut(logits, top_p, sorted_logits, order)
    return None


def _top_p_of_candidates(logits: torch.Tensor, top_p: torch.Tensor,
                         found: Candidates) -> Candidates:
    """_top_p when every row's finite logits are in `found` (in vocabulary order): the same
    cut, from a sort of those instead of the whole vocabulary ([R, n]: 50 of 49,152 for
    top_k 50). Returns them with the cut applied to them too."""
    values, index = found  # in vocabulary order, so a stable sort by value
    sorted_logits, by_value = torch.sort(values, dim=-1, descending=True, stable=True)  # is
    # the full stable sort's order
    drop = _cut(logits, top_p, sorted_logits, index.gather(1, by_value))
    dropped = torch.zeros_like(drop).scatter_(1, by_value, drop)  # in vocabulary order
    return values.masked_fill_(dropped, float("-inf")), index


def _cut(logits: torch.Tensor, top_p: torch.Tensor, sorted_logits: torch.Tensor,
         order: torch.Tensor) -> torch.Tensor:
    """Mask, in `logits`, the tokens (`order`: their ids, by falling logit) past top_p;
    returns which were (bool [R, n], in `order`'s order). Uses sorted_logits' memory."""
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1, out=sorted_logits).sub_(probs)  # mass before each
    drop = before >= top_p[:, None]  # (R, n), sorted order
    drop[:, 0] = False
    mask = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    logits.masked_fill_(mask.scatter_(1, order, drop), float("-inf"))
    return drop


def sample(logits: torch.Tensor, requests: list[Request]) -> SampledTokens:
    """One token per row of `logits` `[R, V]` (float32) for `requests` (same order), with
    the logprobs of the rows that ask for them (of these raw logits: engine/logprobs.py)."""
    assert logits.shape[0] == len(requests)
    raw = logits
    tokens = _sample_tokens(logits, requests)
    asking = [i for i, r in enumerate(requests) if r.sampling_params.logprobs is not None]
    if not asking:  # the common step: no log_softmax, nothing more
        return SampledTokens(tokens.tolist())
    top_n = [requests[i].sampling_params.logprobs or 0 for i in asking]
    if len(asking) == len(requests):  # no copy of the rows
        scored = score_rows(raw, tokens, top_n)
    else:
        index = torch.tensor(asking, device=raw.device)
        scored = score_rows(raw.index_select(0, index), tokens.index_select(0, index), top_n)
    per_row: list[TokenLogprob | None] = [None] * len(requests)
    for i, entry in zip(asking, scored, strict=True):
        per_row[i] = entry
    return SampledTokens(tokens.tolist(), per_row)


def _sample_tokens(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """int64 [R]: greedy rows by argmax, the others through the filters and the race."""
    if any(r.sampling_params.structured_output is not None for r in requests):
        from engine.structured.constrain import constrain_logits  # xgrammar: only when used

        logits = constrain_logits(logits, requests)  # grammar masks: -inf where refused
    processors = ProcessorTensors.from_requests(requests, logits.shape[-1], logits.device)
    if processors is not None:
        logits = apply_processors(logits, processors)
    greedy = [i for i, r in enumerate(requests) if r.sampling_params.temperature == 0.0]
    if len(greedy) == len(requests):
        return row_argmax(logits)
    tokens = torch.empty(len(requests), dtype=torch.int64, device=logits.device)
    if greedy:
        rows = torch.tensor(greedy, device=logits.device)
        tokens[rows] = row_argmax(logits.index_select(0, rows))
    sampled = [i for i, r in enumerate(requests) if r.sampling_params.temperature != 0.0]
    rows = torch.tensor(sampled, device=logits.device)
    sampled_requests = [requests[i] for i in sampled]
    params = SamplingTensors.from_params([r.sampling_params for r in sampled_requests],
                                         logits.shape[-1], logits.device)
    picked = logits if not greedy else logits.index_select(0, rows)
    tokens[rows] = race(*filter_logits_and_candidates(picked, params), sampled_requests)
    return tokens


def score_rows(logits: torch.Tensor, targets: torch.Tensor, top_n: list[int],
               rank: bool = False) -> list[TokenLogprob]:
    """logits [L, V] (raw), targets int64 [L] -> one TokenLogprob per row, with row i's
    `top_n[i]` best alternatives, and its rank when `rank` (a [L, V] comparison: only the
    prompt's vLLM shape shows it). Batched: nothing loops over the vocabulary."""
    # NOTE: log_softmax, not x - logsumexp(x): on CPU it measured 2.5x faster (16 vs 40 ms
    # at 64 x 49152), though it writes the [L, V] block
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [L, V]
    chosen = logprobs.gather(1, targets[:, None])  # [L, 1]
    ranks: list[int | None] = [None] * len(top_n)
    if rank:  # 1 + tokens strictly likelier
        ranks = (logprobs > chosen).sum(dim=-1).add_(1).tolist()
    max_n = max(top_n, default=0)
    if max_n:
        top_values, top_ids = torch.topk(logprobs, max_n, dim=-1)  # [L, N], descending
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    else:
        top_values = top_ids = [[] for _ in top_n]
    return [TokenLogprob(token, value, r, tuple(zip(ids[:n], values[:n], strict=True)))
            for token, value, r, ids, values, n in zip(
                targets.tolist(), chosen[:, 0].tolist(), ranks, top_ids, top_values, top_n,
                strict=True)]
