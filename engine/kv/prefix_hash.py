"""Prefix-cache block hashes: keyed, chained, and rooted in the request's cache domain.

    hash_0 = H(root(domain) || tokens of block 0)
    hash_i = H(hash_{i-1}   || tokens of block i)      (full blocks only)

H is blake2b with a 16-byte digest, keyed with random bytes drawn when the hasher is
built (one key per BlockManager, so per process): nobody outside the process can compute
a block's hash, so nobody can craft a prompt whose chain collides with another's, and an
accidental collision among cached blocks is ~N / 2**128. Token ids are packed as int64.

The root separates cache domains: a request can only hit blocks whose chain started from
the same root. The domain is, first match wins:

    the request's `cache_salt`   shared by every request that sends the same salt, whatever
                                 its tenant (the salt is a shared secret: a capability)
    its tenant                   `prefix_cache_sharing: tenant` (the default)
    one global domain            `prefix_cache_sharing: global` (tenants trust each other)

Each kind is tagged before it is hashed, and roots use their own blake2b personalisation,
so a salt never equals a tenant's domain (a tenant named like someone's salt gains
nothing) and a root never equals a block hash.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence

from engine.config.schema import PREFIX_CACHE_SHARING

DIGEST_SIZE = 16  # bytes: 128-bit block hashes
_ROOT_PERSON = b"bp-prefix-root"  # blake2b personalisation of roots (<= 16 bytes)
MAX_MEMO_ROOTS = 4096  # domains whose root is remembered; the memo is emptied when full


class BlockHasher:
    """Chained keyed hashes of full blocks of `block_size` tokens."""

    def __init__(self, block_size: int, sharing: str = "tenant", key: bytes | None = None):
        if sharing not in PREFIX_CACHE_SHARING:
            raise ValueError(f"prefix_cache_sharing={sharing!r} must be one of"
                             f" {', '.join(PREFIX_CACHE_SHARING)}")
        self.block_size = block_size
        self.sharing = sharing
        key = key if key is not None else os.urandom(32)
        # Keying costs one compression; copying a keyed state skips it on every block.
        self._block_state = hashlib.blake2b(key=key, digest_size=DIGEST_SIZE)
        self._root_state = hashlib.blake2b(key=key, digest_size=DIGEST_SIZE,
                                           person=_ROOT_PERSON)
        self._pack = struct.Struct(f"<{block_size}q").pack  # one block's ids as int64
        self._global_root = self._root(b"g")
        # (tenant, salt) -> root: a request's root is needed at each start attempt and when
        # its first block fills. Bounded: tenants may be one per end user.
        self._memo: dict[tuple[str, str | None], bytes] = {}

    def root(self, tenant: str, cache_salt: str | None) -> bytes:
        """The parent digest of a request's first block: its cache domain's root."""
        if cache_salt is None and self.sharing == "global":
            return self._global_root
        memo_key = (tenant, cache_salt)
        root = self._memo.get(memo_key)
        if root is None:
            if len(self._memo) >= MAX_MEMO_ROOTS:
                self._memo.clear()
            # surrogatepass: a salt the HTTP edge let through unencodable must not raise
            # here, inside a step, where it would end every request of the batch
            domain = b"s" + cache_salt.encode("utf-8", "surrogatepass") \
                if cache_salt is not None else b"t" + tenant.encode("utf-8", "surrogatepass")
            root = self._memo[memo_key] = self._root(domain)
        return root

    def block(self, parent: bytes, token_ids: Sequence[int], index: int) -> bytes:
        """The digest of block `index` of `token_ids` (full), chained to `parent`: the
        root for block 0, else block index-1's digest."""
        bs = self.block_size
        h = self._block_state.copy()
        h.update(parent + self._pack(*token_ids[index * bs:(index + 1) * bs]))
        return h.digest()

    def _root(self, domain: bytes) -> bytes:
        h = self._root_state.copy()
        h.update(domain)
        return h.digest()


def digest_key(digest: bytes) -> int:
    """The int a digest is stored as (dict key, `Request.block_hashes`)."""
    return int.from_bytes(digest, "little")


def key_digest(key: int) -> bytes:
    return key.to_bytes(DIGEST_SIZE, "little")
