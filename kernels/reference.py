"""Torch reference for paged attention: plain, obviously right, and the oracle for the kernels.

KV cache of one layer (K and V alike), as in DESIGN.md:

    k_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset      # a token's row in k_cache.view(-1, kvh, d)

One step is one flattened mixed batch: the query tokens of all sequences are concatenated,
sequence s owning rows query_start_loc[s] : query_start_loc[s + 1]. Its context_lens[s]
counts every token of the sequence including this step's queries, whose K/V are already in
the cache, so the queries sit at absolute positions context_len - q_len ... context_len - 1
and attention is causal over absolute positions (a decode is q_len == 1; a prefill chunk
sees its cached prefix plus itself).

Serving on CPU uses kernels/cpu_attention.py (backend "cpu"): split-K chunks, no loop per
length group or KV head; this file stays the oracle it is tested against.

Design (measured): the step's decodes (one query each) go through one padded batched
computation per length group; every other sequence gets one SDPA call over its blocks. Per-sequence
SDPA calls for 64 decodes at context 64 took 441 ms over SmolLM2's 30 layers against
190-260 ms batched (2 threads); padding prefill chunks too was 2.5-23x slower on mixed
batches, since every row would pay for the longest query and the longest context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store this step's K/V rows in the paged cache, in place.

    k, v: [T, num_kv_heads, head_dim]; slot_mapping: int64 [T], slot = block * block_size +
    offset, or -1 for a row that must not be stored. Rows are cast to the cache dtype.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (they are written through a view)")
    keep = slot_mapping >= 0  # [T]
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_blocks * block_size, kvh, d]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_flat.index_copy_(0, slots, v[keep].to(v_cache.dtype))


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, context_len: int
) -> torch.Tensor:
    """One sequence's cached rows in position order: [context_len, num_kv_heads, head_dim].

    Reads only the ceil(context_len / block_size) blocks the sequence owns; entries past
    them in block_table_row (padding) are never used as indices.
    """
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = block_table_row[:num_blocks].long()
    rows = cache.index_select(0, blocks)  # [num_blocks, block_size, kvh, d]
    return rows.reshape(num_blocks * block_size, *cache.shape[2:])[:context_len]


def causal_mask(q_len: int, context_len: int, device: torch.device) -> torch.Tensor:
    """Bool [q_len, context_len]: query i (absolute position context_len - q_len + i) sees
    key j iff j <= its position. True means attend."""
    q_pos = torch.arange(context_len - q_len, context_len, device=device)  # [q_len]
    k_pos = torch.arange(context_len, device=device)  # [context_len]
    return k_pos[None, :] <= q_pos[:, None]


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
    """Causal attention of a flattened mixed batch over the paged KV cache.

    q: [T, num_heads, head_dim], sequences concatenated; k_cache, v_cache: [num_blocks,
    block_size, num_kv_heads, head_dim] holding every context token including this step's;
    block_tables: int32 [S, max_blocks_per_seq]; context_lens: int32 [S]; query_start_loc:
    int32 [S + 1]. num_heads must be a multiple of num_kv_heads (GQA). max_query_len and
    max_context_len are accepted for signature parity with the kernels and ignored here.
    Computes in float32 and returns [T, num_heads, head_dim] in q.dtype.
    """
    del max_query_len, max_context_len  # the kernels size their grids with these
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads=} must be a multiple of {num_kv_heads=}")
    starts = query_start_loc.tolist()  # host copies: the reference is allowed to sync
    ctx_lens = context_lens.tolist()
    if starts[-1] != num_tokens:
        raise ValueError(f"query_start_loc[-1]={starts[-1]} must equal q.shape[0]={num_tokens}")

    out = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
    decodes = [s for s in range(len(ctx_lens)) if starts[s + 1] - starts[s] == 1]
    done: set[int] = set()
    for group in length_groups(decodes, ctx_lens):  # one padded batch per group
        if len(group) < 2:
            continue  # a lone decode takes the per-sequence path below
        rows = torch.tensor([starts[s] for s in group], device=q.device)
        index = torch.tensor(group, device=q.device)
        out[rows] = decode_attention(q[rows], k_cache, v_cache, block_tables[index],
                                     context_lens[index], scale)
        done.update(group)
    for s, context_len in enumerate(ctx_lens):
        lo, hi = starts[s], starts[s + 1]
        q_len = hi - lo
        if q_len == 0 or s in done:
            continue
        if not 0 < q_len <= context_len:
            raise ValueError(f"sequence {s}: {q_len=} must be in 1..{context_len=}")
        k = gather_kv(k_cache, block_tables[s], context_len).float()  # (C, kvh, d)
        v = gather_kv(v_cache, block_tables[s], context_len).float()
        q_s = q[lo:hi].float().transpose(0, 1)[None]  # (1, nh, q_len, d)
        k_s = k.transpose(0, 1)[None]  # (1, kvh, C, d)
        v_s = v.transpose(0, 1)[None]
        # A single query is the last position: it sees every key, so no mask is needed.
        mask = None if q_len == 1 else causal_mask(q_len, context_len, q.device)
        o = F.scaled_dot_product_attention(
            q_s, k_s, v_s, attn_mask=mask, scale=scale, enable_gqa=num_heads != num_kv_heads
        )  # (1, nh, q_len, d)
        out[lo:hi] = o[0].transpose(0, 1)
    return out.to(q.dtype)


def length_groups(seqs: list[int], ctx_lens: list[int]) -> list[list[int]]:
    """`seqs` sorted by context length and cut where the length more than doubles, so
    padding each group to its longest context computes under 2x its real tokens (one
    batch padded to the longest of short chat turns and long documents can waste 10x)."""
    groups: list[list[int]] = []
    for s in sorted(seqs, key=ctx_lens.__getitem__):
        if groups and ctx_lens[s] <= 2 * ctx_lens[groups[-1][0]]:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence (decodes), all sequences at once: float32 [S, nh, d].

    q: [S, num_heads, head_dim]; the query is each sequence's last position, so it sees
    its whole context; keys past a sequence's context_len (block padding, other sequences'
    lengths) are masked out. Per-sequence SDPA calls cost more than this padded batch
    once there are more than a few decodes.
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(context_lens.max())
    num_blocks = -(-max_len // block_size)
    owned = -(-context_lens.long() // block_size)  # (S,) blocks each sequence owns
    blocks = block_tables[:, :num_blocks].long()
    in_use = torch.arange(num_blocks, device=q.device)[None, :] < owned[:, None]
    blocks = torch.where(in_use, blocks, 0).reshape(-1)  # padding reads block 0, then masked
    padded = num_blocks * block_size
    # index_select of whole blocks is a row copy; 2-D advanced indexing (k_cache[blocks])
    # was 6x slower on CPU. Each KV head is then a strided view that bmm reads in place:
    # moving heads in front (one more copy of the context) cost more than the math.
    keys = k_cache.index_select(0, blocks).view(num_seqs, padded, num_kv_heads, head_dim)
    values = v_cache.index_select(0, blocks).view(num_seqs, padded, num_kv_heads, head_dim)
    keys, values = keys.float(), values.float()
    q_g = q.float().view(num_seqs, num_kv_heads, group, head_dim)  # (S, kvh, g, d)
    positions = torch.arange(padded, device=q.device)  # (C,)
    hidden = positions[None, None, :] >= context_lens[:, None, None].to(positions.dtype)
    out = torch.empty(num_seqs, num_kv_heads, group, head_dim, device=q.device)
    for h in range(num_kv_heads):
        scores = torch.bmm(q_g[:, h], keys[:, :, h].transpose(1, 2)) * scale  # (S, g, C)
        scores.masked_fill_(hidden, float("-inf"))  # hidden: (S, 1, C)
        out[:, h] = torch.bmm(torch.softmax(scores, dim=-1), values[:, :, h])  # (S, g, d)
    return out.reshape(num_seqs, num_heads, head_dim)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Dense causal attention of one sequence, written out by hand (no SDPA), for tests.

    q: [q_len, num_heads, head_dim] at the last q_len positions of a context of C tokens;
    k, v: [C, num_kv_heads, head_dim]. Returns [q_len, num_heads, head_dim] in q.dtype.
    """
    q_len, num_heads, _ = q.shape
    context_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    kf = k.float().repeat_interleave(group, dim=1)  # (C, nh, d): head h reads kv head h // group
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale  # (nh, q_len, C)
    visible = causal_mask(q_len, context_len, q.device)  # (q_len, C)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vf).to(q.dtype)
