"""Long prefill chunks over a bf16 KV cache through torch's flash SDPA in bf16.

The native prefill kernel (kernels/cpu_prefill.c) computes in float32 with AVX-512 FMAs:
~90 GFLOP/s on 2 threads however long the chunk. torch's CPU flash attention on bf16
inputs runs its score and value products as bf16 GEMMs (AMX where the CPU has it): 230-335
GFLOP/s from 128 query rows, at the cost of a gather of the chunk's context (already bf16:
no conversion) and ~40 us a call. Measured per chunk (SmolLM2 shapes: 9 heads, 3 KV heads,
d 64, block 16, 2 threads; ms, native / SDPA): 16 rows over 16 keys 0.043 / 0.049, 40 over
100 0.126 / 0.142, 64 over 64 0.100 / 0.080, 16 over 600 0.311 / 0.204, 128 over 128
0.264 / 0.132, 256 over 256 0.883 / 0.289, 510 over 510 3.27 / 1.29, 256 over 512 2.37 /
0.68. So a chunk goes here when it has at least MIN_ROWS rows and MIN_PAIRS (query, key)
pairs; the rest stay in the native kernel's one call.

Precision: q and the softmax weights are rounded to bf16 before their products (K and V
already are, in a bf16 cache); scores, the softmax and the sums stay float32. Against the
float32 kernel that is ~1% of an output's scale (tests/kernels/test_cpu_prefill_sdpa.py);
bench.dtype_agreement reports what it does to greedy decoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.reference import causal_mask, gather_kv

MIN_ROWS = 8
MIN_PAIRS = 4096
# False: every prefill chunk stays in the native kernel (A/B runs, parity tests).
SDPA_PREFILL = True

Chunk = tuple[int, int, int, int]  # (sequence, first row, end row, context length)


def takes(k_cache: torch.Tensor) -> bool:
    """Whether chunks over this cache may come here (a bf16 cache: nothing to widen)."""
    return SDPA_PREFILL and k_cache.dtype == torch.bfloat16


def split_chunks(prefills: tuple[Chunk, ...], min_rows: int = MIN_ROWS,
                 min_pairs: int = MIN_PAIRS) -> tuple[list[Chunk], list[Chunk]]:
    """(chunks of at least min_rows rows and min_pairs (query, key) pairs: for SDPA, or
    another bf16 path with its own bounds; the rest, for the native float32 kernel), each
    in step order."""
    mine, rest = [], []
    for chunk in prefills:
        _, lo, hi, ctx = chunk
        rows = hi - lo
        pairs = rows * ctx - rows * (rows - 1) // 2  # each row sees its prefix and itself
        (mine if rows >= min_rows and pairs >= min_pairs else rest).append(chunk)
    return mine, rest


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, chunks: list[Chunk], scale: float,
                      out: torch.Tensor) -> None:
    """out[lo:hi] = causal attention of q[lo:hi] over sequence s's first `ctx` keys (the
    chunk's own last), in bf16, for each (s, lo, hi, ctx) of `chunks`, in place.

    q [T, nh, d] any float dtype; caches bf16 [num_blocks, block_size, kvh, d]; out float32
    [T, nh, d]."""
    for s, lo, hi, ctx in chunks:
        out[lo:hi] = chunk_attention(q[lo:hi], k_cache, v_cache, block_tables[s], ctx, scale,
                                     torch.bfloat16)


def chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    table_row: torch.Tensor, ctx: int, scale: float,
                    dtype: torch.dtype) -> torch.Tensor:
    """One chunk q [rows, nh, d] over its sequence's first `ctx` keys (its own last) by one
    SDPA call in `dtype` -> [rows, nh, d] in `dtype`. The context is gathered from the
    blocks of table_row (index_select: IndexError for a block outside the cache)."""
    rows, num_heads, num_kv_heads = q.shape[0], q.shape[1], k_cache.shape[2]
    k = gather_kv(k_cache, table_row, ctx).to(dtype).transpose(0, 1)[None]  # (1, kvh, C, d)
    v = gather_kv(v_cache, table_row, ctx).to(dtype).transpose(0, 1)[None]
    query = q.to(dtype).transpose(0, 1)[None]  # (1, nh, rows, d)
    # one row is the last position: it sees every key. is_causal aligns its mask top-left,
    # which is right only when the chunk is its whole context; else the mask is explicit
    mask = None if rows in (1, ctx) else causal_mask(rows, ctx, q.device)
    o = F.scaled_dot_product_attention(query, k, v, attn_mask=mask,
                                       is_causal=mask is None and rows > 1, scale=scale,
                                       enable_gqa=num_heads != num_kv_heads)
    return o[0].transpose(0, 1)
