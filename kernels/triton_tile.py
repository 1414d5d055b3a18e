"""The device-side core the decode and prefill kernels share: gather a KV tile from the paged
cache, and fold it into an online softmax.

Online softmax (flash attention), per query row, in float32 and base 2:

    s = (q . k) * scale * log2(e)          # [M, N] scores of this tile, log2 units
    m' = max(m, rowmax(s))                  # running max
    l' = l * 2^(m - m') + rowsum(2^(s - m'))
    acc' = acc * 2^(m - m') + 2^(s - m') @ v
    out = acc / l  after the last tile;  logsumexp (log2) = m + log2(l)

Every row must see at least one key in the first tile it folds (true for both kernels:
key 0 for prefill rows, the split's first key for decode rows), so m is finite after it
and 2^(m - m') never evaluates -inf - -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # scores are scaled by scale * LOG2_E and exponentiated with exp2


@triton.jit
def kv_row_offsets(table_row_ptr, n, n_valid, stride_block, stride_token, head_offset,
                   BLOCK_SIZE: tl.constexpr):
    """Element offsets [N] of token positions n ([N] int32) of one sequence in a cache
    [num_blocks, BLOCK_SIZE, kvh, d]: table_row_ptr points at its block-table row. Positions
    with n_valid False read no block-table entry (padding entries are never dereferenced)."""
    block = tl.load(table_row_ptr + n // BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)
    return block * stride_block + (n % BLOCK_SIZE) * stride_token + head_offset


@triton.jit
def load_rows(base_ptr, row_offsets, dims, row_mask, HEAD_DIM: tl.constexpr):
    """[N, DIM_PAD] tile: row i at base_ptr + row_offsets[i], zero where masked or d >= HEAD_DIM."""
    mask = row_mask[:, None] & (dims[None, :] < HEAD_DIM)
    return tl.load(base_ptr + row_offsets[:, None] + dims[None, :], mask=mask, other=0.0)


@triton.jit
def fold_tile(q, k, v, acc, m_i, l_i, qk_scale, visible,
              MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """One online-softmax step. q: [M, D]; k, v: [N, D]; acc: f32 [M, D]; m_i, l_i: f32 [M];
    visible: bool broadcastable to [M, N], applied only when MASKED. Returns (acc, m_i, l_i).

    DOT_IN_FP32 (interpreter only, see triton_launch.dot_in_fp32) widens 16-bit operands to
    float32 before each tl.dot, after rounding p to 16 bits as a GPU does: products of 16-bit
    values are exact in float32, so this mirrors a tensor core's fp32 accumulation (except
    that the interpreter truncates fp32 -> bf16 where a GPU rounds to nearest even).
    """
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [M, N] f32
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # [M]
    alpha = tl.exp2(m_i - m_new)  # [M], 0 on the first tile (m_i = -inf)
    p = tl.exp2(s - m_new[:, None])  # [M, N]
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)  # the rounding a 16-bit tensor-core dot sees
    if DOT_IN_FP32:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    acc = tl.dot(p, v, acc=acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
