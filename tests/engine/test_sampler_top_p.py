"""top-p after top-k sorts only the candidates top-k left (engine/execution/sampler.py
_top_p_of_candidates): the same cut as the stable sort of the whole vocabulary, ties
included, for rows with and without top-p."""

from __future__ import annotations

import pytest
import torch

from engine.execution.sampler import _cut, _top_k, _top_p


def full_sort_cut(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    sorted_logits, order = torch.sort(out, dim=-1, descending=True, stable=True)
    _cut(out, top_p, sorted_logits.clone(), order)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_candidates_cut_equals_the_full_sort(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(16, 4000, generator=gen) * 3).round() / 2  # many ties
    top_k = torch.randint(1, 80, (16,), generator=gen)
    _top_k(logits, top_k, int(top_k.max()))
    top_p = torch.rand(16, generator=gen)
    top_p[::3] = float("inf")  # rows without top-p keep what top-k left
    expected = full_sort_cut(logits, top_p)
    got = logits.clone()
    _top_p(got, top_p)  # few finite logits: the candidates path
    assert torch.isfinite(got).sum() < torch.isfinite(logits).sum()  # it did cut
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))
    assert torch.equal(got[torch.isfinite(got)], expected[torch.isfinite(expected)])


@pytest.mark.parametrize(("top_p", "kept"), [
    (0.4, {0}), (0.49, {0}), (0.51, {0, 1}), (0.79, {0, 1}), (0.81, {0, 1, 2}),
    (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_it(top_p, kept):
    """Probabilities 0.5, 0.3, 0.15, 0.05 by hand: the token that crosses top_p is kept,
    the first past it is not (as transformers' TopPLogitsWarper)."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    _top_p(logits, torch.tensor([top_p]))
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == kept
