"""What the CPU attention backend works out once per step and every layer reuses.

Every layer of a step gets the same AttentionMetadata tensors (block tables, context
lengths, query starts, slot mapping: one object per step, engine/models/attention.py), so
the host-side work on them (host copies, the decode / prefill split, index tensors, the
check that every slot is stored) is done for the first layer and looked up by the
tensors' identity for the other layers: at SmolLM2's 30 layers that work ran 30 times a
step. The lookup holds the tensors it was made from, so their ids cannot be reused by
new tensors while it is kept (one entry per thread: the last step seen).

NOTE: keyed by identity, not content: the metadata tensors must not be modified in place
between the layers of one step (AttentionMetadata is frozen and built anew each step; an
in-place change to an inference tensor could not be detected anyway, such tensors have no
version counter).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from kernels import reference

_local = threading.local()  # .plan: (key tensors, AttentionPlan); .slots: (tensor, SlotPlan)


@dataclass(frozen=True)
class AttentionPlan:
    """The decode / prefill split of one step's attention, shared by its layers.

    prefills: (sequence, first row, end row, context_len) of each multi-token chunk;
    decode_seqs / decode_rows: int64 [D], each decode's sequence and its row in q;
    decode_seqs32 / decode_rows32: the same as int32 (the native kernel's);
    decode_ctx: host context length of each decode; decode_keys: their sum (the keys
    the step's decodes read per layer); all_decodes: every row is a decode and
    decode_rows == arange(T), so q needs no row selection; decode_block_ids: (smallest,
    largest) block id the decodes own ((0, -1): none), None when some decode owns more
    blocks than its table row holds (the native kernel reads raw memory: the caller checks
    these against the cache before it runs)."""

    prefills: tuple[tuple[int, int, int, int], ...]
    decode_seqs: torch.Tensor
    decode_rows: torch.Tensor
    decode_seqs32: torch.Tensor
    decode_rows32: torch.Tensor
    decode_ctx: tuple[int, ...]
    decode_keys: int
    all_decodes: bool
    decode_block_ids: tuple[int, int] | None


def attention_plan(num_tokens: int, block_tables: torch.Tensor, context_lens: torch.Tensor,
                   query_start_loc: torch.Tensor, block_size: int) -> AttentionPlan:
    """The plan of the step these metadata tensors describe (made on the first call of a
    step, then reused). Raises ValueError for inconsistent metadata."""
    key = (block_tables, context_lens, query_start_loc, block_size)
    cached = getattr(_local, "plan", None)
    if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
        return cached[1]
    plan = _make_plan(num_tokens, block_tables, context_lens, query_start_loc, block_size)
    _local.plan = (key, plan)
    return plan


def _make_plan(num_tokens: int, block_tables: torch.Tensor, context_lens: torch.Tensor,
               query_start_loc: torch.Tensor, block_size: int) -> AttentionPlan:
    starts = query_start_loc.tolist()
    ctx_lens = context_lens.tolist()
    if starts[-1] != num_tokens:
        raise ValueError(f"query_start_loc[-1]={starts[-1]} must equal q.shape[0]={num_tokens}")
    prefills, seqs, rows = [], [], []
    for s, context_len in enumerate(ctx_lens):
        lo, hi = starts[s], starts[s + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        if not 0 < q_len <= context_len:
            raise ValueError(f"sequence {s}: {q_len=} must be in 1..{context_len=}")
        if q_len == 1:
            seqs.append(s)
            rows.append(lo)
        else:
            prefills.append((s, lo, hi, context_len))
    seq_t = torch.tensor(seqs, dtype=torch.int64)
    row_t = torch.tensor(rows, dtype=torch.int64)
    decode_ctx = tuple(ctx_lens[s] for s in seqs)
    return AttentionPlan(tuple(prefills), seq_t, row_t, seq_t.to(torch.int32),
                         row_t.to(torch.int32), decode_ctx, sum(decode_ctx),
                         len(rows) == num_tokens,
                         _owned_block_range(block_tables, seqs, decode_ctx, block_size))


def _owned_block_range(block_tables: torch.Tensor, seqs: list[int], ctx: tuple[int, ...],
                       block_size: int) -> tuple[int, int] | None:
    """(min, max) block id in the first ceil(ctx / block_size) entries of each decode's
    table row; (0, -1) for no decodes; None when a row is shorter than that."""
    if not seqs:
        return 0, -1
    owned = -(-np.asarray(ctx, dtype=np.int64) // block_size)  # (D,)
    if int(owned.max()) > block_tables.shape[1]:
        return None
    table = block_tables.numpy()[seqs]  # (D, max_blocks)
    ids = table[np.arange(table.shape[1])[None, :] < owned[:, None]]
    return int(ids.min()), int(ids.max())


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """kernels.reference.write_kv, same contract and result; when every slot of the step
    is stored (no -1), the rows go in with one index_copy_ each, without the boolean
    masks (the check runs once per step)."""
    cached = getattr(_local, "slots", None)
    if cached is None or cached[0] is not slot_mapping:
        keep_all = bool((slot_mapping >= 0).all())
        cached = _local.slots = (slot_mapping, slot_mapping.long() if keep_all else None)
    slots = cached[1]
    if slots is None:  # some rows are not stored: the reference's masked path
        reference.write_kv(k_cache, v_cache, k, v, slot_mapping)
        return
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (they are written through a view)")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))
