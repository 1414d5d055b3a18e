"""The paged KV block pool: allocation, ref counts, and prefix caching.

The BlockManager is the only writer of `Request.block_ids` and `Request.block_hashes`.

Block states (every block is in exactly one):
    used    ref_count > 0, held by one or more requests (shared prefix blocks: > 1)
    cached  ref_count == 0, holds a full block of known tokens, findable by its hash;
            reclaimable: evicted LRU when a fresh block is needed
    empty   ref_count == 0, no hash

`_free` holds the cached and empty blocks in eviction order: empty blocks at the front
(reused first), cached ones behind them from least to most recently freed.
Block hash chain (engine/kv/prefix_hash.py): hash_i = H(hash_{i-1} || tokens of block i), H a
keyed 128-bit blake2b; hash_{-1} is the root of the request's cache domain (its cache_salt,
else its tenant, else one global domain), so a hit on block i implies the whole prefix up
to it matches and was computed in the same domain. Hashes are computed only when a block
becomes full (`cache_full_blocks`) and on a first schedule's lookup (`allocate_prefix`).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass

from engine.kv.events import KVEventLog
from engine.kv.prefix_hash import BlockHasher, digest_key, key_digest
from engine.request import Request

BlockKey = int  # the block's chained digest (prefix_hash.digest_key)


@dataclass(frozen=True)
class KVSnapshot:
    """Pool occupancy at one moment. By-lane/tenant counts are block references."""

    total: int
    used: int
    free: int  # empty + cached
    cached: int
    usage: float  # used / total
    by_lane: dict[str, int]
    by_tenant: dict[str, int]


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 prefix_cache_sharing: str = "tenant"):
        """`prefix_cache_sharing`: "tenant" (a request hits only blocks of its own tenant
        or cache_salt) or "global" (any request without a cache_salt hits any)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hasher = BlockHasher(block_size, prefix_cache_sharing)
        self._ref_counts = [0] * num_blocks
        self._block_keys: list[BlockKey | None] = [None] * num_blocks
        self._cached: dict[BlockKey, int] = {}  # key -> block id (used or cached state)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_used = 0
        self.num_cached_free = 0  # blocks in the cached state
        self.prefix_query_tokens = 0  # cumulative, for hit rates
        self.prefix_hit_tokens = 0
        self.events: KVEventLog | None = None  # set by publish_events(): a fleet router reads

    def publish_events(self, log: KVEventLog, hash_key: bytes | None = None) -> None:
        """From now on, every key that enters or leaves `_cached` goes to `log`. With
        `hash_key` (shared with the router, which must compute the same keys from a
        request's tokens) the hasher is rebuilt on it: only before any block is cached."""
        if hash_key is not None:
            if self._cached:
                raise RuntimeError("the hash key can only change while nothing is cached")
            self.hasher = BlockHasher(self.block_size, self.hasher.sharing, key=hash_key)
        self.events = log

    def holds(self, key: BlockKey) -> bool:
        """Whether a block with this key is findable now (any thread may ask)."""
        return key in self._cached

    def cached_keys(self) -> list[BlockKey]:
        """Every findable block's key (used or cached): a KV-event reader's snapshot."""
        return list(self._cached)

    # ---- occupancy -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.num_blocks - self.num_used

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks to add so the request's cache covers `num_new_tokens` more tokens."""
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids))

    # ---- allocation --------------------------------------------------------------
    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's blocks to cover `num_new_tokens` more; all or nothing."""
        needed = self.blocks_needed(request, num_new_tokens)
        if needed == 0:
            return True
        if needed > self.num_free:
            return False
        blocks = request.block_ids
        for _ in range(needed):
            block_id, _ = self._free.popitem(last=False)
            key = self._block_keys[block_id]
            if key is not None:  # evict a cached block
                self._block_keys[block_id] = None
                if self._cached.get(key) == block_id:
                    del self._cached[key]
                    if self.events is not None:
                        self.events.removed(key)
                self.num_cached_free -= 1
            self._ref_counts[block_id] = 1
            blocks.append(block_id)
        self.num_used += needed
        return True

    def allocate_prefix(self, request: Request, count: bool = True) -> int:
        """On a request's first schedule, take cached blocks of its longest cached prefix.

        Returns the number of tokens covered (a multiple of block_size), always leaving at
        least one token to compute so the step produces logits. `count=False` leaves the
        hit-rate counters alone: a caller that may give the blocks back (a start that fails)
        calls `count_prefix_use` once the request really starts with them.
        """
        assert not request.block_ids and request.num_computed_tokens == 0
        if not self.enable_prefix_caching or request.needs_prompt_logprobs:
            return 0  # NOTE: prompt logprobs need every prompt position computed (as vLLM)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hasher, tokens = self.hasher, request.token_ids
        digest = hasher.root(request.tenant, request.cache_salt)
        for i in range(max_blocks):
            digest = hasher.block(digest, tokens, i)
            key = digest_key(digest)
            block_id = self._cached.get(key)
            if block_id is None:
                break
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
                self.num_cached_free -= 1
                self.num_used += 1
            self._ref_counts[block_id] += 1
            request.block_ids.append(block_id)
            request.block_hashes.append(key)
        hit = len(request.block_ids) * self.block_size
        if count:
            self.count_prefix_use(request, hit)
        return hit

    def count_prefix_use(self, request: Request, hit_tokens: int) -> None:
        """Count one used lookup in the hit-rate counters: `hit_tokens` hit, out of the
        request's full blocks before its last token."""
        if self.enable_prefix_caching and not request.needs_prompt_logprobs:
            queried = (request.num_tokens - 1) // self.block_size * self.block_size
            self.prefix_query_tokens += queried
            self.prefix_hit_tokens += hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Register the hashes of blocks that became full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        block_ids, hashes = request.block_ids, request.block_hashes
        num_full = min(request.num_computed_tokens // self.block_size, len(block_ids))
        start = len(hashes)
        if start >= num_full:
            return
        hasher, tokens = self.hasher, request.token_ids
        digest = (key_digest(hashes[-1]) if hashes
                  else hasher.root(request.tenant, request.cache_salt))
        for i in range(start, num_full):
            digest = hasher.block(digest, tokens, i)
            key = digest_key(digest)
            block_id = block_ids[i]
            if self._block_keys[block_id] is None and key not in self._cached:
                self._block_keys[block_id] = key
                self._cached[key] = block_id
                if self.events is not None:
                    self.events.stored(key)
            hashes.append(key)

    def free(self, request: Request) -> None:
        """Drop the request's references; its full blocks stay findable until evicted."""
        for block_id in reversed(request.block_ids):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self.num_used -= 1
                self._free[block_id] = None
                if self._block_keys[block_id] is None:
                    self._free.move_to_end(block_id, last=False)
                else:
                    self.num_cached_free += 1
        request.block_ids.clear()
        request.block_hashes.clear()

    # ---- inspection --------------------------------------------------------------
    def snapshot(self, requests: list[Request]) -> KVSnapshot:
        by_lane: dict[str, int] = defaultdict(int)
        by_tenant: dict[str, int] = defaultdict(int)
        for req in requests:
            if req.block_ids:
                by_lane[req.lane] += len(req.block_ids)
                by_tenant[req.tenant] += len(req.block_ids)
        return KVSnapshot(self.num_blocks, self.num_used, self.num_free, self.num_cached_free,
                          self.usage, dict(by_lane), dict(by_tenant))

    def check_integrity(self, requests: list[Request]) -> None:
        """Raise AssertionError if any block is leaked, double-owned or miscounted."""
        owners = [0] * self.num_blocks
        for req in requests:
            assert not (req.is_finished and req.block_ids), f"{req.request_id} finished with blocks"
            assert len(set(req.block_ids)) == len(req.block_ids), (
                f"{req.request_id} holds a block twice")
            for block_id in req.block_ids:
                owners[block_id] += 1
        for block_id, refs in enumerate(self._ref_counts):
            assert refs == owners[block_id], (
                f"block {block_id}: ref_count {refs} but {owners[block_id]} owners")
            assert (refs == 0) == (block_id in self._free), (
                f"block {block_id}: ref_count {refs} but in free list={block_id in self._free}")
        assert self.num_used == sum(1 for r in self._ref_counts if r > 0), "num_used drifted"
        assert len(self._free) == self.num_free, "free list size drifted"
        for key, block_id in self._cached.items():
            assert self._block_keys[block_id] == key, f"hash map points at block {block_id}"
        cached = sum(1 for b in self._free if self._block_keys[b] is not None)
        assert cached == self.num_cached_free, "cached count drifted"
