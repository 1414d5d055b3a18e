"""Random paged-attention inputs at real sizes, built on the target device without loops
over tokens, for the GPU checks and benchmarks (bench.kernel_check, bench.kernel_speed).

Blocks are handed out from a random permutation of the pool, so block tables are in random
order; table padding is -1; every cache row that no sequence owns holds garbage too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PagedBatch(NamedTuple):
    """Arguments of paged_attention, in its order (pass as *batch), plus host-side maxima."""

    q: torch.Tensor  # [T, nh, d]
    k_cache: torch.Tensor  # [num_blocks, block_size, kvh, d]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, max_blocks]
    context_lens: torch.Tensor  # int32 [S]
    query_start_loc: torch.Tensor  # int32 [S + 1]

    def args(self) -> tuple[torch.Tensor, ...]:
        return tuple(self)


def make_paged_batch(
    seqs: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device | str, block_size: int = 16, seed: int = 0,
) -> tuple[PagedBatch, int, int]:
    """seqs: [(context_len, q_len)] -> (batch, max_query_len, max_context_len)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    needed = [-(-ctx // block_size) for ctx, _ in seqs]
    num_blocks = sum(needed) + 4
    pool = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    table = torch.full((len(seqs), max(needed) + 1), -1, dtype=torch.int32, device=device)
    start = 0
    for s, n in enumerate(needed):
        table[s, :n] = pool[start:start + n]
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    q_lens = [q for _, q in seqs]
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen, device=device).to(dtype)
    starts = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    starts[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    context_lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32, device=device)
    batch = PagedBatch(q, k_cache, v_cache, table, context_lens, starts.to(device))
    return batch, max(q_lens), max(c for c, _ in seqs)


def contiguous_kv(batch: PagedBatch, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's K and V gathered into [kvh, context_len, d] (SDPA's layout)."""
    ctx = int(batch.context_lens[seq])
    block_size = batch.k_cache.shape[1]
    blocks = batch.block_tables[seq, : -(-ctx // block_size)].long()
    out = []
    for cache in (batch.k_cache, batch.v_cache):
        rows = cache[blocks].reshape(-1, *cache.shape[2:])[:ctx]  # [ctx, kvh, d]
        out.append(rows.transpose(0, 1).contiguous())
    return out[0], out[1]


def random_slots(num_tokens: int, num_slots: int, device: torch.device | str,
                 seed: int = 0) -> torch.Tensor:
    """int64 [num_tokens]: distinct slots in random order, every fourth one -1 (skip)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    slots = torch.randperm(num_slots, generator=gen, device=device)[:num_tokens]
    slots[::4] = -1
    return slots
