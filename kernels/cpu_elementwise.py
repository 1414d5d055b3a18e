"""The work between a decoder layer's projections in native calls (kernels/cpu_elementwise.c).

For steps the native decode layers do not take (prefills, mixed steps, large decode
batches) the projections stay torch's (oneDNN; AMX on the bf16 copies) and each stretch
between two of them is one call here: residual add + RMSNorm (written in the next
projection's dtype, so it needs no cast), SwiGLU, and RoPE + the KV write.
engine/models/fused_layers.py decides per step whether it applies and checks what C
cannot (shapes, slots inside the caches). Tensors: CPU, contiguous; "act" tensors float32
or bfloat16.
"""

from __future__ import annotations

import torch

from kernels import native_library

ROW_MAX = 16384  # ROW_MAX of cpu_elementwise.c: the widest row a call takes (elements)
PARALLEL_MIN_ELEMENTS = 32768  # below, one thread: waking the second costs more
# False: the torch ops always (A/B runs, tests of the torch path).
NATIVE_ELEMENTWISE = True


def available() -> bool:
    """Whether these calls run here (NATIVE_ELEMENTWISE on and the library builds)."""
    return NATIVE_ELEMENTWISE and native_library.load() is not None


def takes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether a layer of these sizes fits the kernels' row buffers (and RoPE's even d)."""
    return (hidden <= ROW_MAX and 3 * intermediate <= ROW_MAX and head_dim % 2 == 0
            and (heads + 2 * kv_heads) * head_dim <= ROW_MAX)


def _threads(elements: int) -> int:
    return 1 if elements < PARALLEL_MIN_ELEMENTS else torch.get_num_threads()


def _is_bf16(t: torch.Tensor) -> int:
    return int(t.dtype == torch.bfloat16)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise ValueError(f"{what} is too wide for the native elementwise kernels"
                         f" ({ROW_MAX=}; check with takes() first)")


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None,
                eps: float, out_dtype: torch.dtype) -> torch.Tensor | None:
    """x += delta in place (x float32 [T, D], delta act [T, D] or None); then, with a
    weight (float32 [D]), rmsnorm(x) * weight as a new [T, D] tensor of out_dtype."""
    rows, dim = x.shape
    out = None if weight is None else torch.empty(rows, dim, dtype=out_dtype)
    status = native_library.load().bp_add_rmsnorm(
        x.data_ptr(), None if delta is None else delta.data_ptr(),
        0 if delta is None else _is_bf16(delta), None if weight is None else weight.data_ptr(),
        eps, None if out is None else out.data_ptr(), 0 if out is None else _is_bf16(out),
        rows, dim, _threads(rows * dim))
    _check(status, f"hidden size {dim}")
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up act [T, 2I] -> silu(gate) * up, [T, I] in gate_up's dtype (computed in
    float32 and rounded once; torch's bf16 SwiGLU rounds after silu and after the product)."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype)
    status = native_library.load().bp_silu_mul(gate_up.data_ptr(), _is_bf16(gate_up),
                                           out.data_ptr(), _is_bf16(out), rows, inter,
                                           _threads(rows * inter))
    _check(status, f"intermediate size {inter}")
    return out


def rope_store(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slots: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor,
               num_heads: int) -> torch.Tensor:
    """qkv act [T, (nh + 2 kvh) d] -> q float32 [T, nh, d] rotated; k rotated and v
    written at slots (int64 [T], every one a slot of the caches [.., bs, kvh, d], float32
    or bfloat16 (rounded as .to(bfloat16)): the caller checks, C writes raw memory); cos,
    ssin float32 [T, d]."""
    rows, (kv_heads, head_dim) = qkv.shape[0], k_cache.shape[2:]
    q = torch.empty(rows, num_heads, head_dim, dtype=torch.float32)
    status = native_library.load().bp_rope_store(
        qkv.data_ptr(), _is_bf16(qkv), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        _is_bf16(k_cache), slots.data_ptr(), cos.data_ptr(), ssin.data_ptr(), rows,
        num_heads, kv_heads, head_dim, _threads(qkv.numel()))
    _check(status, f"{num_heads} + 2 x {kv_heads} heads of {head_dim} (or an odd head_dim)")
    return q
