"""Paged-attention kernels behind one seam: `write_kv` and `paged_attention` dispatch to a backend.

Backends share the signatures of `kernels.reference`. The choice comes from the environment
variable BATCHPILOT_ATTENTION (read when a backend is requested):

    reference  torch reference (any device)
    triton     Triton kernels (CUDA) -- not implemented yet: asking for it raises
    auto       the default: triton on CUDA once it exists, else reference
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels import reference
from kernels.reference import reference_attention

ATTENTION_ENV_VAR = "BATCHPILOT_ATTENTION"
ATTENTION_BACKENDS = ("reference", "triton", "auto")


class AttentionBackend(NamedTuple):
    """The two entry points a model's attention layer calls, plus the backend's name."""

    name: str
    write_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


_REFERENCE = AttentionBackend("reference", reference.write_kv, reference.paged_attention)


def get_attention_backend(name: str | None = None) -> AttentionBackend:
    """Resolve `name` (default: $BATCHPILOT_ATTENTION, else "auto") to a backend."""
    choice = (name or os.environ.get(ATTENTION_ENV_VAR) or "auto").strip().lower()
    if choice not in ATTENTION_BACKENDS:
        raise ValueError(
            f"{ATTENTION_ENV_VAR}={choice!r} is not a backend; choose one of {ATTENTION_BACKENDS}"
        )
    if choice == "triton":
        raise NotImplementedError(
            "the Triton paged-attention backend is not implemented yet; "
            f"set {ATTENTION_ENV_VAR}=reference (or auto) to use the torch reference"
        )
    return _REFERENCE  # "reference", and "auto" until the Triton backend lands


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


__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_ENV_VAR",
    "AttentionBackend",
    "get_attention_backend",
    "paged_attention",
    "reference_attention",
    "write_kv",
]
