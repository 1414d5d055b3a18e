"""The paged KV block pool: `BlockManager` (`block_manager.py`) owns the block states, ref
counts, the free list and the prefix-hash map, and is the only writer of a request's
`block_ids` and `block_hashes`; `prefix_hash.py` hashes full blocks, keyed and chained
within a cache domain. The KV tensors themselves belong to the executor (engine/execution).
It may import the config and `engine.request` only.
"""
