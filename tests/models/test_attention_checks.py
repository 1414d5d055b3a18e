"""The paged attention layer refuses the shapes it would get wrong: query heads that the KV
heads do not divide, a sequence with fewer blocks than its context needs, a query longer
than its context."""

from __future__ import annotations

import pytest

from engine.models.attention import Attention, build_attention_metadata


def test_query_heads_that_kv_heads_do_not_divide_are_refused():
    """Grouped-query attention shares each KV head among a whole number of query heads;
    any other split would read the wrong heads' keys."""
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        Attention(6, 4, 16, scale=0.25)


def test_a_sequence_with_too_few_blocks_for_its_context_is_refused():
    """20 tokens need two blocks of 16: with one, the step would write and read K/V
    outside the sequence's blocks."""
    with pytest.raises(ValueError, match="seq 1: q_len=20, ctx=20, 1 blocks of block_size=16"):
        build_attention_metadata([[0], [1]], [4, 20], [4, 20], block_size=16)
    positions, meta = build_attention_metadata([[0], [1, 2]], [4, 20], [4, 20], block_size=16)
    assert positions[4:].tolist() == list(range(20))
    assert meta.slot_mapping[4:].tolist() == [16 + i for i in range(16)] + [32, 33, 34, 35]


def test_a_query_longer_than_its_context_is_refused():
    """Context lengths count this step's tokens too: 5 query tokens in a context of 3
    would place tokens at negative positions."""
    with pytest.raises(ValueError, match="seq 0: q_len=5, ctx=3"):
        build_attention_metadata([[0]], [3], [5], block_size=16)
