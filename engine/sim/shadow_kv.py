"""A shadow of the paged KV cache for the simulated executor: what each slot would hold.

A real model writes each computed token's K/V into its slot and then attends over every
slot of the request's context, reached through the request's block table. The shadow does
the same with a stand-in for K/V: per slot, the token id, its position and a digest of
the whole prefix up to and including it (real K/V at position p depends on tokens 0..p).
A step first writes the slots of every token it computes, then reads back the context of
every sequence it ran and compares it with the request's true tokens, so a wrong block
table, a prefix hit on a block of other content, a skipped chunk, or a block reused while
still referenced raises `ShadowKVMismatch` instead of passing silently.

Slot layout, as in engine/models/attention.py (`build_attention_metadata`):

    slot(pos) = block_ids[pos // block_size] * block_size + pos % block_size

    block b:  | slot b*bs | slot b*bs+1 | ... | slot b*bs+bs-1 |   (bs = block_size)

Reading another request's slots is correct when they hold the same prefix: that is a
prefix-cache hit, whoever wrote them. Cost per step: one pass over the contexts of the
step's sequences (a list extend, then a few vectorized numpy operations over them all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNWRITTEN = -1  # position of a slot nothing has written

# splitmix64 constants: a per-(token, position) mix whose running sum is the prefix digest
_K1, _K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
_K3, _S1, _S2 = np.uint64(0x94D049BB133111EB), np.uint64(30), np.uint64(27)


class ShadowKVMismatch(AssertionError):
    """A sequence read back something other than its own tokens from its KV slots."""

    def __init__(self, request_id: str, position: int, expected: int, found: str,
                 step_id: int, block_id: int | None = None):
        self.request_id, self.position, self.expected = request_id, position, expected
        self.found, self.step_id, self.block_id = found, step_id, block_id
        where = f" (block {block_id})" if block_id is not None else ""
        # expected < 0: the block is past the sequence's tokens (a table may run ahead)
        want = f"token {expected}" if expected >= 0 else "no token yet"
        super().__init__(f"shadow KV mismatch in step {step_id}: request {request_id!r}"
                         f" position {position}{where}: expected {want}, found {found}")


def _mix(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """uint64 [T]: one (token, position) pair mixed (splitmix64's finalizer)."""
    x = tokens.astype(np.uint64) * _K1 + positions.astype(np.uint64) * _K2
    x ^= x >> _S1
    x *= _K3
    x ^= x >> _S2
    return x


def prefix_digests(tokens: np.ndarray) -> np.ndarray:
    """uint64 [n]: digest of tokens[0..p] for each p (order- and position-sensitive)."""
    return np.cumsum(_mix(tokens, np.arange(len(tokens))), dtype=np.uint64)


@dataclass(slots=True)
class SeqRun:
    """One sequence of a step: it computes positions start..num_tokens-1 and reads
    0..num_tokens-1 (the prefix from the cache, then its own new tokens)."""

    request_id: str
    block_ids: list[int]
    token_ids: list[int]  # the request's true tokens (at least num_tokens of them)
    start: int
    num_tokens: int


class ShadowKV:
    """Per slot (block_id * block_size + offset): token, position, prefix digest, and the
    step that wrote it. Grows to the highest block id seen."""

    def __init__(self, block_size: int, num_blocks: int = 0):
        if block_size < 1:
            raise ValueError(f"{block_size=} must be >= 1")
        self.block_size = block_size
        self.num_blocks = num_blocks  # 0: unknown, any block id >= 0 is accepted
        self.tokens = np.zeros(0, dtype=np.int64)
        self.positions = np.zeros(0, dtype=np.int64)
        self.digests = np.zeros(0, dtype=np.uint64)
        self.steps = np.zeros(0, dtype=np.int64)
        self.tokens_written = 0  # cumulative counters (tests check the shadow ran)
        self.tokens_read = 0
        self._grow(num_blocks * block_size)

    def _grow(self, num_slots: int) -> None:
        old = len(self.tokens)
        if num_slots <= old:
            return
        extra = max(num_slots, 2 * old) - old
        # np.zeros/np.full: untouched pages of a large pool cost no memory
        self.tokens = np.concatenate([self.tokens, np.zeros(extra, np.int64)])
        self.positions = np.concatenate([self.positions, np.full(extra, UNWRITTEN)])
        self.digests = np.concatenate([self.digests, np.zeros(extra, np.uint64)])
        self.steps = np.concatenate([self.steps, np.full(extra, UNWRITTEN)])

    def run_step(self, seqs: list[SeqRun], step_id: int) -> list[tuple[int, int, int]]:
        """Write every sequence's new positions, then read back all their contexts (as a
        model's layer stores the step's K/V before attending). Returns, per sequence, the
        read-back (first token, last token, length). Raises ShadowKVMismatch at the first
        position (batch order) that does not hold the request's own token computed after
        the request's own prefix."""
        tokens_flat: list[int] = []
        tables_flat: list[int] = []
        for seq in seqs:
            self._check_table(seq, step_id)
            tokens_flat.extend(seq.token_ids[:seq.num_tokens])
            tables_flat.extend(seq.block_ids)
        lens = np.fromiter((q.num_tokens for q in seqs), np.int64, len(seqs))  # [S]
        t_lens = np.fromiter((len(q.block_ids) for q in seqs), np.int64, len(seqs))  # [S]
        starts = np.cumsum(lens) - lens  # [S] first flat index of each sequence
        seq_of = np.repeat(np.arange(len(seqs)), lens)  # [T]
        pos = np.arange(len(tokens_flat), dtype=np.int64) - starts[seq_of]  # [T]
        table = np.asarray(tables_flat, dtype=np.int64)
        bs = self.block_size
        # as build_attention_metadata: slot = block_ids[pos // bs] * bs + pos % bs
        slots = table[(np.cumsum(t_lens) - t_lens)[seq_of] + pos // bs] * bs + pos % bs
        if len(table):
            self._grow(int(table.max()) * bs + bs)
        tokens = np.asarray(tokens_flat, dtype=np.int64)
        sums = np.cumsum(_mix(tokens, pos), dtype=np.uint64)
        base = np.concatenate([np.zeros(1, np.uint64), sums])[starts]  # [S] sum before each
        digests = sums - base[seq_of]  # per-sequence prefix digests (mod 2^64)
        new = pos >= np.fromiter((q.start for q in seqs), np.int64, len(seqs))[seq_of]
        where = slots[new]
        self.tokens[where], self.positions[where] = tokens[new], pos[new]
        self.digests[where], self.steps[where] = digests[new], step_id
        self.tokens_written += len(where)
        self.tokens_read += len(slots)
        bad = self.digests[slots] != digests
        if bad.any():
            i = int(np.argmax(bad))
            self._raise(seqs[int(seq_of[i])], int(pos[i]), int(slots[i]), step_id)
        read = self.tokens[slots]
        return [(int(read[a]), int(read[a + n - 1]), n) for a, n in
                zip(starts.tolist(), lens.tolist(), strict=True)]

    def _check_table(self, seq: SeqRun, step_id: int) -> None:
        """The block table covers the context, with ids inside the pool (the real runner
        would fail or read out of bounds otherwise)."""
        bs, n, table = self.block_size, seq.num_tokens, seq.block_ids
        if len(table) * bs < n:
            p = len(table) * bs
            raise ShadowKVMismatch(seq.request_id, p, seq.token_ids[p], f"no block:"
                                   f" {len(table)} blocks of {bs} cover {p} tokens", step_id)
        limit = self.num_blocks or float("inf")
        for i, block_id in enumerate(table):
            if not 0 <= block_id < limit:
                expected = seq.token_ids[i * bs] if i * bs < len(seq.token_ids) else -1
                raise ShadowKVMismatch(seq.request_id, i * bs, expected,
                                       f"block id {block_id} outside the pool of"
                                       f" {self.num_blocks}", step_id, block_id)

    def _raise(self, seq: SeqRun, p: int, slot: int, step_id: int) -> None:
        found_pos, writer = int(self.positions[slot]), int(self.steps[slot])
        found_token, expected = int(self.tokens[slot]), seq.token_ids[p]
        if found_pos == UNWRITTEN:
            found = "a slot never written"
        else:
            found = f"token {found_token} at position {found_pos}"
            if found_pos == p and found_token == expected:
                found += " computed after a different prefix"
            found += f" (written in step {writer})"
        raise ShadowKVMismatch(seq.request_id, p, expected, found, step_id,
                               slot // self.block_size)
