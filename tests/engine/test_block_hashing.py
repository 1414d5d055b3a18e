"""Issue 17.2: prefix-cache block hashes are keyed 128-bit blake2b digests, so nobody
outside the process can predict them (and craft a prompt whose chain collides with
another's); Python's `hash((parent, tokens))` with root 0 could be computed by anyone."""

from __future__ import annotations

from engine.kv.block_manager import BlockManager
from engine.kv.prefix_hash import BlockHasher
from engine.request import Request, SamplingParams

BS = 4
TOKENS = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34, 41]  # 3 full blocks and one token


def _hashes(bm: BlockManager, tokens: list[int], tenant: str = "default") -> list[int]:
    req = Request("r", list(tokens), SamplingParams(), 0.0, tenant=tenant)
    hit = bm.allocate_prefix(req)
    req.num_computed_tokens = hit
    assert bm.allocate(req, req.num_tokens - hit)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)
    hashes = list(req.block_hashes)
    bm.free(req)
    bm.check_integrity([])
    return hashes


def _builtin_chain(tokens: list[int]) -> list[int]:
    parent, out = 0, []
    for i in range(len(tokens) // BS):
        parent = hash((parent, tuple(tokens[i * BS:(i + 1) * BS])))
        out.append(parent)
    return out


def test_block_hashes_cannot_be_predicted_outside_the_process():
    first = _hashes(BlockManager(8, BS), TOKENS)
    second = _hashes(BlockManager(8, BS), TOKENS)  # another pool: another key
    assert len(first) == len(second) == 3
    assert not set(first) & set(_builtin_chain(TOKENS))
    assert not set(first) & set(second)
    assert max(h.bit_length() for h in first + second) > 64  # 128-bit digests


def test_the_same_prefix_hashes_the_same_in_one_pool():
    bm = BlockManager(8, BS)
    assert _hashes(bm, TOKENS) == _hashes(bm, TOKENS)
    assert _hashes(bm, TOKENS[:8] + [99] * 5)[:2] == _hashes(bm, TOKENS)[:2]  # chained


def test_roots_separate_tenants_salts_and_the_global_domain():
    tenant = BlockHasher(BS, "tenant", key=b"k" * 32)
    shared = BlockHasher(BS, "global", key=b"k" * 32)
    roots = {tenant.root("alice", None), tenant.root("bob", None),
             tenant.root("bob", "alice"), tenant.root("bob", "t" + "alice"),
             shared.root("alice", None)}
    assert len(roots) == 5  # a salt never equals a tenant's root, nor the global one
    assert tenant.root("alice", "s1") == tenant.root("bob", "s1") == shared.root("x", "s1")
    assert shared.root("alice", None) == shared.root("bob", None)
    block = tenant.block(tenant.root("alice", None), list(range(BS)), 0)
    assert block not in roots and len(block) == 16


def test_a_salt_or_tenant_no_encoder_takes_still_hashes_apart():
    # a lone surrogate: hashed inside a step, where raising would end the whole batch
    hasher = BlockHasher(4)
    roots = {hasher.root("t", "\ud800"), hasher.root("t", "\udc00"), hasher.root("\ud800", None)}
    assert len(roots) == 3
