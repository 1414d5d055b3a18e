"""The paged KV block pool: random operation sequences, LRU eviction, prefix hits."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv.block_manager import BlockManager
from engine.request import Request, SamplingParams

BS = 4


def _request(rid: str, tokens: list[int], lane: str = "interactive",
             tenant: str = "default") -> Request:
    return Request(rid, list(tokens), SamplingParams(), 0.0, tenant=tenant, lane=lane)


def _run(bm: BlockManager, req: Request) -> int:
    """First schedule of req: prefix hit, then compute the rest. Returns the hit tokens."""
    hit = bm.allocate_prefix(req)
    req.num_computed_tokens = hit
    assert bm.allocate(req, req.num_tokens - hit)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)
    return hit


def _hit_of(bm: BlockManager, tokens: list[int]) -> int:
    """Prefix-hit tokens a new request with `tokens` would get (it takes them, then frees)."""
    probe = _request("probe", tokens)
    hit = bm.allocate_prefix(probe)
    bm.free(probe)
    return hit


class BlockPoolMachine(RuleBasedStateMachine):
    """Requests come, compute, sample, get preempted and finish in any order.

    A shadow of every block's contents (written as tokens are computed) checks that a
    prefix hit only ever hands out blocks that hold exactly the request's own tokens.
    """

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=BS)
        self.live: list[Request] = []
        self.content: dict[int, list[int | None]] = {}
        self.count = 0

    def _write(self, req: Request, start: int, end: int) -> None:
        for pos in range(start, end):
            block = req.block_ids[pos // BS]
            self.content.setdefault(block, [None] * BS)[pos % BS] = req.token_ids[pos]

    def _first_schedule(self, req: Request) -> None:
        hit = self.bm.allocate_prefix(req)
        assert hit % BS == 0 and hit <= req.num_tokens - 1  # never the last token
        for i, block in enumerate(req.block_ids):
            assert self.content.get(block) == req.token_ids[i * BS:(i + 1) * BS], (
                "prefix hit on a block holding other tokens")
        req.num_computed_tokens = hit

    @rule(length=st.integers(1, 20), alphabet=st.integers(1, 3), share=st.booleans(),
          data=st.data())
    def arrive(self, length, alphabet, share, data):
        tokens = data.draw(st.lists(st.integers(3, 2 + alphabet), min_size=length,
                                    max_size=length))
        if share and self.live:  # reuse another request's tokens as a prefix
            other = data.draw(st.sampled_from(self.live))
            cut = data.draw(st.integers(0, other.num_tokens))
            tokens = other.token_ids[:cut] + tokens
        self.count += 1
        req = _request(f"r{self.count}", tokens)
        self._first_schedule(req)
        self.live.append(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def compute(self, data):
        req = data.draw(st.sampled_from(self.live))
        remaining = req.num_tokens - req.num_computed_tokens
        if remaining == 0:
            req.token_ids.append(data.draw(st.integers(3, 5)))  # a sampled token
            return
        n = data.draw(st.integers(1, remaining))
        before = (list(req.block_ids), self.bm.num_free)
        if not self.bm.allocate(req, n):
            assert (req.block_ids, self.bm.num_free) == before  # all or nothing
            assert self.bm.blocks_needed(req, n) > self.bm.num_free
            return
        assert len(req.block_ids) * BS >= req.num_computed_tokens + n
        self._write(req, req.num_computed_tokens, req.num_computed_tokens + n)
        req.num_computed_tokens += n
        self.bm.cache_full_blocks(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), preempt=st.booleans())
    def free(self, data, preempt):
        req = data.draw(st.sampled_from(self.live))
        self.bm.free(req)
        assert not req.block_ids and not req.block_hashes
        req.num_computed_tokens = 0
        if preempt:  # recompute: it starts again, maybe from its own cached blocks
            self._first_schedule(req)
        else:
            self.live.remove(req)

    @invariant()
    def integrity(self):
        self.bm.check_integrity(self.live)
        held = {b for r in self.live for b in r.block_ids}
        assert self.bm.num_used == len(held)
        assert self.bm.num_free == self.bm.num_blocks - len(held)
        assert 0 <= self.bm.num_cached_free <= self.bm.num_free
        assert self.bm.usage == len(held) / self.bm.num_blocks


BlockPoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40,
                                              deadline=None)
test_block_pool_random_operations = BlockPoolMachine.TestCase


def test_empty_blocks_are_used_before_cached_ones():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = _request("a", [10, 11, 12, 13, 14, 15, 16, 17])
    _run(bm, a)
    bm.free(a)
    assert (bm.num_used, bm.num_cached_free) == (0, 2)
    d = _request("d", [20, 21, 22, 23, 24, 25, 26, 27])
    _run(bm, d)  # takes the two empty blocks
    assert bm.num_cached_free == 2
    assert _hit_of(bm, a.prompt_token_ids + [99]) == 8
    bm.check_integrity([d])


def test_a_freed_block_without_a_hash_is_reused_before_cached_ones():
    """A partial block freed after cached ones goes back to the front of the free list: a
    new request takes it, not a cached prefix (the hit rate would drop unseen)."""
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = _request("a", [10, 11, 12, 13, 14, 15, 16, 17])
    _run(bm, a)
    bm.free(a)
    e = _request("e", [40, 41, 42])  # one partial block: never hashed
    _run(bm, e)
    bm.free(e)
    d = _request("d", [20, 21, 22, 23, 24, 25, 26, 27])
    _run(bm, d)  # two blocks: the partial one and the never-used one
    assert _hit_of(bm, a.prompt_token_ids + [99]) == 8
    bm.check_integrity([d])


def test_cached_blocks_are_evicted_least_recently_freed_first():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = _request("a", [10, 11, 12, 13, 14, 15, 16, 17])
    b = _request("b", [20, 21, 22, 23, 24, 25, 26, 27])
    for req in (a, b):
        _run(bm, req)
        bm.free(req)
    assert bm.num_cached_free == 4
    c = _request("c", [30, 31, 32, 33])
    _run(bm, c)  # needs one block: a's tail block is the least recently freed
    assert _hit_of(bm, a.prompt_token_ids + [99]) == 4  # a's head block is still there
    assert _hit_of(bm, b.prompt_token_ids + [99]) == 8
    bm.check_integrity([c])


def test_an_evicted_block_is_published_as_removed():
    """With KV events on, a cached block that a fresh allocation evicts leaves the
    findable set in the step's batch: a router must stop sending its prefix here."""
    from engine.kv.events import KVEventLog

    bm = BlockManager(num_blocks=2, block_size=BS)
    bm.publish_events(log := KVEventLog())
    a = _request("a", [10, 11, 12, 13, 14, 15, 16, 17])
    _run(bm, a)
    bm.free(a)
    log.seal(step_id=1)
    stored = set(log.since(0)[0].stored)
    assert stored == set(bm.cached_keys()) and len(stored) == 2
    _run(bm, _request("c", [30, 31, 32]))  # one block: a's tail block is evicted
    log.seal(step_id=2)
    (batch,) = log.since(1)
    assert len(batch.removed) == 1 and set(batch.removed) == stored - set(bm.cached_keys())


