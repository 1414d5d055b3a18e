"""The fleet router's keys and precise mode at their edges (control/fleet/router.py): what
part of a prompt affinity hashes, where precise mode puts a prompt nobody holds, how it
breaks a tie in cost, and the strictest imbalance a policy may ask for. Hand-built load
snapshots, as in test_fleet_router.py."""

from __future__ import annotations

import random

from control.fleet.router import (
    Decision,
    ReplicaLoad,
    RoutingPolicy,
    affinity_key,
    choose,
    preferred,
    prompt_prefix,
)

POLICY = RoutingPolicy()
PRECISE = RoutingPolicy(mode="precise")
SYSTEM = "You are a support agent for ACME routers. Answer briefly and cite the manual. " * 4


def idle(n: int) -> list[ReplicaLoad]:
    return [ReplicaLoad(i) for i in range(n)]


def key_of(body: dict, tenant: str = "t") -> bytes:
    return affinity_key(prompt_prefix(body, POLICY), tenant, None, POLICY)


def test_completions_that_share_their_first_prefix_chars_share_a_key():
    """Past `prefix_chars` a prompt's text is not hashed: requests behind one long system
    prompt gather on the replica whose prefix cache holds it, whatever each one asks."""
    assert len(SYSTEM) > POLICY.prefix_chars
    first = key_of({"prompt": SYSTEM + "Reset my router."})
    assert first == key_of({"prompt": SYSTEM + "What is DHCP?"})
    assert prompt_prefix({"prompt": SYSTEM + "x"}, POLICY) == SYSTEM[: POLICY.prefix_chars]


def test_a_prompt_sent_as_a_list_of_one_string_is_keyed_as_that_string():
    """The OpenAI client may send `prompt: ["..."]`: it is the same prompt as the bare
    string, so it goes where that prompt's blocks are (not by load, as keyless)."""
    assert prompt_prefix({"prompt": [SYSTEM]}, POLICY) == prompt_prefix({"prompt": SYSTEM},
                                                                         POLICY)
    decision = choose(key_of({"prompt": [SYSTEM]}), idle(3), POLICY, random.Random(0))
    assert decision.reason == "affinity"


def test_precise_places_a_prompt_nobody_holds_on_its_hashed_replica_despite_some_load():
    """A new prefix goes by affinity within the imbalance, so its later requests gather
    where its first one computed its blocks; priced by load alone it would go to the
    idlest replica each time and scatter."""
    key = key_of({"prompt": SYSTEM})
    hashed = preferred(key, idle(3)).replica_id
    loads = [ReplicaLoad(i, running=2 if i == hashed else 0) for i in range(3)]
    decision = choose(key, loads, PRECISE, random.Random(0), {0: 0, 1: 0, 2: 0})
    assert decision == Decision(hashed, "affinity")


def test_precise_breaks_a_tie_in_cost_by_load_before_the_hash():
    """With load_blocks 0 two replicas holding the same blocks cost the same: the less
    loaded one takes the request, even when the prefix's hash prefers the other (which
    would otherwise take every such request until it is max_imbalance ahead)."""
    key = key_of({"prompt": SYSTEM})
    hashed = preferred(key, idle(2)).replica_id
    other = 1 - hashed
    blocks_only = RoutingPolicy(mode="precise", load_blocks=0.0)
    loads = [ReplicaLoad(hashed, running=3), ReplicaLoad(other)]
    decision = choose(key, loads, blocks_only, random.Random(0), {hashed: 5, other: 5})
    assert decision == Decision(other, "precise", 5)


def test_a_policy_allowing_no_imbalance_is_valid_and_takes_the_least_loaded():
    """max_imbalance 0 (affinity only among equally loaded replicas) is a policy an
    operator may set: it validates, and the preferred replica one request ahead yields."""
    strict = RoutingPolicy(max_imbalance=0).validate()
    key = key_of({"prompt": SYSTEM})
    hashed = preferred(key, idle(2)).replica_id
    assert choose(key, idle(2), strict, random.Random(0)) == Decision(hashed, "affinity")
    loads = [ReplicaLoad(hashed, running=1), ReplicaLoad(1 - hashed)]
    assert choose(key, loads, strict, random.Random(0)) == Decision(1 - hashed, "balance")
