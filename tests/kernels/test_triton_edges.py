"""Edges of the Triton kernels that test_triton.py's grid against the reference does not reach:
q and v views with other strides than the contiguous tensors of make_batch, three KV heads
(padded to four lanes) in the KV write, which rows of a mixed batch each kernel writes, the
split and tile heuristics at their boundaries, float32 dot precision and the GQA ratio
check. On CPU in Triton's interpreter, through test_triton.py's `tk` fixture."""

from __future__ import annotations

import pytest
import test_triton
import torch
from test_triton import assert_matches, make_batch

from kernels import reference

tk = test_triton.tk  # the module fixture: kernels.triton_* imported with TRITON_INTERPRET=1

SEQS = [(37, 1), (33, 7), (70, 1), (9, 3)]  # (context_len, q_len): decodes between chunks


def _fused_qkv_view(q: torch.Tensor) -> torch.Tensor:
    """q's values as the query part of a fused [T, nh + 2 * kvh, d] projection: row stride
    wider than nh * d."""
    extra = torch.randn(q.shape[0], 4, q.shape[2], generator=torch.Generator().manual_seed(1))
    return torch.cat([q, extra.to(q.dtype)], dim=1)[:, : q.shape[1]]


def _head_dim_strided(q: torch.Tensor) -> torch.Tensor:
    """q's values with heads innermost in memory: stride(2) == num_heads, not 1."""
    return q.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("layout", [_fused_qkv_view, _head_dim_strided])
def test_q_views_match_reference(tk, layout):
    """A q that is a view (of the fused qkv projection, or with head_dim not innermost) gives
    the same attention as the contiguous q, for decode and prefill rows alike."""
    q, *rest = make_batch(SEQS, 16, 2, 2, 32, torch.float32, seed=4)
    view = layout(q)
    assert torch.equal(view, q) and view.stride() != q.stride()
    out = tk.triton_attention.paged_attention(view, *rest, 0.25, max_query_len=7,
                                              max_context_len=70)
    assert_matches(out, reference.paged_attention(q, *rest, 0.25), torch.float32)


def test_decode_and_prefill_write_only_their_own_rows(tk):
    """In a mixed batch the decode kernel writes only the rows of single-query sequences and
    the prefill kernel (skip_decodes) only the others, so either may run first into one
    output."""
    q, k_cache, v_cache, table, ctx, starts = make_batch(SEQS, 16, 2, 2, 32, torch.float32,
                                                         seed=6)
    expected = reference.paged_attention(q, k_cache, v_cache, table, ctx, starts, 0.25)
    q_lens = (starts[1:] - starts[:-1]).tolist()
    is_decode = torch.tensor([q_len == 1 for q_len in q_lens for _ in range(q_len)])
    out = torch.full_like(q, float("nan"))
    tk.triton_decode.decode_attention(q, k_cache, v_cache, table, ctx, 0.25,
                                      query_start_loc=starts, max_context_len=70, out=out)
    assert out[~is_decode].isnan().all()
    assert_matches(out[is_decode], expected[is_decode], torch.float32)
    out = torch.full_like(q, float("nan"))
    tk.triton_prefill.prefill_attention(q, k_cache, v_cache, table, ctx, starts, 0.25, 7,
                                        skip_decodes=True, out=out)
    assert out[is_decode].isnan().all()
    assert_matches(out[~is_decode], expected[~is_decode], torch.float32)


def test_split_heuristic_at_its_boundaries(tk):
    """Programs that exactly fill the SMs do not split; 511 keys are too short to split and
    512 are two splits; a huge context stops at MAX_SPLITS."""
    choose = tk.triton_decode.choose_num_splits
    assert choose(33, 4, 4096, 132) == 1  # 132 programs on 132 SMs
    assert choose(32, 4, 4096, 132) == 3  # 128 programs: cdiv(264, 128)
    assert choose(1, 8, 511, 132) == 1
    assert choose(1, 8, 512, 132) == 2
    assert choose(1, 1, 1 << 20, 132) == tk.triton_decode.MAX_SPLITS


def test_prefill_tiles_shrink_to_the_longest_chunk(tk):
    """(BLOCK_M, BLOCK_N, num_warps): BLOCK_M shrinks to the step's longest chunk of rows
    (down to 16), by dtype and head width."""
    tiles = tk.triton_prefill.prefill_tiles
    assert tiles(torch.float16, 128, 4096) == (128, 64, 8)
    assert tiles(torch.float16, 128, 8) == (16, 64, 4)  # two tokens of a group of 4
    assert tiles(torch.bfloat16, 128, 40) == (64, 64, 4)
    assert tiles(torch.bfloat16, 256, 4096) == (64, 32, 4)
    assert tiles(torch.float32, 64, 4096) == (32, 32, 4)
    assert tiles(torch.float32, 64, 1) == (16, 32, 4)


def test_float32_dots_stay_ieee(tk):
    """float32 dots ask for "ieee" (TF32's 10-bit mantissa would break fp32 parity on a GPU);
    bfloat16 under the interpreter widens to float32 and so asks for "ieee" too."""
    for kernel in (tk.triton_decode._decode_kernel, tk.triton_prefill._prefill_kernel):
        assert tk.triton_launch.dot_precision(torch.float32, kernel) == "ieee"
        assert tk.triton_launch.dot_precision(torch.float16, kernel) == "tf32"
        assert tk.triton_launch.dot_in_fp32(torch.bfloat16, kernel)
        assert tk.triton_launch.dot_precision(torch.bfloat16, kernel) == "ieee"


def test_heads_not_a_multiple_of_kv_heads_are_refused(tk):
    """6 query heads over 4 KV heads is a ValueError before any launch, not a group of 1."""
    q, k_cache, v_cache, table, ctx, starts = make_batch([(9, 3), (5, 1)], 16, 4, 1, 16,
                                                         torch.float32, seed=0)
    q6 = torch.randn(q.shape[0], 6, 16)
    with pytest.raises(ValueError, match="multiple"):
        tk.triton_attention.paged_attention(q6, k_cache, v_cache, table, ctx, starts, 1.0)


def test_write_kv_odd_head_count_and_v_layout(tk):
    """Three KV heads (four lanes) and a v laid out unlike k: each slot gets exactly its own
    token's rows, and the slots next to it keep theirs."""
    gen = torch.Generator().manual_seed(2)
    tokens, kvh, dim = 4, 3, 16
    caches = [torch.randn(4, 4, kvh, dim, generator=gen) for _ in range(2)]  # 16 slots
    expected = [c.clone() for c in caches]
    k = torch.randn(tokens + 1, kvh, dim, generator=gen)[:tokens]  # in-bounds past row T
    v = torch.randn(tokens + 1, dim, kvh, generator=gen).transpose(1, 2)[:tokens]
    assert v.stride() != k.stride()
    slots = torch.tensor([5, -1, 0, 9])  # neighbours 6, 1, 10 are not written
    tk.triton_attention.write_kv(*caches, k, v, slots)
    reference.write_kv(*expected, k, v, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])
