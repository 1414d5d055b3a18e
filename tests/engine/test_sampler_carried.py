"""The candidates carried from top-k through top-p to the race
(sampler.filter_logits_and_candidates) change nothing: top-p on top-k's candidates masks
the same logits as top-p gathering them again, and the race on the carried candidates
picks the same tokens, from the same noise draws, as the race that finds them again in the
filtered rows (per row the same finite logits in the same, vocabulary, order)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from engine.execution import exponential_race
from engine.execution.exponential_race import race
from engine.execution.sampler import SamplingTensors, _top_k, _top_p, filter_logits_and_candidates
from engine.request import Request, SamplingParams

VOCAB = 4096


def requests(params: list[SamplingParams]) -> list[Request]:
    return [Request(f"r{i}", [1, 2], p, 0.0) for i, p in enumerate(params)]


def settings(seed: int) -> list[SamplingParams]:
    """Rows with top-k and top-p, top-p off, ties at the k-th, a near-greedy temperature."""
    return [SamplingParams(max_tokens=4, temperature=t, top_k=k, top_p=p, seed=seed + i)
            for i, (t, k, p) in enumerate([(0.8, 50, 0.9), (1.0, 40, 1.0), (0.3, 64, 0.5),
                                           (1.3, 50, 0.99), (0.05, 20, 0.8), (1.0, 3, 0.7)])]


def step_logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, VOCAB, generator=gen) * 3
    if seed % 2:
        logits[1, :100] = logits[1].max()  # 100 tied at the top: past every row's k
    logits[5, 7:12] = 2.5  # ties around the k-th of a small k
    return logits


@pytest.mark.parametrize("seed", range(6))
def test_top_p_on_top_k_candidates_masks_what_it_masks_without_them(seed):
    logits, params = step_logits(seed), settings(seed)
    tensors = SamplingTensors.from_params(params, VOCAB, logits.device)
    filtered, kept = filter_logits_and_candidates(logits, tensors)
    expected = logits / tensors.temperature
    _top_k(expected, tensors.top_k, tensors.max_top_k)
    _top_p(expected, tensors.top_p)  # gathers its candidates from the rows itself
    assert torch.equal(filtered, expected)
    for values, ids, row in zip(*kept, filtered, strict=True):  # the carried: the survivors
        finite = values > float("-inf")
        assert torch.equal(ids[finite], torch.nonzero(row > float("-inf")).flatten())
        assert torch.equal(values[finite], row[ids[finite]])


@pytest.mark.parametrize("seed", range(8))
def test_race_on_carried_candidates_equals_the_race_that_gathers_them(seed):
    logits, params = step_logits(seed), settings(seed)
    tensors = SamplingTensors.from_params(params, VOCAB, logits.device)
    filtered, kept = filter_logits_and_candidates(logits, tensors)
    assert kept is not None
    filtered = filtered.clone()  # the workspace is reused by the next call
    with mock.patch.object(exponential_race, "candidates",
                           wraps=exponential_race.candidates) as gathered:
        carried = race(filtered, kept, requests(params))
    assert gathered.call_count == 0  # the carried candidates were taken as they are
    again = race(filtered, None, requests(params))  # fresh generators, same seeds
    assert torch.equal(carried, again)
    finite = [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in filtered]
    assert all(int(token) in allowed for token, allowed in zip(carried, finite, strict=True))


def test_min_p_after_top_p_carries_nothing():
    params = [SamplingParams(max_tokens=4, temperature=1.0, top_k=50, top_p=0.9, min_p=0.2)]
    tensors = SamplingTensors.from_params(params, VOCAB, torch.device("cpu"))
    _, kept = filter_logits_and_candidates(torch.randn(1, VOCAB), tensors)
    assert kept is None
