"""The torch reference paged attention against dense per-sequence causal attention.

Caches are filled with garbage first and block ids are shuffled, so reading a wrong block,
a wrong offset or a padding entry of the block table changes the result.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels.reference import (
    causal_mask,
    length_groups,
    paged_attention,
    reference_attention,
    write_kv,
)

HEAD_DIM = 8
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_batch(seqs, block_size, num_kv_heads, group, dtype, seed, pad_value=-1):
    """seqs: [(context_len, q_len)] -> paged inputs plus each sequence's dense K/V.

    Block ids are a shuffled subset of a larger pool; table padding is `pad_value`.
    """
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(needed) + 5
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)  # garbage everywhere
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    table = torch.full((len(seqs), max(needed) + 2), pad_value, dtype=torch.int32)
    dense_k, dense_v, queries = [], [], []
    for s, (ctx, q_len) in enumerate(seqs):
        blocks = [pool.pop() for _ in range(needed[s])]
        table[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(ctx, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(ctx, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        for pos in range(ctx):  # token by token, independent of write_kv
            k_cache[blocks[pos // block_size], pos % block_size] = k[pos]
            v_cache[blocks[pos // block_size], pos % block_size] = v[pos]
        dense_k.append(k)
        dense_v.append(v)
        queries.append(torch.randn(q_len, num_kv_heads * group, HEAD_DIM, generator=gen).to(dtype))
    q_lens = torch.tensor([q for _, q in seqs])
    query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    context_lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    paged = (torch.cat(queries), k_cache, v_cache, table, context_lens, query_start_loc)
    return paged, queries, dense_k, dense_v


def check_against_dense(seqs, block_size, num_kv_heads, group, dtype, seed, pad_value=-1):
    paged, queries, dense_k, dense_v = make_batch(
        seqs, block_size, num_kv_heads, group, dtype, seed, pad_value
    )
    scale = HEAD_DIM**-0.5
    out = paged_attention(*paged, scale)
    assert out.shape == paged[0].shape and out.dtype == dtype
    expected = torch.cat([
        reference_attention(q, k, v, scale)
        for q, k, v in zip(queries, dense_k, dense_v, strict=True)
    ])
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


# (context_len, q_len): 1-token contexts, decodes, whole prompts, chunks with cached prefixes
MIXED = [(1, 1), (17, 1), (5, 5), (33, 7), (16, 16), (40, 1), (3, 2), (9, 9), (21, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_mixed_batch_matches_dense(dtype, group, block_size):
    check_against_dense(MIXED, block_size, num_kv_heads=2, group=group, dtype=dtype, seed=7)


@pytest.mark.parametrize("pad_value", [0, -1, 10**6])
def test_block_table_padding_is_never_read(pad_value):
    # A padding entry used as an index would read block 0, raise, or hit garbage.
    check_against_dense(MIXED, 4, num_kv_heads=2, group=2, dtype=torch.float32, seed=3,
                        pad_value=pad_value)


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 40)).map(lambda t: (t[0], min(t))),
        min_size=1, max_size=6,
    ),
    block_size=st.sampled_from([2, 3, 8]),
    group=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_batches_match_dense(lens, block_size, group, seed):
    check_against_dense(lens, block_size, num_kv_heads=2, group=group, dtype=torch.float32,
                        seed=seed)


@pytest.mark.parametrize("block_size", [1, 4])
def test_decodes_of_similar_lengths_batched_match_dense(block_size):
    """Decodes whose contexts are within 2x of each other go through one padded batch: no
    sequence sees a key past its own context (the padding up to the longest)."""
    check_against_dense([(17, 1), (20, 1), (30, 1), (16, 1), (5, 5)], block_size,
                        num_kv_heads=2, group=2, dtype=torch.float32, seed=9)


def test_query_longer_than_context_is_rejected():
    paged, *_ = make_batch([(4, 4)], 4, 1, 1, torch.float32, seed=0)
    q, k_cache, v_cache, table, _, starts = paged
    with pytest.raises(ValueError, match="q_len"):
        paged_attention(q, k_cache, v_cache, table, torch.tensor([3], dtype=torch.int32),
                        starts, 1.0)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_write_kv_places_rows_at_slots_and_skips_negative(cache_dtype):
    num_blocks, block_size, kvh = 6, 4, 2
    k_cache = torch.full((num_blocks, block_size, kvh, HEAD_DIM), 7.0, dtype=cache_dtype)
    v_cache = torch.full_like(k_cache, -7.0)
    k = torch.randn(5, kvh, HEAD_DIM)
    v = torch.randn(5, kvh, HEAD_DIM)
    slots = torch.tensor([13, -1, 0, 22, -1], dtype=torch.int64)
    write_kv(k_cache, v_cache, k, v, slots)

    written = {13: 0, 0: 2, 22: 3}  # slot -> row of k/v
    for slot, row in written.items():
        block, offset = divmod(slot, block_size)
        torch.testing.assert_close(k_cache[block, offset], k[row].to(cache_dtype))
        torch.testing.assert_close(v_cache[block, offset], v[row].to(cache_dtype))
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[list(written)] = False
    assert (k_cache.view(-1, kvh, HEAD_DIM)[untouched] == 7.0).all()
    assert (v_cache.view(-1, kvh, HEAD_DIM)[untouched] == -7.0).all()


def test_write_then_attend_round_trip():
    # write_kv and paged_attention agree on the slot layout.
    block_size, kvh, group, ctx = 4, 2, 2, 10
    blocks = [5, 1, 3]
    k_cache = torch.randn(8, block_size, kvh, HEAD_DIM)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(ctx, kvh, HEAD_DIM), torch.randn(ctx, kvh, HEAD_DIM)
    slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size
                          for p in range(ctx)])
    write_kv(k_cache, v_cache, k, v, slots)
    q = torch.randn(3, kvh * group, HEAD_DIM)
    out = paged_attention(q, k_cache, v_cache, torch.tensor([blocks], dtype=torch.int32),
                          torch.tensor([ctx], dtype=torch.int32),
                          torch.tensor([0, 3], dtype=torch.int32), 0.3)
    torch.testing.assert_close(out, reference_attention(q, k, v, 0.3))


def test_backend_dispatch(monkeypatch):
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, "reference")
    assert kernels.get_attention_backend().name == "reference"
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, "auto")
    if not torch.cuda.is_available():  # CPU tensors only: "auto" is the batched CPU path
        assert kernels.get_attention_backend().name == "cpu"
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not torch.cuda.is_available():  # forcing Triton without a GPU is a clear error
        with pytest.raises(kernels.BackendUnavailableError, match="BATCHPILOT_ATTENTION"):
            kernels.get_attention_backend()
    with pytest.raises(ValueError, match="reference"):
        kernels.get_attention_backend("flash")


def test_backend_names_ignore_case_and_spaces(monkeypatch):
    """BATCHPILOT_ATTENTION=CPU (or " Reference ") names the backend as its lower-case
    spelling does, not an unknown one."""
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, " Reference ")
    assert kernels.get_attention_backend().name == "reference"
    assert kernels.get_attention_backend("CPU").name == "cpu"


def test_use_attention_backend_repoints_every_layer():
    """A/B runs re-point every attention layer of a model, not only the first one."""
    layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(3))
    for layer in layers:
        layer.backend = kernels.get_attention_backend("cpu")
    chosen = kernels.use_attention_backend(layers, "reference")
    assert chosen.name == "reference"
    assert [layer.backend.name for layer in layers] == ["reference"] * 3


def test_triton_not_installed_names_the_way_out(monkeypatch):
    """Forcing 'triton' where the package is missing says how to install it and how to run
    without it (BATCHPILOT_ATTENTION=reference)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "triton" else find_spec(name, *args))
    with pytest.raises(kernels.BackendUnavailableError, match="pip install") as caught:
        kernels.get_attention_backend("triton")
    assert f"{kernels.ATTENTION_ENV_VAR}=reference" in str(caught.value)


def test_length_groups_bound_the_padding_of_batched_decodes():
    lens = [900, 30, 35, 1000, 64, 70, 500, 1]
    groups = length_groups(list(range(len(lens))), lens)
    assert sorted(s for g in groups for s in g) == list(range(len(lens)))
    for group in groups:  # each padded to its longest: under 2x its shortest
        assert max(lens[s] for s in group) <= 2 * min(lens[s] for s in group)
    assert [lens[s] for s in groups[1]] == [30, 35]
    assert length_groups([], []) == []


def test_causal_mask_puts_the_chunk_at_the_end_of_its_context():
    """A chunk of q_len queries over a context of C tokens sits at positions C - q_len ..
    C - 1: each sees the whole cached prefix, itself and the chunk's earlier tokens."""
    mask = causal_mask(2, 4, torch.device("cpu"))
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(causal_mask(3, 3, torch.device("cpu")),
                       torch.ones(3, 3, dtype=torch.bool).tril())
    assert causal_mask(1, 5, torch.device("cpu")).all()
