"""Triton KV write: scatter this step's K/V rows into their cache slots.

Grid: one program per token. Program t reads k[t] and v[t] ([kvh, d] each, any strides)
and writes them to row slot_mapping[t] of the flat cache view [num_blocks * block_size,
kvh, d]; a slot of -1 writes nothing. Rows are cast to the cache dtype, as the reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_launch import pow2_at_least


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    heads = tl.arange(0, HEADS_PAD)[:, None]  # [HEADS_PAD, 1]
    dims = tl.arange(0, DIM_PAD)[None, :]  # [1, DIM_PAD]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    # cache row `slot` of the contiguous [slots, kvh, d] view
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store K/V rows at their slots, in place (signature and semantics of reference.write_kv).

    k, v: [T, num_kv_heads, head_dim] (any strides); slot_mapping: int [T], -1 = skip;
    k_cache, v_cache: contiguous [num_blocks, block_size, num_kv_heads, head_dim].
    """
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (they are written through a view)")
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k.shape[1:] != (num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         f"[T, {num_kv_heads}, {head_dim}] like the cache")
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=pow2_at_least(num_kv_heads, 1), DIM_PAD=pow2_at_least(head_dim, 1),
        num_warps=4,
    )
