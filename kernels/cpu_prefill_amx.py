"""Long prefill chunks over a bf16 KV cache on bf16 tiles: every such chunk of a step in one
call, reading the paged cache where it lies, both products on AMX tiles
(kernels/cpu_prefill_amx.c) or, on a CPU without AMX, the same kernel's body on AVX-512-BF16
(kernels/cpu_prefill_bf16.c), the softmax in AVX-512. Where neither builds or it does not
apply (a head_dim other than 64 or 128, a float32 cache) those chunks keep torch's flash SDPA
in bf16 (kernels/cpu_prefill_sdpa.py), which rounds the same operands to bf16: q * scale and
the softmax weights (tests/kernels/test_cpu_prefill_amx.py holds all three to the float32
reference).
"""

from __future__ import annotations

import torch

from kernels import cpu_amx_q4, cpu_prefill_sdpa, native_library
from kernels.cpu_prefill import chunk_arrays

# False: long chunks take torch's SDPA (A/B runs, the parity tests of that path).
AMX_PREFILL = True
HEAD_DIMS = (64, 128)  # cpu_prefill_amx.c
# The tiles that may run the kernel, the first one here wins: AMX where the OS grants it,
# else AVX-512-BF16 (kernels/cpu_tiles_avx512.h: 16x the instructions of a tile product, still
# 2.4-2.8x torch's SDPA there). Tests narrow it to one kind to check each.
TILE_KINDS = ("AMX", "AVX512-BF16")
_ENTRY = {"AMX": "bp_prefill_attention_amx", "AVX512-BF16": "bp_prefill_attention_bf16"}
# Chunks with at least MIN_ROWS rows and MIN_PAIRS (query, key) pairs come here, the rest go
# to the float32 kernel (cpu_prefill.c), which packs nothing. Measured with 8 chunks alike
# (SmolLM2 shapes: 9 heads, 3 KV heads, d 64, block 16, 2 threads; ms, AMX / float32): 16
# rows over 16 keys 0.19 / 0.12, 32 over 32 0.20 / 0.23, 64 over 64 0.38 / 0.65, 16 over 200
# 0.37 / 0.64, 8 over 600 1.35 / 1.16 (packing 600 keys for 8 rows), 4 over 300 0.38 / 0.35.
# Against torch's bf16 SDPA, which it replaces, it was faster in every case tried (a step of
# SmolLM2 prefills from the Azure trace: 7.8 against 16.6 ms a layer; 2,048 fresh rows 8.4
# against 9.5).
MIN_ROWS = 12
MIN_PAIRS = 1024


def split_chunks(prefills) -> tuple[list, list]:
    """(chunks for this kernel, chunks for the float32 kernel), each in step order."""
    return cpu_prefill_sdpa.split_chunks(prefills, MIN_ROWS, MIN_PAIRS)


def usable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors as they are: a contiguous bf16 cache, float32
    q with heads and d contiguous, int32 block tables, and a library built with AMX."""
    return (q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == q.shape[2]
            and v_cache.dtype == k_cache.dtype
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and q.shape[1] % k_cache.shape[2] == 0
            and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
            and serves(k_cache.dtype, q.shape[2]))


def serves(kv_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether a model with this KV cache dtype and head_dim gets this kernel here."""
    return serving_tiles(kv_dtype, head_dim) is not None


def serving_tiles(kv_dtype: torch.dtype, head_dim: int) -> str | None:
    """The tiles ("AMX", "AVX512-BF16") that run this kernel for a model with this KV cache
    dtype and head_dim here, or None (what a server's ready line says)."""
    if AMX_PREFILL and kv_dtype == torch.bfloat16 and head_dim in HEAD_DIMS:
        return tile_kind()
    return None


def tile_kind() -> str | None:
    """The first of TILE_KINDS this machine runs: AMX built and granted, AVX-512-BF16 built
    (kernels/cpu_prefill_bf16.c), or None (no library, or neither)."""
    lib = native_library.load()
    if lib is None:
        return None
    for kind in TILE_KINDS:
        if cpu_amx_q4.available() if kind == "AMX" else lib.bp_prefill_bf16_built() == 1:
            return kind
    return None


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, chunks: list[tuple[int, int, int, int]],
                      scale: float, out: torch.Tensor) -> None:
    """out[lo:hi] = causal attention of q[lo:hi] over sequence s's first `ctx` keys (the
    chunk's own last), for each (s, lo, hi, ctx) of `chunks`, in place; q float32 [T, nh, d],
    out float32 or bfloat16 (each row rounded once, as .to(bfloat16)) contiguous [T, nh, d],
    the rest as `usable` requires. ValueError for a chunk whose blocks lie outside the
    cache. Should the kernel refuse after `usable` said yes (its scratch could not be
    allocated), the chunks take torch's bf16 SDPA instead."""
    if not chunks:
        return
    arrays = chunk_arrays(chunks, block_tables, k_cache.shape[1], k_cache.shape[0])
    kind = tile_kind()
    entry = getattr(native_library.load(), _ENTRY[kind]) if kind else None
    status = -1 if entry is None else entry(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), len(chunks),
        *(a.data_ptr() for a in arrays), q.shape[1], k_cache.shape[2], q.shape[2],
        k_cache.shape[1], block_tables.data_ptr(), block_tables.stride(0), scale,
        out.data_ptr(), int(out.dtype == torch.bfloat16), torch.get_num_threads())
    if status != 0:  # usable() checked every limit: out of memory, or the tiles taken away
        cpu_prefill_sdpa.prefill_attention(q, k_cache, v_cache, block_tables, chunks, scale,
                                           out)
