"""Attention on the paged KV cache: the per-step metadata and the layer that uses it.

A step's batch is flat: T query tokens from S sequences, concatenated. Per layer the cache
is a pair (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim].

    sequence s:  cached prefix (already in blocks)  | this step's q_len tokens
                 positions 0 .. ctx - q_len - 1     | positions ctx - q_len .. ctx - 1
    context_lens[s] = ctx (prefix + this step), query_start_loc[s + 1] - [s] = q_len
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kernels import AttentionBackend, get_attention_backend

KVCache = tuple[torch.Tensor, torch.Tensor]  # (k_cache, v_cache) of one layer


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything attention needs to place and read one step's tokens in the paged cache.

    slot_mapping: int64 [T], block_id * block_size + offset of each token (-1: don't store);
    block_tables: int32 [S, max_blocks]; context_lens: int32 [S], tokens per sequence
    including this step's; query_start_loc: int32 [S + 1], cumulative query lengths;
    max_query_len / max_context_len: host ints (kernels size their grids with them).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_context_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])


def build_attention_metadata(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, AttentionMetadata]:
    """Flatten one step: per sequence its block ids, total context length (including this
    step) and number of query tokens. Returns (positions int64 [T], metadata).

    Padding entries of the block table tensor are -1; each sequence must own at least
    ceil(context_len / block_size) blocks.
    """
    num_seqs = len(context_lens)
    if not len(block_tables) == len(query_lens) == num_seqs:
        raise ValueError("block_tables, context_lens and query_lens must have one entry per seq")
    per_seq = zip(block_tables, context_lens, query_lens, strict=True)
    for s, (blocks, ctx, q_len) in enumerate(per_seq):
        if not 0 <= q_len <= ctx or len(blocks) * block_size < ctx:
            raise ValueError(f"seq {s}: {q_len=}, {ctx=}, {len(blocks)} blocks of {block_size=}")
    # NOTE: host index math in numpy, not torch: torch's CPU repeat_interleave splits even a
    # 64-element job across threads and took ~10 ms per call on a busy 2-core machine;
    # filling the block table row by row cost ~0.1 ms per sequence.
    max_blocks = max(1, max((len(b) for b in block_tables), default=0))
    table = np.full((num_seqs, max_blocks), -1, dtype=np.int32)
    for s, blocks in enumerate(block_tables):
        table[s, : len(blocks)] = blocks
    ctx = np.asarray(context_lens, dtype=np.int64).reshape(num_seqs)  # [S]
    q_lens = np.asarray(query_lens, dtype=np.int64).reshape(num_seqs)  # [S]
    seq_of_token = np.repeat(np.arange(num_seqs), q_lens)  # [T]
    starts = np.zeros(num_seqs + 1, dtype=np.int64)
    starts[1:] = np.cumsum(q_lens)
    offset_in_query = np.arange(starts[-1]) - starts[seq_of_token]  # [T]
    positions = ctx[seq_of_token] - q_lens[seq_of_token] + offset_in_query  # [T]
    block_ids = table[seq_of_token, positions // block_size].astype(np.int64)  # [T]
    slots = block_ids * block_size + positions % block_size  # [T]

    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slots).to(device),
        block_tables=torch.from_numpy(table).to(device),
        context_lens=torch.from_numpy(ctx.astype(np.int32)).to(device),
        query_start_loc=torch.from_numpy(starts.astype(np.int32)).to(device),
        max_query_len=int(q_lens.max()) if num_seqs else 0,
        max_context_len=int(ctx.max()) if num_seqs else 0,
    )
    return torch.from_numpy(positions).to(device), meta


class Attention(nn.Module):
    """Stores this step's K/V in the layer's cache, then attends over the paged context."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
        backend: AttentionBackend | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"{num_heads=} must be a multiple of {num_kv_heads=}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = backend or get_attention_backend()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        kv_cache: KVCache, meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q: [T, nh, d]; k, v: [T, kvh, d] -> [T, nh, d]."""
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return self.backend.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_start_loc,
            self.scale, meta.max_query_len, meta.max_context_len,
        )


def allocate_kv_caches(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device | str = "cpu",
) -> list[KVCache]:
    """Zeroed (k_cache, v_cache) per layer, each [num_blocks, block_size, kvh, head_dim].

    Bytes used: 2 * num_layers * num_blocks * block_size * kvh * head_dim * itemsize.
    """
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device),
         torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]
