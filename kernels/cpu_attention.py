"""Paged attention for CPU tensors: decodes read the paged cache in place, or in one gather.

Same signature and result as `kernels.reference.paged_attention` (the oracle; tests compare
the two), without its Python loop per length group and per KV head. The decode / prefill
split of a step is worked out once per step, not per layer (kernels/cpu_plan.py).

Decodes go to the native kernel (kernels/native_library.py, kernels/cpu_decode.c) wherever it
builds: it walks each block table and reads every key and value row where it lies, with an
online softmax, so nothing is copied; over SmolLM2's 30 layers at 1-64 decodes of 128
tokens it measured 1.9-2.7x faster than the torch path below (bench/cpu_attention_ab.py,
shared machine, 1 and 2 threads). NATIVE_DECODE = False, or a machine without a C
compiler, keeps the torch path:

Torch path: decodes (one query per sequence, the last position, so it sees its whole
context) are cut into KV chunks of at most `chunk_blocks` blocks, split-K style (as vLLM's
paged attention v2 and flash-decoding do):

    sequence s owns ceil(ctx_s / block_size) blocks -> ceil(owned_s / chunk_blocks) chunks
    chunk c (of sequence seq[c]) covers key positions [c0, c0 + chunk_blocks * block_size)

All chunks of all decodes go through one gather (index_select of whole blocks, into a reused
workspace: each chunk's keys are one contiguous [C, kvh * d] matrix) and two batched matmuls
over the chunks: scores (N, nh, C) and weighted values. GQA (g = nh / kvh query heads per KV
head) uses a block-diagonal query, so K/V are neither repeated nor moved (see the NOTE in
decode_attention). Each chunk keeps its own softmax max and sum; the chunks of one sequence
are merged by log-sum-exp (scatter_reduce amax + index_add). Padding is bounded by one chunk
per sequence instead of the batch's longest context: decodes at 100 and 1000 tokens read
~1100 tokens plus under two chunks of padding, not 2000. When every sequence fits in one
chunk the merge is skipped.

Prefill chunks over a bf16 cache with enough rows and (query, key) pairs take bf16 products:
all of a step's in one call to the AMX kernel (kernels/cpu_prefill_amx.py) where it builds,
else torch's flash SDPA in bf16 per chunk (kernels/cpu_prefill_sdpa.py: its GEMMs run on
AMX). The others go to the native prefill kernel (kernels/cpu_prefill.py) wherever it
builds: every chunk of the step in one call, reading the paged cache in place. Without it
they keep one float32 SDPA call per sequence (cpu_prefill_sdpa.chunk_attention: torch's CPU
flash kernel), as the reference does: padding them into one batch measured 2.5-23x slower
on mixed batches (kernels/reference.py docstring).

Everything else computes in float32 (q, K and V are cast after the gather, so a bf16 cache is
read at half the bytes) and the result is returned in q.dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import cpu_prefill, cpu_prefill_amx, cpu_prefill_sdpa, native_library
from kernels.cpu_plan import attention_plan
from kernels.workspace import workspace

# Decodes go through the native kernel (kernels/native_library.py: reads the paged cache in
# place) when it builds here; False: the torch path below (A/B runs, tests of that path).
NATIVE_DECODE = True

# Blocks per KV chunk of a decode. Measured on SmolLM2 shapes (9 heads, 3 KV heads, d 64,
# block 16, 2 threads), docs/architecture.md "Attention backends": 8 blocks = 128 tokens.
CHUNK_BLOCKS = 8


# Up to this many decodes take one SDPA call each, like prefill chunks: measured per
# layer (SmolLM2 shapes, 2 threads, quiet VM) 1 decode at 128 tokens 0.12 ms vs 0.27 ms
# batched, 4 decodes 0.31 vs 0.37, 8 at 1024 even (1.72 vs 1.79); from 24 the batch wins
# (24 at 128: 2.2 vs 1.1 ms; 64: 4.1 vs 2.1).
FEW_DECODES = 8

def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_context_len: int | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Causal attention of a flattened mixed batch over the paged KV cache (CPU tensors).

    Shapes as in kernels.reference.paged_attention: q [T, nh, d]; caches [num_blocks,
    block_size, kvh, d]; block_tables int32 [S, max_blocks]; context_lens int32 [S];
    query_start_loc int32 [S + 1]. Returns [T, nh, d] in out_dtype (default q.dtype),
    computed in float32 and rounded once: bfloat16 rows are written as such by the prefill
    kernels, where a float32 result would take a pass of its own to become the next
    projection's bf16 input.
    """
    del max_query_len, max_context_len  # the step plan carries the same information
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if q.device.type != "cpu" or k_cache.device.type != "cpu":
        raise ValueError(f"attention backend 'cpu' takes CPU tensors, got q on {q.device} and "
                         f"the cache on {k_cache.device}; use BATCHPILOT_ATTENTION=auto")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads=} must be a multiple of {num_kv_heads=}")
    plan = attention_plan(num_tokens, block_tables, context_lens, query_start_loc, k_cache.shape[1])
    out_dtype = out_dtype or q.dtype
    out = torch.empty(num_tokens, num_heads, head_dim, device=q.device,
                      dtype=torch.bfloat16 if out_dtype == torch.bfloat16 else torch.float32)
    # what both native kernels read (q itself when it already is); once for both
    q32 = _float_rows(q) if native_library.load() is not None else q
    prefills = plan.prefills
    if prefills and cpu_prefill_amx.usable(q32, k_cache, v_cache, block_tables):
        long_chunks, prefills = cpu_prefill_amx.split_chunks(prefills)
        cpu_prefill_amx.prefill_attention(q32, k_cache, v_cache, block_tables, long_chunks,
                                          scale, out)
    elif prefills and cpu_prefill_sdpa.takes(k_cache):  # long chunks: bf16 GEMMs (AMX)
        long_chunks, prefills = cpu_prefill_sdpa.split_chunks(prefills)
        cpu_prefill_sdpa.prefill_attention(q, k_cache, v_cache, block_tables, long_chunks,
                                           scale, out)
    if prefills and cpu_prefill.usable(q, k_cache, v_cache, block_tables):
        cpu_prefill.prefill_attention(q32, k_cache, v_cache, block_tables, prefills,
                                      scale, out)
    else:
        for s, lo, hi, context_len in prefills:
            out[lo:hi] = cpu_prefill_sdpa.chunk_attention(
                q[lo:hi], k_cache, v_cache, block_tables[s], context_len, scale, torch.float32)
    num_decodes = len(plan.decode_ctx)
    if num_decodes and NATIVE_DECODE and _native_ok(q, k_cache, v_cache, block_tables,
                                                    context_lens):
        _check_owned_blocks(plan, k_cache.shape[0])
        rows32 = (out if out.dtype == torch.float32  # the kernel writes float32 rows
                  else torch.empty(out.shape, dtype=torch.float32))
        native_library.decode_attention(
            native_library.load(), q32, k_cache, v_cache, block_tables,
            context_lens, plan.decode_seqs32, plan.decode_rows32, scale, rows32,
            native_library.threads_for(plan.decode_keys, num_heads))
        if rows32 is not out:  # the kernel's float32 rows, rounded into out's
            if plan.all_decodes:  # every row: one pass, no gather
                out.copy_(rows32)
            else:
                out[plan.decode_rows] = rows32[plan.decode_rows].to(out.dtype)
    elif num_decodes <= FEW_DECODES:  # one SDPA call each beats the batch's fixed cost
        for s, lo, context_len in zip(plan.decode_seqs.tolist(), plan.decode_rows.tolist(),
                                      plan.decode_ctx, strict=True):
            out[lo:lo + 1] = cpu_prefill_sdpa.chunk_attention(
                q[lo:lo + 1], k_cache, v_cache, block_tables[s], context_len, scale,
                torch.float32)
    else:
        seqs, rows = plan.decode_seqs, plan.decode_rows
        result = decode_attention(
            q.index_select(0, rows), k_cache, v_cache, block_tables.index_select(0, seqs),
            context_lens.index_select(0, seqs), scale)
        if plan.all_decodes:
            out = result
        else:
            out[rows] = result.to(out.dtype)
    return out.to(out_dtype)


