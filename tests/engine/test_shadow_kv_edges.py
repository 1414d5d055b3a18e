"""Edges of the simulated executor's shadow KV (engine/sim/shadow_kv.py), on the shadow
alone: block ids outside the pool at either end, where such a block is reported, a block
size of 0, a wrong block holding token 0, and the counters over a prefix-cache hit."""

from __future__ import annotations

import pytest

from engine.sim.shadow_kv import SeqRun, ShadowKV, ShadowKVMismatch

TOKENS = [11, 12, 13, 14, 15, 16]


@pytest.mark.parametrize("num_blocks", [8, 0])  # a known pool, and one of unknown size
def test_a_negative_block_id_is_outside_the_pool(num_blocks):
    shadow = ShadowKV(block_size=4, num_blocks=num_blocks)
    with pytest.raises(ShadowKVMismatch, match="block id -1 outside the pool"):
        shadow.run_step([SeqRun("r", [0, -1], TOKENS, 0, 6)], step_id=1)


def test_a_block_outside_the_pool_is_reported_at_its_first_position():
    shadow = ShadowKV(block_size=4, num_blocks=8)
    with pytest.raises(ShadowKVMismatch) as exc:
        shadow.run_step([SeqRun("r", [1, 8], TOKENS, 0, 6)], step_id=3)
    got = exc.value
    assert (got.position, got.expected, got.block_id, got.step_id) == (4, 15, 8, 3)


def test_a_block_size_of_0_is_refused_naming_it():
    with pytest.raises(ValueError, match="block_size=0 must be >= 1"):
        ShadowKV(block_size=0)


def test_a_wrong_block_holding_token_0_is_reported_as_that_token():
    shadow = ShadowKV(block_size=2, num_blocks=8)
    shadow.run_step([SeqRun("w", [0], [0, 0], 0, 2)], 1)  # token 0 is a real token id
    with pytest.raises(ShadowKVMismatch) as exc:
        shadow.run_step([SeqRun("r", [0, 1], [5, 6, 1], 2, 3)], 2)
    assert "found token 0 at position 0 (written in step 1)" in str(exc.value)
    assert "never written" not in str(exc.value)


def test_a_prefix_hit_counts_its_context_as_read_and_only_its_new_tokens_as_written():
    shadow = ShadowKV(block_size=2, num_blocks=8)
    shadow.run_step([SeqRun("w", [0, 1], [1, 2, 3, 4], 0, 4)], 1)
    # a hit on blocks 0, 1: it computes position 4 only, and reads 0..4
    assert shadow.run_step([SeqRun("r", [0, 1, 2], [1, 2, 3, 4, 9], 4, 5)], 2) == [(1, 9, 5)]
    assert (shadow.tokens_written, shadow.tokens_read) == (5, 9)


def test_a_block_outside_the_pool_past_the_known_tokens_is_still_a_mismatch():
    """A table may hold blocks ahead of the tokens; one of those outside the pool raised
    IndexError (reading the token it holds), not the mismatch a caller catches."""
    shadow = ShadowKV(4, 8)
    with pytest.raises(ShadowKVMismatch, match="position 4 .block 99.: expected no token"):
        shadow.run_step([SeqRun("r", [0, 99], [1, 2, 3], 0, 3)], 1)
