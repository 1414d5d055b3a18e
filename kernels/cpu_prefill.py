"""Prefill chunks' attention through the native kernel (kernels/cpu_prefill.c): every
prefill chunk of a step in one call, reading keys and values where they lie in the paged
cache (float32 or bfloat16), instead of one gather, one cast and one SDPA call per chunk
(kernels/cpu_attention.py keeps that path where this one does not apply).

Same result as kernels.reference's causal attention of a chunk over its prefix and itself,
computed in float32 in another summation order (tests/kernels/test_cpu_prefill.py).
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import native_library

# False: prefill chunks take torch's SDPA (A/B runs, the parity tests of that path).
NATIVE_PREFILL = True
MAX_D = 256  # head_dim (cpu_prefill.c)
ITEM_MAX = 16384  # query heads per KV head x head_dim


def usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors as they are (raw pointers, its limits)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    return (NATIVE_PREFILL and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.dtype == v_cache.dtype and k_cache.dtype in (torch.float32,
                                                                   torch.bfloat16)
            and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
            and head_dim <= MAX_D and num_heads % kv_heads == 0
            and (num_heads // kv_heads) * head_dim <= ITEM_MAX
            and native_library.load() is not None)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, prefills: list[tuple[int, int, int, int]],
                      scale: float, out: torch.Tensor) -> None:
    """out[lo:hi] = causal attention of q[lo:hi] over sequence s's first `ctx` keys (the
    chunk's own last), for each (s, lo, hi, ctx) of `prefills`, in place.

    q float32 [T, nh, d] with heads and d contiguous; out float32 or bfloat16 (each row
    rounded once, as .to(bfloat16)) contiguous [T, nh, d];
    the other tensors as `usable` requires. ValueError when a chunk's blocks are not all
    inside the cache (torch would raise IndexError; C would read out of bounds)."""
    arrays = chunk_arrays(prefills, block_tables, k_cache.shape[1], k_cache.shape[0])
    num_heads, head_dim = q.shape[1], q.shape[2]
    status = native_library.load().bp_prefill_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), len(prefills), *(a.data_ptr() for a in arrays),
        num_heads, k_cache.shape[2], head_dim, k_cache.shape[1], block_tables.data_ptr(),
        block_tables.stride(0), scale, out.data_ptr(), int(out.dtype == torch.bfloat16),
        torch.get_num_threads())
    if status != 0:
        raise ValueError(f"{num_heads=}, {head_dim=}: outside the native prefill kernel's "
                         f"limits (head_dim <= {MAX_D}, heads per KV head x head_dim <= "
                         f"{ITEM_MAX})")


def chunk_arrays(prefills: list[tuple[int, int, int, int]], block_tables: torch.Tensor,
                 block_size: int, num_blocks: int) -> list[torch.Tensor]:
    """The chunks' sequences, first rows, row counts and contexts as int32 arrays for the
    native kernels, checked: ValueError for a chunk without rows, one that sees fewer keys
    than its rows, or one whose blocks are not all inside the cache."""
    chunks = np.asarray(prefills, dtype=np.int64).reshape(-1, 4)  # (C, 4)
    seqs, lo, hi, ctx = chunks.T
    if (hi <= lo).any() or (ctx < hi - lo).any():
        raise ValueError(f"prefill chunks must have rows and see at least their own keys: "
                         f"{prefills}")
    _check_blocks(block_tables, seqs, ctx, block_size, num_blocks)
    return [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))
            for a in (seqs, lo, hi - lo, ctx)]


def _check_blocks(block_tables: torch.Tensor, seqs: np.ndarray, ctx: np.ndarray,
                  block_size: int, num_blocks: int) -> None:
    """Every block id each chunk's context reads lies in the cache: one numpy pass over the
    chunks' table rows (this runs once per layer), no loop per chunk."""
    table = block_tables.numpy()
    owned = (ctx + block_size - 1) // block_size
    if (seqs < 0).any() or (seqs >= table.shape[0]).any() or (owned > table.shape[1]).any():
        raise ValueError("prefill chunks name a sequence or a context outside block_tables")
    ids = table[seqs, :int(owned.max())]  # (C, most blocks a chunk reads)
    read = np.arange(ids.shape[1]) < owned[:, None]
    bad = read & ((ids < 0) | (ids >= num_blocks))
    if bad.any():
        row = int(bad.any(axis=1).argmax())
        raise ValueError(f"sequence {int(seqs[row])}'s block ids must lie in "
                         f"0..{num_blocks - 1}: {ids[row, :owned[row]].tolist()}")