def _float_rows(q: torch.Tensor) -> torch.Tensor:
    """q as the native kernels read it: float32 with heads and head_dim contiguous."""
    head_dim = q.shape[2]
    if q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == head_dim:
        return q
    return q.float().contiguous()


def _check_owned_blocks(plan, num_blocks: int) -> None:
    """The native kernel reads raw memory: every block a decode owns must be in the cache
    (torch would raise IndexError; C would read out of bounds)."""
    ids = plan.decode_block_ids
    if ids is None or ids[0] < 0 or ids[1] >= num_blocks:
        raise ValueError(f"block_tables must give every decode ceil(context_len / block_size)"
                         f" block ids in 0..{num_blocks - 1}; got ids in {ids} (None: a row"
                         f" too short)")


def _native_ok(q, k_cache, v_cache, block_tables, context_lens) -> bool:
    """Whether the native kernel can read these tensors as they are (raw pointers: the
    caches, block table and lengths must be contiguous int32 / float rows)."""
    return (k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.dtype == v_cache.dtype
            and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
            and context_lens.dtype == torch.int32 and context_lens.is_contiguous()
            and native_library.supports(q, k_cache))


def chunk_layout(context_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int,
                 chunk_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each sequence's blocks into chunks of `chunk_blocks` (fewer when the longest
    sequence owns fewer). Returns (seq_of_chunk int64 [N], block ids int64 [N * P], hidden
    bool [N, P * block_size]: key slots past the sequence's context, to mask out). Padding
    slots read block 0 (any valid block) and are hidden.

    NOTE: host index math in numpy: torch's CPU ops split even tiny jobs across threads and
    can stall for milliseconds each on a busy machine, and this runs once per layer."""
    ctx = context_lens.numpy().astype(np.int64)  # (S,)
    table = block_tables.numpy()
    owned = (ctx + block_size - 1) // block_size  # (S,) blocks each sequence owns
    width = max(1, min(chunk_blocks, int(owned.max())))  # P: blocks per chunk
    num_chunks = (owned + width - 1) // width  # (S,)
    seq_of_chunk = np.repeat(np.arange(len(ctx)), num_chunks)  # (N,)
    first_chunk = np.cumsum(num_chunks) - num_chunks  # (S,)
    chunk_in_seq = np.arange(len(seq_of_chunk)) - first_chunk[seq_of_chunk]  # (N,)
    block_pos = chunk_in_seq[:, None] * width + np.arange(width)  # (N, P) within the seq
    in_use = block_pos < owned[seq_of_chunk, None]
    ids = table[seq_of_chunk[:, None], np.minimum(block_pos, table.shape[1] - 1)]
    blocks = np.where(in_use, ids, 0).astype(np.int64).reshape(-1)  # (N * P,)
    key_pos = block_pos[:, :, None] * block_size + np.arange(block_size)  # (N, P, bs)
    hidden = key_pos.reshape(len(seq_of_chunk), -1) >= ctx[seq_of_chunk, None]  # (N, P*bs)
    return torch.from_numpy(seq_of_chunk), torch.from_numpy(blocks), torch.from_numpy(hidden)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    chunk_blocks: int | None = None,
) -> torch.Tensor:
    """One query per sequence, all sequences at once: q [S, nh, d] -> float32 [S, nh, d].

    Each query is its sequence's last position and sees the whole context (no causal mask,
    only the padding past context_lens[s] is hidden). chunk_blocks: blocks per KV chunk
    (default CHUNK_BLOCKS). Padding slots are masked out of the scores but multiply their
    values by an exact 0, so the cache must hold finite numbers everywhere (allocate_kv_caches
    zeroes it; the reference's batched decode has the same contract)."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    seq_of_chunk, blocks, hidden = chunk_layout(context_lens, block_tables, block_size,
                                                chunk_blocks or CHUNK_BLOCKS)
    num_chunks, width = hidden.shape  # N chunks of C = P * block_size key slots
    kv_width = num_kv_heads * head_dim
    # Whole blocks in cache order: each chunk's keys are one contiguous [C, kvh * d] matrix.
    keys = _gather_float(k_cache, blocks, "attention.keys").view(num_chunks, width, kv_width)
    values = _gather_float(v_cache, blocks, "attention.values").view(num_chunks, width, kv_width)
    # NOTE: GQA by a block-diagonal query instead of moving heads in front of the keys (a
    # copy of the whole context, which cost more than the math): row h * g + i of q_bd holds
    # query head h * g + i in columns of KV head h and zeros elsewhere, so one bmm over the
    # (C, kvh * d) keys yields every head's scores. It does kvh x the multiply-adds (3x for
    # SmolLM2), cheap next to the gather; the zeros add exact zeros for finite keys.
    q_bd = q.new_zeros(num_seqs, num_kv_heads, group, num_kv_heads, head_dim,
                       dtype=torch.float32)
    q_bd.diagonal(dim1=1, dim2=3).copy_(
        (q.float() * scale).view(num_seqs, num_kv_heads, group, head_dim).permute(0, 2, 3, 1))
    q_c = q_bd.view(num_seqs, num_heads, kv_width).index_select(0, seq_of_chunk)  # (N, nh, kvh*d)
    scores = torch.bmm(q_c, keys.transpose(1, 2))  # (N, nh, C)
    scores.masked_fill_(hidden[:, None, :], float("-inf"))
    # Every chunk holds at least one visible key (its first block is owned), so m is finite.
    m = scores.amax(dim=-1, keepdim=True)  # (N, nh, 1)
    probs = scores.sub_(m).exp_()
    denom = probs.sum(dim=-1)  # (N, nh)
    # (N, nh, kvh*d): head h * g + i's output is its KV head h's column block (the diagonal)
    mixed = torch.bmm(probs, values).view(num_chunks, num_kv_heads, group, num_kv_heads,
                                          head_dim)
    partial = mixed.diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # (N, kvh, g, d)
    partial = partial.reshape(num_chunks, num_heads, head_dim)  # unnormalised
    if num_chunks == num_seqs:  # one chunk per sequence: a plain softmax, nothing to merge
        return partial / denom[..., None]
    return _merge_chunks(partial, denom, m[..., 0], seq_of_chunk, num_seqs)


