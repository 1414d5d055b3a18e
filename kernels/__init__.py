"""Paged-attention kernels behind one seam: `write_kv` and `paged_attention` run on the
backend that `get_attention_backend` picks (reference, cpu, triton or auto; the choice and
its rules: kernels/backends.py).

    reference.py            torch reference attention, the oracle every backend matches
    cpu_attention.py        the `cpu` backend; cpu_plan.py its per-step plan shared by layers
    native_library.py       the C library (cpu_*.c) built on first use and loaded by ctypes
    cpu_layers.py           whole small decode steps in C; cpu_elementwise.py fused CPU ops
    triton_*.py             the Triton backend (CUDA, or TRITON_INTERPRET=1 in tests)
    vml_dispatch.py         MKL VML's kernel choice settled once, when this package loads

Nothing here imports the engine, control/ or the dashboard.
"""

from __future__ import annotations

from kernels.backend_unavailable import BackendUnavailableError
from kernels.backends import (
    ATTENTION_BACKENDS,
    ATTENTION_ENV_VAR,
    AttentionBackend,
    get_attention_backend,
    paged_attention,
    use_attention_backend,
    write_kv,
)
from kernels.reference import reference_attention

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_ENV_VAR",
    "AttentionBackend",
    "BackendUnavailableError",
    "get_attention_backend",
    "paged_attention",
    "reference_attention",
    "use_attention_backend",
    "write_kv",
]
