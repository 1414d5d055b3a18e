"""The attention backends and the choice among them: `write_kv` and `paged_attention` dispatch
to one.

Backends share the signatures of `kernels.reference`. The choice comes from an explicit name
or the environment variable BATCHPILOT_ATTENTION, read when a backend is requested (an
Attention layer requests one when it is built):

    reference  torch reference (any device): the oracle the other backends are tested against
    cpu        CPU tensors (kernels/cpu_attention.py): decodes read the paged cache in place
               in a native kernel (kernels/native_library.py, compiled on first use; without a
               C compiler, all of a step's decodes in one torch gather and two matmuls)
    triton     Triton kernels (kernels/triton_*.py): CUDA tensors, or CPU tensors under
               TRITON_INTERPRET=1 (tests); anything else raises BackendUnavailableError
    auto       the default: per call, Triton for CUDA tensors (the reference when triton does
               not import), "cpu" for CPU tensors (on a machine without CUDA it is "cpu" itself)

The name is fixed when the layer is built, so an A/B run forces either side by name; the
device is looked at per call under "auto", so a model built on CPU and moved to a GPU (or
used on both) takes the right path. `use_attention_backend(model, name)` re-points the
attention layers of a built model.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels import cpu_attention, cpu_plan, reference, vml_dispatch
from kernels.backend_unavailable import BackendUnavailableError

vml_dispatch.settle_vml_dispatch()  # before any step: see kernels/vml_dispatch.py

ATTENTION_ENV_VAR = "BATCHPILOT_ATTENTION"
ATTENTION_BACKENDS = ("reference", "cpu", "triton", "auto")


class AttentionBackend(NamedTuple):
    """The two entry points a model's attention layer calls, plus the backend's name."""

    name: str
    write_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


_REFERENCE = AttentionBackend("reference", reference.write_kv, reference.paged_attention)
_CPU = AttentionBackend("cpu", cpu_plan.write_kv, cpu_attention.paged_attention)
_FALLBACK_HINT = f"set {ATTENTION_ENV_VAR}=reference (or auto) to use the torch reference"


def _triton_backend() -> AttentionBackend:
    """Import the Triton kernels (first call only) and wrap them as a backend."""
    from kernels import triton_attention

    return AttentionBackend("triton", triton_attention.write_kv, triton_attention.paged_attention)


def _require_triton() -> AttentionBackend:
    """The Triton backend, or a BackendUnavailableError saying why this machine cannot run it."""
    if importlib.util.find_spec("triton") is None:
        raise BackendUnavailableError(
            f"attention backend 'triton' needs the triton package (pip install 'triton>=3.6'); "
            f"{_FALLBACK_HINT}")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise BackendUnavailableError(
            "attention backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1, Triton's "
            f"slow CPU interpreter, for tests) and none is available; {_FALLBACK_HINT}")
    return _triton_backend()


def _auto_backend() -> AttentionBackend:
    """Per-call choice by device: Triton for CUDA tensors, "cpu" for CPU tensors."""
    try:
        cuda_backend = _REFERENCE  # triton absent: the reference serves CUDA tensors
        if importlib.util.find_spec("triton") is not None:
            cuda_backend = _triton_backend()
    except ImportError as exc:  # triton missing or broken: the reference still serves
        warnings.warn(f"triton unavailable ({exc}); CUDA attention uses the torch reference",
                      stacklevel=3)
        cuda_backend = _REFERENCE

    def write_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
        chosen = cuda_backend if k_cache.is_cuda else _CPU
        chosen.write_kv(k_cache, v_cache, k, v, slot_mapping)

    def paged_attention(q, *args, **kwargs) -> torch.Tensor:
        chosen = cuda_backend if q.is_cuda else _CPU
        return chosen.paged_attention(q, *args, **kwargs)

    return AttentionBackend("auto", write_kv, paged_attention)


def get_attention_backend(name: str | None = None) -> AttentionBackend:
    """Resolve `name` (default: $BATCHPILOT_ATTENTION, else "auto") to a backend.

    Raises ValueError for an unknown name and BackendUnavailableError for "triton" on a
    machine that cannot run it (no triton, or neither CUDA nor TRITON_INTERPRET=1).
    """
    choice = (name or os.environ.get(ATTENTION_ENV_VAR) or "auto").strip().lower()
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(
            f"{ATTENTION_ENV_VAR}={choice!r} is not a backend; choose one of {ATTENTION_BACKENDS}"
        )
    if choice == "reference":
        return _REFERENCE
    if choice == "cpu":
        return _CPU
    if choice == "triton":
        return _require_triton()
    if not torch.cuda.is_available():
        return _CPU  # "auto" where no tensor can be on CUDA
    return _auto_backend()


def use_attention_backend(module: torch.nn.Module, name: str) -> AttentionBackend:
    """Point every attention layer in `module` (each submodule holding a `backend`) at the
    backend `name`; returns it. For A/B runs on one built model."""
    backend = get_attention_backend(name)
    for sub in module.modules():
        if isinstance(getattr(sub, "backend", None), AttentionBackend):
            sub.backend = backend
    return backend


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store K/V rows at their slots through the selected backend (see kernels.reference)."""
    get_attention_backend().write_kv(k_cache, v_cache, k, v, slot_mapping)


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
    """Paged causal attention through the selected backend (see kernels.reference)."""
    return get_attention_backend().paged_attention(
        q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale,
        max_query_len, max_context_len,
    )
