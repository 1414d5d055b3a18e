"""Triton prefill/extend attention: each sequence's query chunk attends causally to its paged
prefix and to itself; query lengths and context lengths vary across the flattened batch.

A program owns BLOCK_M rows of one sequence and one KV head, where the rows are (query
token, head in group) pairs, so the GROUP query heads sharing a KV head read each K/V tile once:

    row r of the sequence's chunk -> token t = r // GROUP, query head kv_head * GROUP + r % GROUP
    token t sits at absolute position ctx - q_len + t and sees keys 0 .. that position

Grid: (T * GROUP // BLOCK_M + num_seqs, num_kv_heads), with no host sync. Sequence s owns
the tiles from first_tile(s) = query_start_loc[s] * GROUP // BLOCK_M + s on, which leaves it
at least the cdiv(q_len * GROUP, BLOCK_M) it needs; a program finds its sequence by binary
search over query_start_loc, and the few spare tiles exit at once. (A grid of num_seqs x
max tiles would launch ~130k empty programs for 256 decodes beside one 2048-token chunk.)

Keys are walked in two phases. Keys below the tile's first row's position (rounded down to
BLOCK_N) are visible to every row: no mask. The rest, up to the tile's last row's position,
get the causal mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_launch import (
    check_attention_inputs,
    dot_in_fp32,
    dot_precision,
    pow2_at_least,
)
from kernels.triton_tile import LOG2_E, fold_tile, kv_row_offsets, load_rows


@triton.jit
def find_sequence(query_start_loc_ptr, tile, num_seqs,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """The sequence s owning global tile `tile`: the last s with first_tile(s) <= tile, where
    first_tile(s) = query_start_loc[s] * GROUP // BLOCK_M + s rises strictly with s.
    Returns (s, tile index within s)."""
    lo = tile * 0  # invariant: first_tile(lo) <= tile < first_tile(hi), first_tile(S) = inf
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        below = tl.load(query_start_loc_ptr + mid) * GROUP // BLOCK_M + mid <= tile
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    return lo, tile - (tl.load(query_start_loc_ptr + lo) * GROUP // BLOCK_M + lo)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_loc_ptr,
    out_ptr, qk_scale, num_seqs,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_kt, stride_kh, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_QUERY_LEN: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    seq, local_tile = find_sequence(query_start_loc_ptr, tl.program_id(0), num_seqs,
                                    GROUP, BLOCK_M)
    first_row = local_tile * BLOCK_M
    kv_head = tl.program_id(1)
    start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - start
    if (first_row >= q_len * GROUP) | (q_len < MIN_QUERY_LEN):
        return
    ctx = tl.load(context_lens_ptr + seq)

    r = first_row + tl.arange(0, BLOCK_M)  # [M] rows of the chunk
    t = r // GROUP  # [M] query token within the chunk
    row_valid = t < q_len
    pos = ctx - q_len + t  # [M] absolute position of each row's token
    dims = tl.arange(0, DIM_PAD)
    heads = kv_head * GROUP + r % GROUP  # [M]
    q_rows = (start + t).to(tl.int64) * stride_qt + heads * stride_qh  # [M]
    q = load_rows(q_ptr, q_rows, dims, row_valid, HEAD_DIM)  # [M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)

    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    head_offset = kv_head * stride_kh
    last_token = (tl.minimum(first_row + BLOCK_M, q_len * GROUP) - 1) // GROUP
    # keys [0, full_end) are visible to every row; [full_end, kv_end) need the causal mask
    full_end = (ctx - q_len + first_row // GROUP + 1) // BLOCK_N * BLOCK_N
    kv_end = ctx - q_len + last_token + 1
    for n0 in range(0, full_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # [N]
        n_valid = n < full_end
        rows = kv_row_offsets(table_row, n, n_valid, stride_kb, stride_kt, head_offset,
                              BLOCK_SIZE)
        k = load_rows(k_cache_ptr, rows, dims, n_valid, HEAD_DIM)  # [N, D]
        v = load_rows(v_cache_ptr, rows, dims, n_valid, HEAD_DIM)
        acc, m_i, l_i = fold_tile(q, k, v, acc, m_i, l_i, qk_scale, n_valid[None, :],
                                  False, DOT_PRECISION, DOT_IN_FP32)
    for n0 in range(full_end, kv_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_valid = n < kv_end
        rows = kv_row_offsets(table_row, n, n_valid, stride_kb, stride_kt, head_offset,
                              BLOCK_SIZE)
        k = load_rows(k_cache_ptr, rows, dims, n_valid, HEAD_DIM)
        v = load_rows(v_cache_ptr, rows, dims, n_valid, HEAD_DIM)
        visible = (n[None, :] <= pos[:, None]) & n_valid[None, :]  # [M, N] causal
        acc, m_i, l_i = fold_tile(q, k, v, acc, m_i, l_i, qk_scale, visible,
                                  True, DOT_PRECISION, DOT_IN_FP32)

    out = acc / l_i[:, None]
    out_rows = (start + t).to(tl.int64) * stride_ot + heads * stride_oh
    mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    tl.store(out_ptr + out_rows[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=mask)


def prefill_tiles(dtype: torch.dtype, head_dim: int, rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a launch whose longest chunk has `rows` query rows
    (max_query_len * GROUP); short chunks shrink BLOCK_M, down to tl.dot's minimum of 16.

    16-bit, head_dim <= 128: 128 x 64 tiles, 8 warps (sm_90: wgmma, ~96 KB shared memory,
    187 registers, no spills at d=128). Wider heads: 64 x 32. float32 (ieee dots run on CUDA
    cores, not tensor cores; here for exact parity on small test models, not for speed):
    32 x 32, 4 warps, which spills a little only at d=128.
    """
    if dtype == torch.float32:
        block_m, block_n = 32, 32
    elif pow2_at_least(head_dim) > 128:
        block_m, block_n = 64, 32
    else:
        block_m, block_n = 128, 64
    block_m = min(block_m, pow2_at_least(rows))
    return block_m, block_n, 8 if block_m >= 128 else 4


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    *,
    skip_decodes: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a flattened batch over the paged cache ([T, nh, d] in q.dtype).

    Arguments as in reference.paged_attention. max_query_len picks the tile height
    (computed with a device sync if None). skip_decodes=True leaves the rows of single-query
    sequences unwritten (the decode kernel fills them in the same `out`).
    """
    q = check_attention_inputs(q, k_cache, v_cache)
    num_seqs = context_lens.shape[0]
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0 or num_tokens == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    group = num_heads // num_kv_heads
    block_m, block_n, num_warps = prefill_tiles(q.dtype, head_dim, max_query_len * group)
    grid = (num_tokens * group // block_m + num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, query_start_loc, out, scale * LOG2_E,
        num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, DIM_PAD=pow2_at_least(head_dim),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        MIN_QUERY_LEN=2 if skip_decodes else 1,
        DOT_PRECISION=dot_precision(q.dtype, _prefill_kernel),
        DOT_IN_FP32=dot_in_fp32(q.dtype, _prefill_kernel),
        num_warps=num_warps, num_stages=2,
    )
    return out
