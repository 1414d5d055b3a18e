"""Issue 17.1: the prefix cache must not tell one tenant what another sent.

A hit is observable by the client: `num_cached_tokens` in the response and a shorter TTFT.
So by default a tenant only hits its own blocks; `prefix_cache_sharing: global` opts in to
sharing, and a request's `cache_salt` names the cache domain itself (same salt: shared,
whatever the tenant; a salt never opens a tenant's own domain).
"""

from __future__ import annotations

import pytest
from engine_helpers import EOS, START_TIME, prompt

from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.records import RequestRecord
from engine.request import SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor

BS = 16
PROMPT = prompt(17, 5 * BS)  # 5 full blocks: a first schedule may take 4 (one left to run)
FULL_HIT = 4 * BS
PREFILL_TOKEN_COST_S = 0.001  # the simulated executor's clock: TTFT grows with prefill


def _engine(sharing: str | None = None) -> Engine:
    """None: the default sharing mode."""
    clock = FakeClock(START_TIME)
    executor = SimulatedExecutor(eos_token_id=EOS, prefill_token_cost_s=PREFILL_TOKEN_COST_S,
                                 clock=clock)
    sharing_kw = {} if sharing is None else {"prefix_cache_sharing": sharing}
    static = StaticConfig(block_size=BS, num_kv_blocks=64, max_model_len=512, **sharing_kw)
    live = LiveConfig(max_num_seqs=8, prefill_chunk_size=512)
    return Engine(EngineConfig(static, live), executor, clock=clock, eos_token_id=EOS)


def _send(engine: Engine, rid: str, tenant: str, cache_salt: str | None = None,
          ) -> tuple[RequestRecord, int]:
    """Run one request alone to its end: its record, and the prefix-hit tokens the engine's
    step records (and the BlockManager's counter) show for it."""
    bm = engine.block_manager
    hits_before = bm.prefix_hit_tokens
    salt_kw = {} if cache_salt is None else {"cache_salt": cache_salt}
    decision = engine.add_request(rid, PROMPT, SamplingParams(max_tokens=3, ignore_eos=True),
                                  tenant=tenant, **salt_kw)
    assert decision.accepted
    outputs = engine.run_until_done()
    engine.check_integrity()
    step_hits = sum(o.record.prefix_hit_tokens for o in outputs if o.record is not None)
    assert step_hits == bm.prefix_hit_tokens - hits_before
    [record] = [r for o in outputs for r in o.finished if r.request_id == rid]
    return record, step_hits


def test_another_tenant_gets_no_hit_while_the_owners_repeat_does():
    engine = _engine()
    cold, cold_hits = _send(engine, "alice-1", "alice")
    probe, probe_hits = _send(engine, "mallory-1", "mallory")
    repeat, repeat_hits = _send(engine, "alice-2", "alice")

    assert (cold.num_cached_tokens, cold_hits) == (0, 0)
    assert (probe.num_cached_tokens, probe_hits) == (0, 0)  # the field says nothing
    assert probe.ttft_s == pytest.approx(cold.ttft_s)  # nor does the time: a cold prefill
    assert (repeat.num_cached_tokens, repeat_hits) == (FULL_HIT, FULL_HIT)
    assert repeat.ttft_s < cold.ttft_s


def test_tenants_running_at_once_share_no_block():
    engine = _engine()
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    engine.add_request("alice", PROMPT, params, tenant="alice")
    for _ in range(3):  # alice's prompt is computed and its full blocks registered
        engine.step()
    engine.add_request("mallory", PROMPT, params, tenant="mallory")
    engine.add_request("alice-again", PROMPT, params, tenant="alice")
    engine.step()
    alice, mallory, again = (engine.get_request(r) for r in ("alice", "mallory", "alice-again"))
    assert not set(mallory.block_ids) & set(alice.block_ids)
    assert mallory.num_cached_tokens == 0
    assert again.block_ids[:4] == alice.block_ids[:4]  # its own tenant's blocks are shared
    assert again.num_cached_tokens == FULL_HIT
    engine.check_integrity()


def test_global_sharing_lets_every_tenant_hit():
    engine = _engine("global")
    _send(engine, "alice-1", "alice")
    probe, probe_hits = _send(engine, "bob-1", "bob")
    assert (probe.num_cached_tokens, probe_hits) == (FULL_HIT, FULL_HIT)


@pytest.mark.parametrize("sharing", ["tenant", "global"])
def test_the_same_cache_salt_shares_across_tenants_and_nothing_else(sharing):
    engine = _engine(sharing)
    salt = "team-7f3a9c2e41d8b6"
    _send(engine, "alice-salted", "alice", cache_salt=salt)
    same_salt, _ = _send(engine, "bob-salted", "bob", cache_salt=salt)
    other_salt, _ = _send(engine, "bob-other", "bob", cache_salt=salt + "x")
    alice_unsalted, _ = _send(engine, "alice-plain", "alice")
    assert same_salt.num_cached_tokens == FULL_HIT  # a salt is a shared cache domain
    assert other_salt.num_cached_tokens == 0
    assert alice_unsalted.num_cached_tokens == 0  # the salt replaced alice's own domain
    salted_after, _ = _send(engine, "carol-salted", "carol", cache_salt=salt)
    assert salted_after.num_cached_tokens == FULL_HIT


def test_a_salt_named_like_a_tenant_does_not_open_that_tenants_cache():
    engine = _engine()
    _send(engine, "alice-1", "alice")
    probe, probe_hits = _send(engine, "mallory-1", "mallory", cache_salt="alice")
    assert (probe.num_cached_tokens, probe_hits) == (0, 0)


def test_a_salted_request_misses_the_global_domain():
    engine = _engine("global")
    _send(engine, "alice-1", "alice")
    salted, _ = _send(engine, "bob-1", "bob", cache_salt="private-9d1e")
    assert salted.num_cached_tokens == 0


def test_sharing_mode_is_validated():
    with pytest.raises(ValueError, match="prefix_cache_sharing='everyone' must be one of"
                                         " tenant, global"):
        _engine("everyone")
