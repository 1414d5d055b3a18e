"""Token sampling: greedy, temperature, top-k, top-p, with a generator per request.

Each request draws its noise from its own `torch.Generator` (seeded from
`SamplingParams.seed`, or from a process-wide source when unseeded), one draw of the
vocabulary's size per sampled token. So a seeded request samples the same tokens whatever
else shares its batch, and whatever order the rows come in.

Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. picks index i
with probability p_i, so one noise vector per row replaces a multinomial call.
"""

from __future__ import annotations

import random

import torch

from engine.request import Request, SamplingParams

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


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on one row of logits `[V]` (float32)."""
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens before it already cover top_p; keep at least one
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter_(0, order, drop),
                                    float("-inf"))
    return logits


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """One token per row of `logits` `[R, V]` (float32) for `requests` (same order)."""
    assert logits.shape[0] == len(requests)
    greedy = [i for i, r in enumerate(requests) if r.sampling_params.temperature == 0.0]
    tokens = [0] * len(requests)
    if greedy:
        picked = torch.argmax(logits[greedy], dim=-1).tolist()
        for i, token in zip(greedy, picked, strict=True):
            tokens[i] = token
    if len(greedy) == len(requests):
        return tokens
    for i, req in enumerate(requests):
        params = req.sampling_params
        if params.temperature == 0.0:
            continue
        probs = torch.softmax(filter_logits(logits[i], params), dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=request_generator(
            req, logits.device))
        tokens[i] = int(torch.argmax(probs / noise))
    return tokens
