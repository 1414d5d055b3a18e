"""The batched sampler (engine/execution/sampler.py) against the per-row sampler it replaced.

The per-row code below is the sampler before batching, kept verbatim as the oracle: with
the same seeds, the batched path must pick the same tokens step after step, whatever else
shares the batch and in whatever order.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from engine.execution.exponential_race import CANDIDATE_SHARE, request_generator
from engine.execution.sampler import sample
from engine.request import Request, SamplingParams

VOCAB = 1000


def old_filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter_(0, order, drop),
                                    float("-inf"))
    return logits


def old_sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    tokens = []
    for i, req in enumerate(requests):
        params = req.sampling_params
        if params.temperature == 0.0:
            tokens.append(int(torch.argmax(logits[i])))
            continue
        filtered = old_filter_logits(logits[i], params)
        finite = torch.isfinite(filtered)
        gen = request_generator(req, logits.device)
        if int(finite.sum()) <= filtered.shape[-1] // CANDIDATE_SHARE:
            # few candidates: the race over them only, noise in vocabulary order
            candidates = finite.nonzero()[:, 0]
            probs = torch.softmax(filtered[candidates], dim=-1)
            noise = torch.empty_like(probs).exponential_(generator=gen)
            tokens.append(int(candidates[torch.argmax(probs / noise)]))
            continue
        probs = torch.softmax(filtered, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=gen)
        tokens.append(int(torch.argmax(probs / noise)))
    return tokens


def make_request(name: str, **params) -> Request:
    return Request(name, [1, 2, 3], SamplingParams(**params), arrival_time=0.0)


PARAMS = {  # seeded requests covering each filter alone and together
    "plain": dict(temperature=1.0, seed=1),
    "hot": dict(temperature=1.7, seed=2),
    "topk": dict(temperature=0.8, top_k=40, seed=3),
    "topp": dict(temperature=1.0, top_p=0.9, seed=4),
    "both": dict(temperature=0.6, top_k=200, top_p=0.5, seed=5),
    "k1": dict(temperature=1.0, top_k=1, seed=6),
    "kvocab": dict(temperature=1.0, top_k=VOCAB + 5, seed=7),
    "greedy": dict(temperature=0.0),
}


def logits_for(step: int, names: list[str]) -> torch.Tensor:
    """Each request's logits depend on its name and the step only, not on its neighbours."""
    rows = []
    for name in names:
        base = name.split("#")[0]  # copies of one request ("greedy#1") see the same logits
        gen = torch.Generator().manual_seed(zlib.crc32(f"{base}/{step}".encode()))
        rows.append(torch.randn(VOCAB, generator=gen) * 3)
    return torch.stack(rows)


def run(names: list[str], sampler, steps: int = 6) -> dict[str, list[int]]:
    requests = [make_request(n, **PARAMS[n.split("#")[0]]) for n in names]
    out: dict[str, list[int]] = {n: [] for n in names}
    for step in range(steps):
        tokens = sampler(logits_for(step, names), requests)
        for name, token in zip(names, tokens, strict=True):
            out[name].append(token)
    return out


def test_batched_path_picks_the_old_tokens():
    names = list(PARAMS)
    assert run(names, sample) == run(names, old_sample)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_tokens_do_not_depend_on_batch_neighbours_or_order(seed):
    alone = {n: run([n], sample)[n] for n in PARAMS}
    rng = random.Random(seed)
    names = [n for n in PARAMS if rng.random() < 0.7] or ["plain"]
    names += [f"greedy#{i}" for i in range(rng.randint(0, 3))]
    rng.shuffle(names)
    together = run(names, sample)
    for name in names:
        assert together[name] == alone[name.split("#")[0]], name


def test_a_seeded_request_draws_new_noise_at_each_step():
    """A request's generator goes on from step to step: over a flat distribution a seeded
    request samples different tokens step after step (not the first step's token again),
    and the same sequence on a second run with the same seed."""
    flat = torch.zeros(1, VOCAB)

    def tokens(seed: int) -> list[int]:
        req = make_request("x", temperature=1.0, seed=seed)
        return [sample(flat, [req])[0] for _ in range(8)]

    first = tokens(5)
    assert len(set(first)) > 4, first
    assert tokens(5) == first


def sample_many(logits_row: torch.Tensor, seeds=range(20), **params) -> set[int]:
    """Tokens picked for one logits row by fresh requests seeded 0..19 (with a neighbour)."""
    picked = set()
    for seed in seeds:
        requests = [make_request("x", seed=seed, **params), make_request("n", temperature=1.0)]
        logits = torch.stack([logits_row, torch.randn(logits_row.shape[0])])
        picked.add(sample(logits, requests)[0])
    return picked


def test_top_k_edge_cases():
    row = torch.randn(VOCAB)
    assert sample_many(row, temperature=2.0, top_k=1) == {int(row.argmax())}
    top3 = set(torch.topk(row, 3).indices.tolist())
    assert sample_many(row, temperature=5.0, top_k=3) <= top3
    # k >= vocab filters nothing: the same draws as top-k off
    for k in (VOCAB, VOCAB + 1):
        assert run_one(row, top_k=k) == run_one(row, top_k=0)


def run_one(row: torch.Tensor, **params) -> list[int]:
    return [sample(row[None], [make_request("x", temperature=3.0, seed=s, **params)])[0]
            for s in range(20)]


def test_top_p_edge_cases():
    row = torch.randn(VOCAB)
    assert sample_many(row, temperature=1.0, top_p=1e-6) == {int(row.argmax())}
    assert run_one(row, top_p=1.0) == run_one(row, top_p=1.0, top_k=0)


def test_ties():
    row = torch.full((VOCAB,), -5.0)
    row[[10, 500, 900]] = 4.0  # three-way tie at the top
    # top-k = 1 keeps every token tied with the k-th: all three can come out, nothing else
    assert sample_many(row, seeds=range(60), temperature=1.0, top_k=1) == {10, 500, 900}
    # a tiny top_p keeps the first tied token in vocabulary order, in any batch
    assert sample_many(row, temperature=1.0, top_p=1e-6) == {10}


def test_a_temperature_below_the_greedy_epsilon_samples_the_argmax():
    """As vLLM: a temperature under 1e-5 is greedy (logits / 1e-40 would overflow to inf
    and the softmax to NaN)."""
    assert SamplingParams(temperature=1e-40).temperature == 0.0
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    requests = [make_request(str(i), temperature=1e-40, seed=i) for i in range(4)]
    assert sample(logits, requests) == logits.argmax(-1).tolist()


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(5, VOCAB)
    requests = [make_request(str(i), temperature=0.0 if i % 2 else 1.0, seed=i)
                for i in range(5)]
    tokens = sample(logits, requests)
    assert [tokens[i] for i in (1, 3)] == logits[[1, 3]].argmax(-1).tolist()
    assert all(isinstance(t, int) for t in tokens)
