"""The race that picks each sampled row's token, and each request's random generator.

    token = argmax(p / E),  E ~ Exp(1) independently per token

samples exactly from p (the exponential form of the Gumbel-max trick), one argmax a row.
A row whose filters (top-k, top-p, min_p) left few candidates, at most vocab /
CANDIDATE_SHARE finite logits, races over those only: its softmax and its noise cover the
candidates (50 of 49,152 for top_k 50) instead of the whole vocabulary, whose noise was
most of a sampled step (63 of 119 ms at 64 rows on one CPU thread). Its noise is drawn, in
vocabulary order, for its own candidates from its own generator, so a row's token depends
on its logits, settings and generator only, never on its neighbours; the path a row takes
is decided by its own candidate count.
"""

from __future__ import annotations

import random

import torch

from engine.request import Request
from kernels import cpu_argmax
from kernels.workspace import workspace

CANDIDATE_SHARE = 4
# (logits, token ids), each [R, n]: every row's finite logits in vocabulary order, padded
# with -inf entries (see candidates)
Candidates = tuple[torch.Tensor, torch.Tensor]

_seed_source = random.SystemRandom()


def request_generator(req: Request, device: torch.device) -> torch.Generator:
    """The request's generator, created on its first sample (kept on the Request)."""
    gen = req.sampling_state
    if gen is None:
        seed = req.sampling_params.seed
        gen = torch.Generator(device=device)
        gen.manual_seed(seed if seed is not None else _seed_source.getrandbits(63))
        req.sampling_state = gen
    return gen


def draw_noise(requests: list[Request], vocab: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise [R, V] (the "sampler.noise" workspace): row i from requests[i]'s own
    generator, one vocab-sized draw."""
    noise = workspace("sampler.noise", (len(requests), vocab), torch.float32, device)
    for row, req in zip(noise, requests, strict=True):  # NOTE: one generator per tensor
        row.exponential_(generator=request_generator(req, device))
    return noise


def race(filtered: torch.Tensor, kept: Candidates | None,
         requests: list[Request]) -> torch.Tensor:
    """filtered [S, V]: the sampled rows' logits after temperature and filters (-inf where
    dropped) -> int64 [S], one token each. `kept`: the same rows' finite logits and their
    ids where the filters gathered them (else None): when every row has few, the race
    takes them as they are instead of counting and gathering them again from `filtered`."""
    rows, vocab = filtered.shape
    if kept is not None:
        counts = (kept[0] > float("-inf")).sum(dim=-1)  # [S], over [S, n] only
        if bool((counts <= vocab // CANDIDATE_SHARE).all()):
            return _race_candidates(*kept, requests, counts)
    # NOTE: filtered logits are finite or -inf (dropped), so one comparison counts what
    # isfinite counts, in one pass over [S, V] instead of its three (eq, abs, ne)
    counts = (filtered > float("-inf")).sum(dim=-1)  # [S]
    few = (counts <= vocab // CANDIDATE_SHARE).tolist()
    if all(few):
        return _race_few(filtered, requests, counts)
    if not any(few):
        return _race_vocabulary(filtered, requests)
    tokens = torch.empty(rows, dtype=torch.int64, device=filtered.device)
    for flag, race_of in ((True, _race_few), (False, _race_vocabulary)):
        group = [i for i, f in enumerate(few) if f is flag]
        index = torch.tensor(group, device=filtered.device)
        args = (filtered.index_select(0, index), [requests[i] for i in group])
        tokens[index] = race_of(*args, counts[index]) if flag else race_of(*args)
    return tokens


def row_argmax(values: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the index of each row's largest value (the first of ties; a NaN counts as
    the largest), as torch.argmax(values, dim=-1). Contiguous float32 CPU rows: one native
    call (kernels/cpu_argmax.py, ~6x faster than torch.max on a 64-row step's logits).
    NOTE: elsewhere torch.max(dim).indices, which returns the same indices (ties, NaN, -inf
    rows checked) in ~40% of argmax's time on CPU: 0.8 vs 2.2 ms for [64, 49152] float32."""
    if cpu_argmax.takes(values):
        return cpu_argmax.row_argmax(values)
    return torch.max(values, dim=-1).indices


def _race_vocabulary(filtered: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    probs = torch.softmax(filtered, dim=-1)
    noise = draw_noise(requests, filtered.shape[-1], filtered.device)
    return row_argmax(torch.div(probs, noise, out=noise))


def candidates(logits: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] logits with at most n finite a row -> (values, token ids) [R, n] holding every
    row's finite logits, in vocabulary order (a row with fewer has -inf entries too)."""
    return in_vocabulary_order(*torch.topk(logits, n, dim=-1))


def in_vocabulary_order(values: torch.Tensor, index: torch.Tensor) -> Candidates:
    """(values, token ids) [R, n] -> the same pairs, each row sorted by token id."""
    index, by_index = torch.sort(index, dim=-1)
    return values.gather(1, by_index), index


def _race_few(filtered: torch.Tensor, requests: list[Request],
              counts: torch.Tensor) -> torch.Tensor:
    """The race over each row's finite logits (`counts` of them) only."""
    return _race_candidates(*candidates(filtered, int(counts.max())), requests, counts)


def _race_candidates(values: torch.Tensor, index: torch.Tensor, requests: list[Request],
                     counts: torch.Tensor) -> torch.Tensor:
    """The race over candidates [R, n] (vocabulary order; `counts` finite a row): one noise
    draw per finite candidate, in that order, from the row's own generator."""
    probs = torch.softmax(values, dim=-1)  # the dropped (-inf) ones: 0
    finite = torch.isfinite(values)
    noise = torch.ones_like(probs)
    for i, req in enumerate(requests):
        draw = torch.empty(int(counts[i]), device=values.device)
        noise[i, finite[i]] = draw.exponential_(generator=request_generator(req, draw.device))
    pick = row_argmax(probs.div_(noise))
    return index.gather(1, pick[:, None])[:, 0]
