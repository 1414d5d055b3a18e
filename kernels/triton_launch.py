"""What the Triton kernels' launches are made of, worked out on the host: tile sizes, dot
precision, device facts (SM count), and the checks of the attention inputs.

Nothing here launches a kernel. Importing this module imports triton, so kernels/backends.py
imports the Triton modules only when the Triton backend is asked for.
"""

from __future__ import annotations

import functools

import torch
import triton

# Streaming multiprocessors assumed when the device cannot be asked (CPU, interpreter); the
# split-K heuristic only needs an order of magnitude.
DEFAULT_NUM_SMS = 132


def pow2_at_least(n: int, floor: int = 16) -> int:
    """Smallest power of two >= max(n, floor): tile extents must be powers of two, and
    tl.dot needs every extent >= 16."""
    return max(floor, triton.next_power_of_2(max(1, int(n))))


def dot_precision(dtype: torch.dtype, kernel: object) -> str:
    """tl.dot input precision: "ieee" whenever the dot runs in float32 (float32 inputs, or
    dot_in_fp32), so fp32 stays fp32 rather than TF32 (10-bit mantissa, which would break
    fp32 parity); 16-bit inputs ignore the setting."""
    return "ieee" if dtype == torch.float32 or dot_in_fp32(dtype, kernel) else "tf32"


def dot_in_fp32(dtype: torch.dtype, kernel: object) -> bool:
    """Whether `kernel` must widen its tl.dot operands to float32: only bfloat16 under the
    interpreter, whose tl.dot (triton 3.7.1) multiplies bfloat16's raw uint16 storage and
    returns garbage. Compiled kernels always use the native 16-bit dot."""
    return dtype == torch.bfloat16 and is_interpreted(kernel)


def is_interpreted(kernel: object) -> bool:
    """True when `kernel` was built by Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


@functools.cache
def _cuda_num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (DEFAULT_NUM_SMS off CUDA)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_num_sms(index)


def check_attention_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> torch.Tensor:
    """Validate what the attention kernels assume; returns q with unit stride on head_dim.

    The caches must be contiguous and alike (both are indexed with K's strides), q must have
    the cache dtype (tl.dot takes one input type) and num_heads a multiple of num_kv_heads.
    """
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
                         f"{tuple(v_cache.shape)} {v_cache.dtype} must match")
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q.dtype={q.dtype} must equal the cache dtype {k_cache.dtype}")
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads=} must be a multiple of {num_kv_heads=}")
    if q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"q head_dim {q.shape[2]} != cache head_dim {k_cache.shape[3]}")
    return q if q.stride(2) == 1 else q.contiguous()
