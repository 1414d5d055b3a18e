"""The simulated executor's shadow KV (issue 17, item 11): a wrong block table, a prefix
hit on other content, a skipped chunk or a block reused while still referenced is caught
end to end, while correct sharing (prefix hits, preemption and recompute) passes.

Each bug below is injected where `check_integrity()` cannot see it (ownership and ref
counts stay consistent) and leaves every request's token ids intact, so before the shadow
KV these runs finished with the reference tokens: nothing noticed. The engine contains an
executor's exception (engine/fault_isolation.py: the request ends with ERROR), so the tests
take the mismatch from the executor's record of what it raised.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from engine_helpers import Driver, make_engine, prompt
from hypothesis import HealthCheck, event, given, settings
from test_random_workloads import _arrival, live_configs

from engine.config import LiveConfig
from engine.kv.block_manager import BlockManager
from engine.request import SamplingParams
from engine.sim.executor import ShadowKVMismatch, SimulatedExecutor
from engine.sim.shadow_kv import SeqRun, ShadowKV, prefix_digests

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
CHUNKED = LiveConfig(max_num_seqs=8, max_num_batched_tokens=64, prefill_chunk_size=16)


def first_mismatch(engine, max_steps: int = 100) -> ShadowKVMismatch:
    """Step the engine (no Driver: it would fail on the contained step) until the shadow
    KV reports; fail if the engine drains first."""
    for _ in range(max_steps):
        try:
            engine.step()
        except ShadowKVMismatch as exc:  # an engine that does not contain executor errors
            return exc
        if engine.executor.shadow_mismatches:
            return engine.executor.shadow_mismatches[0]
        if not engine.has_unfinished_requests():
            break
    raise AssertionError("the shadow KV saw nothing wrong")


def _prefilling(engine, request_id: str, steps: int, d: Driver) -> None:
    for _ in range(steps):
        d.step()
    assert engine.get_request(request_id).num_computed_tokens < len(
        engine.get_request(request_id).token_ids)


# ---- correct sharing passes -------------------------------------------------------------
def test_a_prefix_hit_reads_blocks_another_request_wrote():
    engine, _ = make_engine()
    d = Driver(engine)
    shared = prompt(1, 64)
    d.add("first", shared + prompt(2, 8), PARAMS)
    d.run()
    d.add("second", shared + prompt(3, 5), PARAMS)
    d.step()
    second = engine.get_request("second")
    assert second.num_cached_tokens == 64
    shadow = engine.executor.shadow
    written_in = {int(shadow.steps[b * 16]) for b in second.block_ids[:4]}
    assert max(written_in) < d.records()[-1].step_id  # by the first request's steps
    read_before = shadow.tokens_read
    d.run()  # Driver: the second's tokens equal a solo run's
    assert shadow.tokens_read > read_before


def test_preempted_requests_recompute_through_the_shadow_with_the_same_tokens():
    # 12 blocks of 8 cannot hold four 40-token requests that each grow to 64: preemption
    engine, _ = make_engine(CHUNKED, block_size=8, num_kv_blocks=12, max_model_len=128)
    d = Driver(engine)
    for i in range(4):
        d.add(f"r{i}", prompt(i, 40), SamplingParams(max_tokens=24, ignore_eos=True))
    d.run()
    assert any(r.decisions.preempted for r in d.records())
    assert engine.executor.shadow.tokens_read > engine.executor.shadow.tokens_written


# ---- bugs the shadow catches -------------------------------------------------------------
def test_blocks_swapped_in_a_block_table_are_caught():
    engine, _ = make_engine()
    d = Driver(engine)
    d.add("victim", prompt(1, 40), PARAMS)
    d.step()
    blocks = engine.get_request("victim").block_ids
    blocks[0], blocks[1] = blocks[1], blocks[0]  # same owner, same ref counts
    exc = first_mismatch(engine)
    assert (exc.request_id, exc.position, exc.expected) == ("victim", 0, prompt(1, 40)[0])
    assert "'victim' position 0 (block" in str(exc)
    assert f"found token {prompt(1, 40)[16]} at position 16 (written in step 1)" in str(exc)


def test_block_tables_swapped_between_requests_are_caught():
    engine, _ = make_engine()
    d = Driver(engine)
    d.add("a", prompt(1, 40), PARAMS)
    d.add("b", prompt(2, 40), PARAMS)
    d.step()
    a, b = engine.get_request("a"), engine.get_request("b")
    a.block_ids, b.block_ids = b.block_ids, a.block_ids
    exc = first_mismatch(engine)
    assert exc.request_id in ("a", "b") and "written in step 1" in str(exc)


def test_a_prefix_hit_on_a_block_of_other_tokens_is_caught(monkeypatch):
    # BUG under test: block hashes skip the last token of each block (an off-by-one).
    def blind(method):
        def patched(self, request, *args, **kwargs):
            true_ids = request.token_ids
            bs = self.block_size
            request.token_ids = [0 if i % bs == bs - 1 else t for i, t in enumerate(true_ids)]
            try:
                return method(self, request, *args, **kwargs)
            finally:
                request.token_ids = true_ids
        return patched

    for name in ("allocate_prefix", "cache_full_blocks"):
        monkeypatch.setattr(BlockManager, name, blind(getattr(BlockManager, name)))
    engine, _ = make_engine()
    d = Driver(engine)
    first = prompt(1, 64)
    d.add("first", first, PARAMS)
    d.run()
    other = first[:15] + [first[15] + 1] + first[16:]  # differs in block 0's last token
    d.add("other", other, PARAMS)
    exc = first_mismatch(engine)
    assert (exc.request_id, exc.position, exc.expected) == ("other", 15, other[15])
    assert f"found token {first[15]} at position 15" in str(exc)


def test_a_hit_on_a_block_not_yet_computed_is_caught(monkeypatch):
    # BUG under test: a chunk's blocks are registered in the prefix cache as if its whole
    # prompt were computed; a request cancelled mid-prefill leaves half-written blocks.
    original = BlockManager.cache_full_blocks

    def eager(self, request, *args, **kwargs):
        computed = request.num_computed_tokens
        request.num_computed_tokens = request.num_tokens
        try:
            original(self, request, *args, **kwargs)
        finally:
            request.num_computed_tokens = computed

    monkeypatch.setattr(BlockManager, "cache_full_blocks", eager)
    engine, _ = make_engine(CHUNKED.replace(prefill_chunk_size=24))
    d = Driver(engine)
    d.add("cancelled", prompt(1, 64), PARAMS)
    _prefilling(engine, "cancelled", 1, d)  # 24 tokens: block 1 half written, registered
    d.abort("cancelled")
    d.add("same", prompt(1, 64), PARAMS)
    exc = first_mismatch(engine)
    assert (exc.request_id, exc.position) == ("same", 24) and "never written" in str(exc)


def test_a_skipped_chunk_is_caught():
    engine, _ = make_engine(CHUNKED)
    d = Driver(engine)
    d.add("skipper", prompt(1, 64), PARAMS)
    _prefilling(engine, "skipper", 1, d)
    engine.get_request("skipper").num_computed_tokens += 16  # BUG: 16..31 never computed
    exc = first_mismatch(engine)
    assert (exc.request_id, exc.position) == ("skipper", 16) and "never written" in str(exc)


def test_a_cached_block_reused_while_still_referenced_is_caught(monkeypatch):
    # BUG under test: a prefix hit does not pin the cached blocks it takes, so they stay
    # in the free list and are evicted for another request while the hitter reads them.
    original = BlockManager.allocate_prefix

    def unpinned(self, request, *args, **kwargs):
        hit = original(self, request, *args, **kwargs)
        for block_id in request.block_ids:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
                self.num_used -= 1
                self.num_cached_free += 1
        return hit

    monkeypatch.setattr(BlockManager, "allocate_prefix", unpinned)
    engine, _ = make_engine(num_kv_blocks=16, max_model_len=256)  # no Driver: its
    shared = prompt(1, 64)  # integrity check is not what catches this here; end to end
    engine.add_request("first", shared + prompt(2, 4), PARAMS)
    engine.run_until_done()  # blocks 0-3 cached, 12 empty
    engine.add_request("hitter", shared + prompt(3, 40), SamplingParams(max_tokens=30))
    # the hitter takes 4 cached blocks (unpinned) and 3 empty ones; the evictor needs 10,
    # more than the 9 left empty: it evicts cached blocks the hitter still reads
    engine.add_request("evictor", prompt(4, 160), PARAMS)
    exc = first_mismatch(engine)
    assert exc.request_id == "hitter" and exc.position < 64


# ---- the switch and the pool --------------------------------------------------------------
def test_shadow_kv_off_checks_nothing():
    engine, _ = make_engine()
    engine.executor.shadow_kv = False
    engine.executor.bind_kv_pool(engine.static.num_kv_blocks, engine.static.block_size)
    assert engine.executor.shadow is None
    engine.add_request("r", prompt(1, 40), PARAMS)
    engine.step()
    blocks = engine.get_request("r").block_ids
    blocks[0], blocks[1] = blocks[1], blocks[0]
    outputs = engine.run_until_done()  # nothing reads the KV back: the corruption goes unseen
    assert not engine.executor.shadow_mismatches
    assert all(getattr(o, "failure", None) is None for o in outputs)


def test_an_executor_bound_to_another_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size=16 must equal"):
        SimulatedExecutor(block_size=8).bind_kv_pool(64, 16)


def test_shadow_reports_a_table_too_short_and_a_block_outside_the_pool():
    shadow = ShadowKV(block_size=4, num_blocks=8)
    with pytest.raises(ShadowKVMismatch, match="no block: 1 blocks of 4 cover 4 tokens"):
        shadow.run_step([SeqRun("r", [0], [5] * 6, 0, 6)], step_id=1)
    with pytest.raises(ShadowKVMismatch, match="block id 8 outside the pool of 8"):
        shadow.run_step([SeqRun("r", [1, 8], [5] * 6, 0, 6)], step_id=1)


def test_same_tokens_after_a_different_prefix_do_not_match():
    # block 1 holds tokens 3, 4 at positions 2, 3, computed after 7, 8; the reader's block
    # table sends it there after its own 9, 9: its K/V would differ, so must the shadow's
    shadow = ShadowKV(block_size=2, num_blocks=8)
    assert shadow.run_step([SeqRun("w", [0, 1], [7, 8, 3, 4], 0, 4)], 1) == [(7, 4, 4)]
    reader = [9, 9, 3, 4, 5]
    shadow.run_step([SeqRun("r", [2], reader, 0, 2)], 2)  # its own 9, 9 into block 2
    with pytest.raises(ShadowKVMismatch, match="found token 3 at position 2 computed after"
                       " a different prefix") as exc:  # a decode of position 4 via block 1
        shadow.run_step([SeqRun("r", [2, 1, 3], reader, 4, 5)], 3)
    assert (exc.value.request_id, exc.value.position, exc.value.block_id) == ("r", 2, 1)
    assert np.array_equal(shadow.positions[:6], [0, 1, 2, 3, 0, 1])


def test_another_token_at_the_same_position_is_reported_as_that_token():
    """A slot holding another request's token at the same position is a wrong block, named
    by its token and writer: not 'computed after a different prefix' (that diagnosis is
    for the reader's own token after other ones)."""
    shadow = ShadowKV(block_size=2, num_blocks=8)
    shadow.run_step([SeqRun("w", [0], [7, 8], 0, 2)], 1)
    with pytest.raises(ShadowKVMismatch) as exc:  # its own position 2, reading block 0
        shadow.run_step([SeqRun("r", [0, 1], [5, 6, 1], 2, 3)], 2)
    assert (exc.value.request_id, exc.value.position, exc.value.block_id) == ("r", 0, 0)
    assert "expected token 5, found token 7 at position 0 (written in step 1)" in str(exc.value)
    assert "different prefix" not in str(exc.value)


def test_one_step_reads_back_what_each_sequence_wrote_and_the_digests_per_sequence():
    shadow = ShadowKV(block_size=2)  # pool size unknown: grows
    a, b = [3, 4, 5], [6, 7, 8, 9, 10]
    assert shadow.run_step([SeqRun("a", [4, 0], a, 0, 3), SeqRun("b", [1, 2, 7], b, 0, 5)],
                           1) == [(3, 5, 3), (6, 10, 5)]
    assert np.array_equal(shadow.digests[[8, 9, 0]], prefix_digests(np.array(a)))
    assert np.array_equal(shadow.digests[[2, 3, 4, 5, 14]], prefix_digests(np.array(b)))
    assert (shadow.tokens_written, shadow.tokens_read) == (8, 8)


# ---- random workloads: a corrupted table is caught whenever its request runs -------------
def _step_reports_mismatch(d: Driver) -> bool:
    """One step with the Driver's checks, unless the shadow KV reports a mismatch."""
    seen = len(d.engine.executor.shadow_mismatches)
    d.allow_step_failures = True
    try:
        d.step()
    except ShadowKVMismatch:  # an engine that does not contain executor errors
        return True
    finally:
        d.allow_step_failures = False
    return len(d.engine.executor.shadow_mismatches) > seen


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_workloads_catch_a_corrupted_block_table(data):
    engine, clock = make_engine(CHUNKED, block_size=8, max_model_len=128,
                                num_kv_blocks=data.draw(st.integers(8, 48), label="blocks"),
                                step_cost_s=1e-3)
    d = Driver(engine)
    d.update_config(data.draw(live_configs(engine), label="config"))
    scheduled: list[set[str]] = []
    schedule = engine.scheduler.schedule

    def spy(now):
        out, stats = schedule(now)
        scheduled.append({r.request_id for r in out.decodes}
                         | {c.request.request_id for c in out.prefills})
        return out, stats

    engine.scheduler.schedule = spy
    for n in range(data.draw(st.integers(5, 60), label="steps")):
        for i in range(data.draw(st.integers(0, 3), label="arrivals")):
            _arrival(data, d, 10 * n + i, engine.live_config.lane_names)
        clock.advance(data.draw(st.sampled_from([0.0, 0.01]), label="idle_s"))
        victims = sorted((r for r in engine.scheduler.running
                          if r.num_computed_tokens > engine.static.block_size),
                         key=lambda r: r.request_id)
        if not victims or data.draw(st.integers(0, 3), label="corrupt") != 0:
            d.step()
            continue
        victim = data.draw(st.sampled_from(victims), label="victim")
        table, preemptions = victim.block_ids, victim.num_preemptions
        table[0], table[1] = table[1], table[0]
        if _step_reports_mismatch(d):  # only the victim's table is wrong: it ran
            assert victim.request_id in scheduled[-1]
            event("corruption caught")
            return
        if victim.num_preemptions == preemptions and not victim.is_finished:
            # it kept the corrupted table: it must not have run; undo and go on
            assert victim.request_id not in scheduled[-1], "a corrupted table went unseen"
            table[0], table[1] = table[1], table[0]
    d.run(max_steps=20_000)  # and no false alarm on the correct runs