def _gather_float(cache: torch.Tensor, blocks: torch.Tensor, name: str) -> torch.Tensor:
    """cache[blocks] as float32 [len(blocks), block_size, kvh, d] in a reused workspace (a
    lower-precision cache is gathered at its own width, then widened)."""
    shape = (len(blocks), *cache.shape[1:])
    if cache.dtype == torch.float32:
        return torch.index_select(cache, 0, blocks, out=workspace(name, shape, torch.float32))
    narrow = torch.index_select(cache, 0, blocks, out=workspace(name, shape, cache.dtype))
    return workspace(name, shape, torch.float32).copy_(narrow)


def _merge_chunks(partial, denom, chunk_max, seq_of_chunk, num_seqs: int) -> torch.Tensor:
    """Log-sum-exp merge of per-chunk softmax parts -> float32 [S, nh, d].

    partial: (N, nh, d) = sum_j exp(s_j - m_c) v_j over chunk c's keys j; denom: (N, nh) =
    sum_j exp(s_j - m_c); chunk_max: (N, nh) = m_c. With M the sequence's max over its
    chunks: out = sum_c exp(m_c - M) partial_c / sum_c exp(m_c - M) denom_c."""
    _, num_heads, head_dim = partial.shape
    index = seq_of_chunk[:, None].expand_as(chunk_max)
    seq_max = chunk_max.new_full((num_seqs, num_heads), float("-inf"))
    seq_max.scatter_reduce_(0, index, chunk_max, reduce="amax")
    weight = (chunk_max - seq_max.index_select(0, seq_of_chunk)).exp_()  # (N, nh)
    num = partial.new_zeros(num_seqs, num_heads, head_dim)
    num.index_add_(0, seq_of_chunk, partial * weight[..., None])
    den = denom.new_zeros(num_seqs, num_heads)
    den.index_add_(0, seq_of_chunk, denom * weight)
    return num / den[..., None]
