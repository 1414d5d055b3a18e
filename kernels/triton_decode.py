"""Triton decode attention: one query token per sequence over its paged KV, with GQA, and a
split-K (flash-decoding) variant for long contexts with few sequences.

Grid: (num_seqs, num_kv_heads, num_splits). Program (s, h, j) serves the GROUP query heads
of KV head h that read the same keys, so each K/V byte is read once per KV head, not once per
query head. Its query tile is those heads, padded to >= 16 rows for tl.dot:

    q tile  [GROUP_PAD, DIM_PAD]   rows g < GROUP are heads h*GROUP + g, the rest zeros
    K/V     [BLOCK_N, DIM_PAD]     BLOCK_N consecutive positions, gathered block by block

Split j reads positions [j * tokens_per_split, min((j + 1) * tokens_per_split, ctx)). With one
split the program writes the output row; with several it writes a normalised partial output
and its log2-sum-exp, and a reduce kernel (grid (num_seqs, num_heads)) merges the splits:

    out = sum_j 2^(lse_j - max lse) * o_j / sum_j 2^(lse_j - max lse)

Sequences whose query length (from query_start_loc) is not 1 are skipped, so in a mixed batch
this kernel serves the decodes and the prefill kernel the rest, both writing into one output.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.triton_launch import (
    check_attention_inputs,
    dot_in_fp32,
    dot_precision,
    num_sms,
    pow2_at_least,
)
from kernels.triton_tile import LOG2_E, fold_tile, kv_row_offsets, load_rows


class DecodeTile(NamedTuple):
    """Launch shape of the decode kernel: KV positions per loop step, warps, pipeline stages."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


def default_tile(head_dim: int) -> DecodeTile:
    """64 positions per step (sm_90, bf16, d=128: 96 registers, ~38 KB shared memory, 16-byte
    cp.async loads); 32 for heads wider than 128 so two stages of K and V stay under ~64 KB."""
    return DecodeTile(block_n=32 if pow2_at_least(head_dim) > 128 else 64)


