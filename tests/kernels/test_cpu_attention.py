"""The batched CPU paged attention (kernels/cpu_attention.py) against the torch reference.

Caches are garbage-filled and block ids shuffled, so a wrong block, offset, chunk boundary or
padding entry changes the result. Batches mix decodes of very different lengths with prefill
chunks over cached prefixes; chunk sizes of 1 and 2 blocks force the split-K merge.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import cpu_attention, reference

# float32: same math in another order; bfloat16 outputs: both round one float32 result
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}


def make_paged(seqs, block_size, num_kv_heads, group, head_dim, dtype, seed, pad_value=-1):
    """seqs: [(context_len, q_len)] -> (q, k_cache, v_cache, table, context_lens, starts)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(needed) + 3
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)  # garbage outside the contexts too
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    table = torch.full((len(seqs), max(needed) + 2), pad_value, dtype=torch.int32)
    for s, count in enumerate(needed):
        table[s, :count] = torch.tensor([pool.pop() for _ in range(count)], dtype=torch.int32)
    q_lens = [q_len for _, q_len in seqs]
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    starts = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    context_lens = torch.tensor([ctx for ctx, _ in seqs], dtype=torch.int32)
    return q, k_cache, v_cache, table, context_lens, starts


def check_matches_reference(paged, scale=0.125):
    out = cpu_attention.paged_attention(*paged, scale)
    expected = reference.paged_attention(*paged, scale)
    q = paged[0]
    assert out.shape == q.shape and out.dtype == q.dtype
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    # Before the final rounding: float32 against the reference run on widened inputs.
    wide = [t.float() if t.is_floating_point() else t for t in paged]
    torch.testing.assert_close(cpu_attention.paged_attention(*wide, scale),
                               reference.paged_attention(*wide, scale), atol=2e-5, rtol=2e-5)


# decodes across chunk edges (127/128/129 at block 16 x 8 blocks), a 1-token context, long
# and short side by side, and prefill chunks with and without a cached prefix
MIXED = [(1000, 1), (5, 1), (128, 1), (129, 1), (127, 1), (1, 1), (300, 40), (17, 17),
         (64, 1), (33, 2)]


@pytest.mark.parametrize("few_decodes", [0, cpu_attention.FEW_DECODES])  # batched, per-seq
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_kv_heads", "group"), [(3, 3), (1, 4), (2, 1), (4, 2)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_mixed_batch_matches_reference(monkeypatch, few_decodes, dtype, num_kv_heads, group,
                                       block_size):
    monkeypatch.setattr(cpu_attention, "FEW_DECODES", few_decodes)
    monkeypatch.setattr(cpu_attention, "NATIVE_DECODE", False)  # the torch decode paths
    seqs = MIXED if block_size > 1 else MIXED[1:]  # 1000 one-token blocks: slow, not new
    check_matches_reference(make_paged(seqs, block_size, num_kv_heads, group, 64, dtype, 11))