def test_a_request_that_needs_exactly_the_free_blocks_gets_them():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = _request("a", list(range(10, 22)))  # 12 tokens: 3 blocks, the whole pool
    assert bm.allocate(a, 12) and bm.num_free == 0
    assert not bm.allocate(a, 13)  # one more token needs a fourth block
    assert len(a.block_ids) == 3
    bm.check_integrity([a])


def test_a_prefix_hit_refreshes_a_cached_block():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = _request("a", [10, 11, 12, 13, 14, 15, 16, 17])
    b = _request("b", [20, 21, 22, 23, 24, 25, 26, 27])
    for req in (a, b):
        _run(bm, req)
        bm.free(req)
    again = _request("a2", a.prompt_token_ids + [99])
    assert _run(bm, again) == 8  # a's blocks used again ...
    bm.free(again)  # ... and freed after b's, so b's go first now
    c = _request("c", [30, 31, 32, 33, 34, 35, 36, 37])
    _run(bm, c)
    assert _hit_of(bm, b.prompt_token_ids + [99]) == 0
    assert _hit_of(bm, a.prompt_token_ids + [99]) == 8


def test_prefix_hit_never_covers_the_last_token():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = _request("a", list(range(10, 18)))  # two full blocks
    _run(bm, a)
    bm.free(a)
    queried, hits = bm.prefix_query_tokens, bm.prefix_hit_tokens
    same = _request("same", list(range(10, 18)))
    hit = bm.allocate_prefix(same)
    assert hit == 4  # the second block would leave nothing to compute
    assert bm.prefix_hit_tokens - hits == 4 and bm.prefix_query_tokens - queried == 4


def test_shared_blocks_are_counted_once_and_freed_by_the_last_owner():
    bm = BlockManager(num_blocks=8, block_size=BS)
    system = list(range(10, 18))
    a, b = _request("a", system + [1, 2]), _request("b", system + [3, 4])
    _run(bm, a)
    assert _run(bm, b) == 8
    assert bm.num_used == 4  # two shared blocks + one tail block each
    bm.free(a)
    assert bm.num_used == 3
    bm.check_integrity([b])
    bm.free(b)
    assert (bm.num_used, bm.num_cached_free) == (0, 2)
    bm.check_integrity([])


def test_prefix_caching_off_gives_no_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = _request("a", list(range(10, 19)))
    _run(bm, a)
    bm.free(a)
    assert bm.num_cached_free == 0
    assert _hit_of(bm, list(range(10, 19))) == 0


def test_snapshot_counts_blocks_by_lane_and_tenant():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = _request("a", list(range(10, 19)), lane="interactive", tenant="acme")
    b = _request("b", list(range(30, 35)), lane="batch", tenant="acme")
    for req in (a, b):
        _run(bm, req)
    snap = bm.snapshot([a, b])
    assert (snap.total, snap.used, snap.free) == (16, 5, 11)
    assert snap.by_lane == {"interactive": 3, "batch": 2}
    assert snap.by_tenant == {"acme": 5}
    assert snap.usage == 5 / 16


def test_check_integrity_catches_a_leak_and_a_double_owner():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = _request("a", list(range(10, 19)))
    _run(bm, a)
    with pytest.raises(AssertionError, match="owners"):  # a leaked block is noticed
        bm.check_integrity([])  # a's blocks are held by nobody the caller knows
    b = _request("b", [1, 2])
    b.block_ids = [a.block_ids[0], a.block_ids[0]]
    try:
        bm.check_integrity([a, b])
    except AssertionError:
        return
    raise AssertionError("a block owned twice went unnoticed")
