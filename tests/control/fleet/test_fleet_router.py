"""The fleet router's decisions over hand-built load snapshots (no Ray, no engine)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections import Counter

import pytest

from control.fleet.loads import MAX_LATE_POLLS, LoadTable, poll_forever
from control.fleet.router import (
    Decision,
    NoReplicaAvailable,
    ReplicaLoad,
    RoutingPolicy,
    affinity_key,
    choose,
    preferred,
    prompt_prefix,
)

POLICY = RoutingPolicy(max_imbalance=4, max_kv_imbalance=0.25)
SYSTEM = "You are a support agent for ACME routers. Answer briefly and cite the manual. " * 4


def idle(n: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i) for i in range(n)]


def key_of(text: str, tenant: str = "t") -> bytes:
    return affinity_key(prompt_prefix({"prompt": text}, POLICY), tenant, None, POLICY)


def test_a_key_always_goes_to_its_replica_and_keys_spread_evenly():
    rng = random.Random(0)
    picks = Counter()
    for i in range(2000):
        key = key_of(f"document {i}: ")
        first = choose(key, idle(4), POLICY, rng)
        assert first.reason == "affinity"
        assert choose(key, idle(4), POLICY, rng).replica_id == first.replica_id
        picks[first.replica_id] += 1
    assert sorted(picks) == [0, 1, 2, 3]
    assert all(350 <= n <= 650 for n in picks.values()), picks  # 500 each, +-30%


def test_a_replica_that_leaves_moves_only_its_own_keys():
    keys = [key_of(f"prompt {i}") for i in range(500)]
    before = {k: preferred(k, idle(4)).replica_id for k in keys}
    loads = [ReplicaLoad(i, healthy=i != 2) for i in range(4)]
    rng = random.Random(0)
    after = {k: choose(k, loads, POLICY, rng).replica_id for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == 2 for k in moved)
    assert all(after[k] != 2 for k in keys)


def test_shared_system_prompt_shares_a_replica_and_tenants_may_split():
    def chat(user: str, tenant: str) -> bytes:
        body = {"messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": user}]}
        return affinity_key(prompt_prefix(body, POLICY), tenant, None, POLICY)

    assert chat("reset my router", "a") == chat("what is DHCP?", "a")  # past prefix_chars
    assert chat("x", "a") != chat("x", "b")
    untenanted = RoutingPolicy(key_by_tenant=False)
    body = {"prompt": SYSTEM}
    assert (affinity_key(prompt_prefix(body, untenanted), "a", None, untenanted)
            == affinity_key(prompt_prefix(body, untenanted), "b", None, untenanted))
    ids = prompt_prefix({"prompt": list(range(100))}, POLICY)
    assert ids == "ids:" + ",".join(map(str, range(64)))
    assert prompt_prefix({"max_tokens": 3}, POLICY) is None


def test_affinity_holds_within_the_imbalance_and_yields_past_it():
    key = key_of(SYSTEM)
    home = preferred(key, idle(2)).replica_id
    other = 1 - home
    rng = random.Random(0)

    def loads(home_running: int, home_kv: float = 0.0) -> list[ReplicaLoad]:
        return [ReplicaLoad(home, running=home_running, kv_usage=home_kv),
                ReplicaLoad(other, running=1)]

    assert choose(key, loads(5), POLICY, rng) == choose(key, loads(1), POLICY, rng)
    assert choose(key, loads(5), POLICY, rng).replica_id == home  # 5 - 1 <= 4
    over = choose(key, loads(6), POLICY, rng)  # 6 - 1 > 4: the other, by load
    assert (over.replica_id, over.reason) == (other, "balance")
    kv = choose(key, loads(1, home_kv=0.6), POLICY, rng)  # KV 0.6 over 0.0 > 0.25
    assert (kv.replica_id, kv.reason) == (other, "balance")
    # below kv_busy (0.5) a replica has room: its KV lead alone does not turn a request away
    roomy = choose(key, loads(1, home_kv=0.4), POLICY, rng)
    assert (roomy.replica_id, roomy.reason) == (home, "affinity")
    # the ingress's own in-flight count counts before the poll catches up
    burst = [ReplicaLoad(home, inflight=9), ReplicaLoad(other)]
    assert choose(key, burst, POLICY, rng).replica_id == other


def test_without_a_key_power_of_two_picks_the_less_loaded():
    rng = random.Random(1)
    loads = [ReplicaLoad(0, running=9), ReplicaLoad(1, waiting=2), ReplicaLoad(2, running=7)]
    picks = Counter(choose(None, loads, POLICY, rng).replica_id for _ in range(300))
    assert picks[0] == 0  # the busiest never wins a pair
    assert picks[1] > picks[2] > 0  # 1 wins every pair it is in; 2 only against 0


def test_health_random_mode_and_policy_checks():
    rng = random.Random(0)
    with pytest.raises(NoReplicaAvailable):
        choose(b"k", [ReplicaLoad(0, healthy=False)], POLICY, rng)
    only = choose(b"k", [ReplicaLoad(0, healthy=False), ReplicaLoad(1)], POLICY, rng)
    assert (only.replica_id, only.reason) == (1, "only")
    rand = RoutingPolicy(mode="random")
    picks = Counter(choose(b"k", idle(2), rand, rng).replica_id for _ in range(200))
    assert min(picks.values()) > 60  # one key, both replicas
    with pytest.raises(ValueError, match="mode='sticky' must be one of"):
        RoutingPolicy(mode="sticky").validate()
    with pytest.raises(ValueError, match="max_kv_imbalance=2"):
        RoutingPolicy(max_kv_imbalance=2).validate()


def test_load_table_marks_a_failed_replica_down_until_it_polls_ready():
    table = LoadTable(2)
    assert [r.healthy for r in table.snapshot()] == [False, False]  # before any poll
    table.polled(0, {"ready": True, "running": 3, "waiting": 1, "kv_usage": 0.5})
    table.polled(1, {"ready": True})
    table.started(0)
    assert table.snapshot()[0] == ReplicaLoad(0, True, 1, 3, 1, 0.5)
    table.failed(0, "actor died")
    assert not table.snapshot()[0].healthy
    table.polled(0, None)  # still down
    assert not table.snapshot()[0].healthy
    table.polled(0, {"ready": True})  # Serve brought it back
    assert table.snapshot()[0].healthy and table.views[0].failures == 1
    table.polled(1, {"ready": False, "reason": "draining"})
    assert not table.snapshot()[1].healthy


def test_a_busy_replica_whose_polls_come_late_stays_up_for_a_few_polls():
    """A saturated replica answers late; only MAX_LATE_POLLS late polls (or calls) in a row
    mark it down, an answer in between starts the count over, and a failed poll is down at
    once."""
    table = LoadTable(1)
    table.polled(0, {"ready": True})
    for _ in range(MAX_LATE_POLLS - 1):
        table.late(0)
    assert table.snapshot()[0].healthy
    table.polled(0, {"ready": True})  # it answered: the count starts over
    for _ in range(MAX_LATE_POLLS - 1):
        table.late(0)
    assert table.snapshot()[0].healthy
    table.late(0)
    assert not table.snapshot()[0].healthy
    table.polled(0, {"ready": True})
    table.polled(0, None)  # failed (not late): down at once
    assert not table.snapshot()[0].healthy


def test_poll_forever_counts_a_slow_answer_as_late_not_as_down():
    table = LoadTable(1)
    table.polled(0, {"ready": True})
    calls = 0

    async def slow_then_fast(since: tuple | None, wait_s: float) -> dict:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(0.5)  # past the 0.05 s timeout below
        return {"ready": True}

    async def run() -> list[bool]:
        seen = []
        task = asyncio.ensure_future(poll_forever(table, 0, slow_then_fast, poll_s=0.01,
                                                  timeout_s=0.05, wait_s=0.0))
        while calls < 3:
            seen.append(table.snapshot()[0].healthy)
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return seen

    assert all(asyncio.run(run()))  # never down: one late poll, then answers
    assert table.views[0].late_polls == 0


PRECISE = RoutingPolicy(mode="precise", max_imbalance=4, max_kv_imbalance=0.25)


def test_precise_goes_where_most_of_the_prompt_is_held():
    rng, key = random.Random(0), key_of(SYSTEM)
    # replica 2 holds 7 leading blocks, replica 0 holds 3: 2 wins, whatever the hash says
    decision = choose(key, idle(3), PRECISE, rng, {0: 3, 1: 0, 2: 7})
    assert (decision.replica_id, decision.reason, decision.matched_blocks) == (2, "precise", 7)
    # ties go to the less loaded holder
    loads = [ReplicaLoad(0, running=3), ReplicaLoad(1), ReplicaLoad(2, running=1)]
    assert choose(key, loads, PRECISE, rng, {0: 5, 1: 0, 2: 5}).replica_id == 2
    # a down holder is not a candidate
    loads = [ReplicaLoad(0), ReplicaLoad(1), ReplicaLoad(2, healthy=False)]
    assert choose(key, loads, PRECISE, rng, {0: 3, 1: 0, 2: 7}).replica_id == 0


def test_a_too_loaded_holder_spills_to_the_hashed_replica_then_balances():
    rng, key = random.Random(0), key_of(SYSTEM)
    hashed = preferred(key, idle(3)).replica_id
    holder = (hashed + 1) % 3
    busy = [ReplicaLoad(i, waiting=9 if i == holder else 0) for i in range(3)]
    decision = choose(key, busy, PRECISE, rng, {holder: 7})
    assert (decision.replica_id, decision.reason) == (hashed, "affinity")
    full = [ReplicaLoad(i, kv_usage=0.9 if i == holder else 0.1) for i in range(3)]
    assert choose(key, full, PRECISE, rng, {holder: 7}).replica_id == hashed
    # the hashed replica too loaded as well: two at random, the less loaded
    both = [ReplicaLoad(i, waiting=9 if i in (holder, hashed) else 0) for i in range(3)]
    assert choose(key, both, PRECISE, rng, {holder: 7}).reason == "balance"


def test_precise_places_prompts_nobody_holds_by_affinity():
    rng, key = random.Random(0), key_of(SYSTEM)
    # nobody holds any of it (or no keys): the rendezvous hash places it, as affinity would
    for matched in ({0: 0, 1: 0, 2: 0}, None):
        decision = choose(key, idle(3), PRECISE, rng, matched)
        assert decision.reason == "affinity" and decision.matched_blocks == 0
        assert decision.replica_id == preferred(key, idle(3)).replica_id


def test_precise_weighs_the_blocks_a_holder_saves_against_its_load():
    rng, key = random.Random(0), key_of(SYSTEM)
    policy = RoutingPolicy(mode="precise", max_imbalance=8, load_blocks=4.0)
    # replica 0 holds 8 blocks: worth 2 requests of load at 4 blocks a request
    at = [ReplicaLoad(0, running=2), ReplicaLoad(1)]
    # 4 * 2 - 8 = 0 against 0: a tie in cost goes to the less loaded, which holds none
    assert choose(key, at, policy, rng, {0: 8, 1: 0}).replica_id == 1
    over = [ReplicaLoad(0, running=3), ReplicaLoad(1)]
    assert choose(key, over, policy, rng, {0: 8, 1: 0}).replica_id == 1
    under = [ReplicaLoad(0, running=1), ReplicaLoad(1)]  # 4 - 8 < 0: the holder
    assert choose(key, under, policy, rng, {0: 8, 1: 0}) == Decision(0, "precise", 8)
    # two holders: the one whose blocks and load cost least, not the one holding most
    both = [ReplicaLoad(0, running=3), ReplicaLoad(1, running=0), ReplicaLoad(2)]
    decision = choose(key, both, policy, rng, {0: 10, 1: 6, 2: 0})
    assert decision == Decision(1, "precise", 6)  # 12 - 10 = 2 > 0 - 6
    # load_blocks 0: blocks alone decide (any load within the bounds)
    blocks_only = dataclasses.replace(policy, load_blocks=0.0)
    assert choose(key, both, blocks_only, rng, {0: 10, 1: 6, 2: 0}).replica_id == 0
    with pytest.raises(ValueError, match="load_blocks=-1"):
        RoutingPolicy(load_blocks=-1).validate()