@pytest.mark.parametrize("chunk_blocks", [1, 2, 3, 8, 1000])
@pytest.mark.parametrize("pad_value", [0, -1, 10**6])
def test_chunk_merge_and_table_padding(monkeypatch, chunk_blocks, pad_value):
    # chunk_blocks 1..3 merge many chunks per sequence; 1000 is one padded batch (no merge);
    # a padding entry of the block table used as an index would read garbage or raise.
    monkeypatch.setattr(cpu_attention, "CHUNK_BLOCKS", chunk_blocks)
    monkeypatch.setattr(cpu_attention, "FEW_DECODES", 0)  # the batched path merges chunks
    monkeypatch.setattr(cpu_attention, "NATIVE_DECODE", False)
    check_matches_reference(make_paged(MIXED, 4, 2, 3, 16, torch.float32, 5, pad_value))


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 24), st.booleans()).map(
            lambda t: (t[0], 1 if t[2] else min(t[0], t[1]))),  # mostly-decode mixes
        min_size=1, max_size=10,
    ),
    block_size=st.sampled_from([2, 3, 8, 16]),
    kv_group=st.sampled_from([(1, 1), (3, 3), (2, 4), (1, 9)]),
    chunk_blocks=st.sampled_from([1, 4, 8]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_random_mixed_batches_match_reference(lens, block_size, kv_group, chunk_blocks,
                                              dtype, seed):
    num_kv_heads, group = kv_group
    original = cpu_attention.CHUNK_BLOCKS, cpu_attention.FEW_DECODES
    cpu_attention.CHUNK_BLOCKS = chunk_blocks  # hypothesis: no function-scoped monkeypatch
    cpu_attention.FEW_DECODES = seed % 2 * 8  # both torch decode paths
    cpu_attention.NATIVE_DECODE = False  # test_native_library.py covers the native kernel
    try:
        check_matches_reference(make_paged(lens, block_size, num_kv_heads, group, 8, dtype,
                                           seed))
    finally:
        cpu_attention.CHUNK_BLOCKS, cpu_attention.FEW_DECODES = original
        cpu_attention.NATIVE_DECODE = True


def test_decodes_match_dense_attention():
    # Independent of the reference's paged code: dense per-sequence attention by hand.
    seqs = [(700, 1), (3, 1), (129, 1)]
    q, k_cache, v_cache, table, context_lens, starts = make_paged(
        seqs, 16, 3, 3, 64, torch.float32, 2)
    out = cpu_attention.paged_attention(q, k_cache, v_cache, table, context_lens, starts, 0.125)
    for s, (ctx, _) in enumerate(seqs):
        k = reference.gather_kv(k_cache, table[s], ctx)
        v = reference.gather_kv(v_cache, table[s], ctx)
        expected = reference.reference_attention(q[s:s + 1], k, v, 0.125)
        torch.testing.assert_close(out[s:s + 1], expected, atol=2e-5, rtol=2e-5)


def test_results_survive_the_next_call():
    # The gathered K/V live in a reused workspace: a result must not alias it, and a
    # smaller then a larger batch must still read right.
    big = make_paged([(900, 1), (400, 1)], 16, 3, 3, 64, torch.float32, 3)
    small = make_paged([(20, 1), (7, 1)], 16, 3, 3, 64, torch.float32, 4)
    first = cpu_attention.paged_attention(*big, 0.125)
    kept = first.clone()
    check_matches_reference(small)
    check_matches_reference(big)
    assert torch.equal(first, kept)


def test_bad_inputs_are_rejected():
    q, k_cache, v_cache, table, _, starts = make_paged([(4, 4)], 4, 1, 1, 8, torch.float32, 0)
    with pytest.raises(ValueError, match="q_len"):
        cpu_attention.paged_attention(q, k_cache, v_cache, table,
                                      torch.tensor([3], dtype=torch.int32), starts, 1.0)
    with pytest.raises(ValueError, match="CPU tensors"):
        cpu_attention.paged_attention(q.to("meta"), k_cache, v_cache, table,
                                      torch.tensor([4], dtype=torch.int32), starts, 1.0)


def test_an_idle_sequence_in_the_step_is_skipped():
    """A sequence with no query rows this step (q_len 0: waiting, or padding) is skipped,
    as the reference does, not refused: the others' rows are computed as usual."""
    check_matches_reference(make_paged([(40, 5), (7, 0), (17, 1), (2, 2)], 4, 2, 3, 16,
                                       torch.float32, 2))


def test_backend_names(monkeypatch):
    assert kernels.get_attention_backend("cpu").paged_attention is cpu_attention.paged_attention
    assert kernels.get_attention_backend("reference").name == "reference"  # still the oracle
    monkeypatch.delenv(kernels.ATTENTION_ENV_VAR, raising=False)
    auto = kernels.get_attention_backend()
    paged = make_paged([(40, 1), (9, 3)], 4, 2, 2, 8, torch.float32, 1)
    torch.testing.assert_close(auto.paged_attention(*paged, 0.5),
                               cpu_attention.paged_attention(*paged, 0.5), atol=0, rtol=0)


def test_workspace_serves_calls_inside_and_outside_inference_mode():
    from kernels.workspace import workspace

    with torch.inference_mode():
        inside = workspace("t", (4, 4), torch.float32)
        inside.fill_(1.0)
    outside = workspace("t", (4, 4), torch.float32)
    outside.fill_(2.0)  # an inference tensor here would raise
    with torch.inference_mode():
        assert workspace("t", (4, 4), torch.float32).sum() == 16.0