MIN_TOKENS_PER_SPLIT = 256  # a split shorter than this costs more in the reduce than it saves
MAX_SPLITS = 64


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int,
                      num_sms: int) -> int:
    """How many splits of each sequence's context the decode kernel should use.

    Without splitting there are num_seqs * num_kv_heads programs; once they fill the
    device (>= num_sms) splitting only adds the reduce. Below that, split so that about two
    programs per SM run, but never into pieces under MIN_TOKENS_PER_SPLIT positions.
    E.g. on 132 SMs with 8 KV heads: batch 1 at 16k -> 33 splits; batch 16 at 4k -> 3;
    batch 64 -> 1; any batch at context <= 511 -> 1.
    """
    programs = num_seqs * num_kv_heads
    if programs >= num_sms or max_context_len < 2 * MIN_TOKENS_PER_SPLIT:
        return 1
    wanted = triton.cdiv(2 * num_sms, programs)
    return max(1, min(wanted, max_context_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


def split_plan(num_splits: int, max_context_len: int, block_n: int) -> tuple[int, int]:
    """(num_splits, tokens_per_split): splits of a whole number of BLOCK_N steps, as few as
    cover the longest context (a forced 3 at context 100 with 64-position steps becomes 2)."""
    if num_splits <= 1:
        return 1, 0
    tokens_per_split = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    return triton.cdiv(max_context_len, tokens_per_split), tokens_per_split


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, qk_scale, tokens_per_split, num_splits, num_heads,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_kt, stride_kh, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(query_start_loc_ptr + seq)  # this sequence's query row in q / out
    if tl.load(query_start_loc_ptr + seq + 1) - row != 1:  # not a decode: not ours
        return
    ctx = tl.load(context_lens_ptr + seq)
    if SPLIT_K:
        lo = split * tokens_per_split
        hi = tl.minimum(lo + tokens_per_split, ctx)
    else:
        lo = 0
        hi = ctx

    g = tl.arange(0, GROUP_PAD)  # [G] query head within the group
    dims = tl.arange(0, DIM_PAD)  # [D]
    heads = kv_head * GROUP + g  # [G]
    q = load_rows(q_ptr + row.to(tl.int64) * stride_qt, heads * stride_qh, dims, g < GROUP,
                  HEAD_DIM)  # [G, D]
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)  # [N] positions
        n_valid = n < hi
        rows = kv_row_offsets(table_row, n, n_valid, stride_kb, stride_kt, kv_head * stride_kh,
                              BLOCK_SIZE)
        k = load_rows(k_cache_ptr, rows, dims, n_valid, HEAD_DIM)  # [N, D]
        v = load_rows(v_cache_ptr, rows, dims, n_valid, HEAD_DIM)
        acc, m_i, l_i = fold_tile(q, k, v, acc, m_i, l_i, qk_scale, n_valid[None, :],
                                  True, DOT_PRECISION, DOT_IN_FP32)

    head_mask = (g < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    if SPLIT_K:  # partial: normalised output and log2-sum-exp; an empty split has lse -inf
        has_keys = l_i > 0
        l_safe = tl.where(has_keys, l_i, 1.0)
        lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
        part = (seq.to(tl.int64) * num_heads + heads) * num_splits + split  # [G]
        tl.store(part_lse_ptr + part, lse, mask=g < GROUP)
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                 acc / l_safe[:, None], mask=head_mask)
    else:
        out = acc / l_i[:, None]
        ptrs = out_ptr + row.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + dims[None, :]
        tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=head_mask)


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, query_start_loc_ptr, num_splits, num_heads,
    stride_ot, stride_oh,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) - row != 1:
        return
    j = tl.arange(0, SPLITS_PAD)  # [J]
    dims = tl.arange(0, DIM_PAD)  # [D]
    part = (seq.to(tl.int64) * num_heads + head) * num_splits + j  # [J]
    lse = tl.load(part_lse_ptr + part, mask=j < num_splits, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))  # [J]; split 0 always holds keys, so max is finite
    mask = (j < num_splits)[:, None] & (dims < HEAD_DIM)[None, :]
    parts = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=mask,
                    other=0.0)  # [J, D]
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)  # [D]
    ptrs = out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + dims
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    query_start_loc: torch.Tensor | None = None,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    tile: DecodeTile | None = None,
) -> torch.Tensor:
    """Attention of each single-query sequence over its whole paged context.

    Without query_start_loc: one query per sequence, q: [S, nh, d] (reference.decode_attention's
    signature, but the result is in q.dtype, not float32). With it (int32 [S + 1]): q is a
    flattened mixed batch [T, nh, d] and only rows of sequences with query length 1 are
    written, into `out` ([T, nh, d], allocated if None). num_splits: None picks
    choose_num_splits (needs max_context_len; computed with a device sync if None); 1 forces
    the single-pass kernel, > 1 forces split-K. tile: launch shape (default_tile if None).
    """
    q = check_attention_inputs(q, k_cache, v_cache)
    num_seqs = context_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if query_start_loc is None:
        if q.shape[0] != num_seqs:
            raise ValueError(f"q has {q.shape[0]} rows for {num_seqs} sequences")
        query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=q.device)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0 or q.shape[0] == 0:
        return out
    tile = tile or default_tile(head_dim)
    num_splits, tokens_per_split = _resolve_splits(num_splits, max_context_len, context_lens,
                                                   num_kv_heads, tile.block_n)
    split_k = num_splits > 1
    part_shape = (num_seqs, num_heads, num_splits) if split_k else (1, 1, 1)
    part_lse = torch.empty(part_shape, dtype=torch.float32, device=q.device)
    part_out = torch.empty((*part_shape, head_dim), dtype=torch.float32, device=q.device)
    group = num_heads // num_kv_heads
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, query_start_loc,
        out, part_out, part_lse, scale * LOG2_E, tokens_per_split, num_splits, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, GROUP_PAD=pow2_at_least(group), HEAD_DIM=head_dim,
        DIM_PAD=pow2_at_least(head_dim), BLOCK_SIZE=block_size, BLOCK_N=tile.block_n,
        SPLIT_K=split_k, DOT_PRECISION=dot_precision(q.dtype, _decode_kernel),
        DOT_IN_FP32=dot_in_fp32(q.dtype, _decode_kernel),
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    if split_k:
        _reduce_splits_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, query_start_loc, num_splits, num_heads,
            out.stride(0), out.stride(1), SPLITS_PAD=pow2_at_least(num_splits, 2),
            HEAD_DIM=head_dim, DIM_PAD=pow2_at_least(head_dim), num_warps=4,
        )
    return out


def _resolve_splits(num_splits: int | None, max_context_len: int | None,
                    context_lens: torch.Tensor, num_kv_heads: int,
                    block_n: int) -> tuple[int, int]:
    """(num_splits, tokens_per_split) for a launch; see decode_attention's num_splits."""
    if num_splits is not None and num_splits <= 1:
        return 1, 0
    if max_context_len is None:
        max_context_len = int(context_lens.max())  # device sync; the engine passes it
    if num_splits is None:
        num_splits = choose_num_splits(context_lens.shape[0], num_kv_heads, max_context_len,
                                       num_sms(context_lens.device))
    return split_plan(num_splits, max(1, max_context_len), block_n)
