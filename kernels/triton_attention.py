"""The Triton backend: `write_kv` and `paged_attention` with the reference's signatures.

A mixed batch takes two launches writing disjoint rows of one output, with no host sync:

    decode kernel   sequences with query length 1 (the others exit at once)
    prefill kernel  sequences with query length >= 2 (the decodes exit at once); skipped
                    when max_query_len == 1, the steady state of a decode-heavy server

Why not the prefill kernel for every row: its query tile is BLOCK_M (up to 128) rows, so a
decode's GROUP rows (4 for Llama-3) would pay up to 32x the tensor-core work of the decode
kernel's 16-row tile for the same K/V bytes, and it has no split-K for long contexts.

Triton runs on CUDA tensors, or on CPU in its interpreter when TRITON_INTERPRET=1 was set
before this module's kernels were imported (tests). Anything else is refused with a
BackendUnavailableError naming the fix, before any launch.
"""

from __future__ import annotations

import os

import torch

from kernels import triton_decode, triton_kv_write, triton_prefill
from kernels.backend_unavailable import BackendUnavailableError
from kernels.triton_launch import is_interpreted


def kernels_interpreted() -> bool:
    """True when the kernels were built by Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    kernels = (triton_kv_write._kv_write_kernel, triton_decode._decode_kernel,
               triton_decode._reduce_splits_kernel, triton_prefill._prefill_kernel)
    return all(is_interpreted(kernel) for kernel in kernels)


def cpu_unavailable_reason() -> str | None:
    """Why Triton cannot run on CPU tensors in this process, or None when it can."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return ("Triton kernels need CUDA tensors; on CPU they run only in Triton's interpreter "
                "(TRITON_INTERPRET=1 set before the kernels are imported, for tests). "
                "Set BATCHPILOT_ATTENTION=reference (or auto) to use the torch reference")
    if not kernels_interpreted():
        return ("TRITON_INTERPRET=1 was set after kernels.triton_* were imported, so they are "
                "compiled kernels that need CUDA tensors; set it before the first import, or "
                "set BATCHPILOT_ATTENTION=reference (or auto)")
    return None


def _check_device(tensor: torch.Tensor) -> None:
    if tensor.device.type == "cuda":
        return
    reason = cpu_unavailable_reason() if tensor.device.type == "cpu" else (
        f"Triton kernels cannot run on {tensor.device.type} tensors; "
        "set BATCHPILOT_ATTENTION=reference")
    if reason is not None:
        raise BackendUnavailableError(f"attention backend 'triton' on {tensor.device}: {reason}")


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store K/V rows at their slots (see reference.write_kv), with the Triton kernel."""
    _check_device(k_cache)
    triton_kv_write.write_kv(k_cache, v_cache, k, v, slot_mapping)


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
) -> torch.Tensor:
    """Paged causal attention of a flattened mixed batch (see reference.paged_attention).

    max_query_len / max_context_len are the step's host-side maxima (the engine passes them);
    when None they are computed from the tensors, which costs a device sync. Unlike the
    reference, a query longer than its context is not detected (that would need a sync).
    Returns [T, num_heads, head_dim] in q.dtype.
    """
    _check_device(q)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0 or context_lens.shape[0] == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    # every sequence has max_query_len tokens iff T == S * max_query_len: then no decodes
    if max_query_len == 1 or q.shape[0] < context_lens.shape[0] * max_query_len:
        triton_decode.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale,
            query_start_loc=query_start_loc, max_context_len=max_context_len, out=out,
        )
    if max_query_len > 1:
        triton_prefill.prefill_attention(
            q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
            max_query_len, skip_decodes=True, out=out,
        )
    return out
