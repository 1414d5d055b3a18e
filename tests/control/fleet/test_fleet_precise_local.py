"""Precise routing on a live 2-replica fleet of the tiny model (no Ray: control/fleet/
local.py, the same replica and ingress code): the ingress hashes each request as its
replica does, follows every replica's KV events, and sends a request where its prompt's
blocks already are, where affinity's hash of the first 256 characters would guess."""

from __future__ import annotations

import time

import httpx
import pytest
from fixtures.local_fleet import LocalFleet

from control.fleet.router import affinity_key, preferred, prompt_prefix
from control.trace import format_request

TENANT = httpx.Headers({"X-Tenant": "acme"})  # case-insensitive, as the ingress sees them
# 240 shared characters (several full blocks of 16 tokens), then a question
# that differs within the first 256: affinity keys differ, the cached prefix is the same
SHARED = ("You are the support agent of ACME routers; answer from the manual, cite the"
          " section, never guess, and keep every answer under fifty words. Our products"
          " are the R100 home router, the R500 office router and the R900 core switch. ")
assert 200 < len(SHARED) < 256


@pytest.fixture(scope="module")
def fleet(tiny_llama_dir, tmp_path_factory):
    with LocalFleet(tiny_llama_dir, tmp_path_factory.mktemp("precise"),
                    routing="precise") as running:
        yield running


def post(client: httpx.Client, fleet: LocalFleet, path: str, body: dict,
         headers: dict | None = None) -> httpx.Response:
    reply = client.post(f"{fleet.url}{path}", json={"max_tokens": 2,
                                                     "temperature": 0, **body},
                        headers=headers or TENANT)
    assert reply.status_code == 200, reply.text
    return reply


def readiness(client: httpx.Client, fleet: LocalFleet) -> dict:
    return client.get(f"{fleet.url}/readyz").json()


def wait_indexed(client: httpx.Client, fleet: LocalFleet, replica: int, keys: list[int],
                 ) -> None:
    """Until the ingress's index shows `replica` holding every one of `keys` (its events
    arrive a poll after the request that stored them)."""
    deadline = time.monotonic() + 10
    while fleet.ingress.kv_index.matched(replica, keys) < len(keys):
        assert time.monotonic() < deadline, readiness(client, fleet)["kv_index"]
        time.sleep(0.05)


def prompt_keys(fleet: LocalFleet, path: str, body: dict) -> list[int]:
    index = fleet.ingress.kv_index
    return fleet.ingress.prefix.keys(path, body, TENANT, index.block_size, index.sharing)


def matched_total(client: httpx.Client, fleet: LocalFleet) -> dict[str, float]:
    text = client.get(f"{fleet.url}/metrics").text
    return {line.split('replica="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("batchpilot_fleet_routed_matched_blocks_total{")}


def test_requests_sharing_a_prefix_follow_its_blocks(fleet):
    with httpx.Client(timeout=60) as client:
        first = post(client, fleet, "/v1/completions", {"prompt": SHARED + "Q0: reset?"})
        home = int(first.headers["x-batchpilot-replica"])
        index = fleet.ingress.kv_index
        keys = fleet.ingress.prefix.keys("/v1/completions", {"prompt": SHARED + "Q0: reset?"},
                                         TENANT, index.block_size, index.sharing)
        assert len(keys) >= 4
        wait_indexed(client, fleet, home, keys)
        replicas = set()
        for i in range(1, 9):
            reply = post(client, fleet, "/v1/completions",
                         {"prompt": SHARED + f"Q{i}: what about firmware {i}?"})
            replicas.add(int(reply.headers["x-batchpilot-replica"]))
        decisions = readiness(client, fleet)["decisions"]
    # every follower went where the shared blocks were, each by a precise decision
    assert replicas == {home}, (replicas, home)
    assert decisions.get("precise", 0) >= 8, decisions
    # what affinity would have done: the 8 prompts' 256-character keys are not all one
    policy = fleet.ingress.policy
    picks = {preferred(affinity_key(prompt_prefix(
        {"prompt": SHARED + f"Q{i}: what about firmware {i}?"}, policy), "acme", None, policy),
        fleet.ingress.table.snapshot()).replica_id for i in range(1, 9)}
    assert len(picks) == 2, "the test's prompts should split under affinity"


def test_an_idle_fleet_long_polls_the_events_and_hears_a_new_block_at_once(fleet):
    """Idle, the ingress reads each replica's KV events about once per kv_index.WAIT_S (a
    read every POLL_S before: ~25 in this window); a request's blocks still reach the
    index within a fraction of a second, the seal waking the read that waits."""
    reads = [0] * len(fleet.replicas)

    def counting(i, method):
        async def kv_events(*args, **kwargs):
            reads[i] += 1
            return await method(*args, **kwargs)
        return kv_events

    for i, replica in enumerate(fleet.replicas):
        replica.kv_events = counting(i, replica.kv_events)
    try:
        time.sleep(2.5)
        assert max(reads) <= 3, reads
        body = {"prompt": SHARED + "Q: is the R900 stackable?"}
        with httpx.Client(timeout=60) as client:
            reply = post(client, fleet, "/v1/completions", body)
            done = time.monotonic()
            home = int(reply.headers["x-batchpilot-replica"])
            wait_indexed(client, fleet, home, prompt_keys(fleet, "/v1/completions", body))
        assert time.monotonic() - done < 1.0
    finally:
        for replica in fleet.replicas:
            del replica.kv_events


def test_the_ingress_hashes_a_chat_request_exactly_as_its_replica(fleet):
    body = {"messages": [{"role": "system", "content": SHARED},
                         {"role": "user", "content": "Which router fits a small office?"}]}
    with httpx.Client(timeout=60) as client:
        first = post(client, fleet, "/v1/chat/completions", body)
        home = first.headers["x-batchpilot-replica"]
        index = fleet.ingress.kv_index
        keys = fleet.ingress.prefix.keys("/v1/chat/completions", body, TENANT,
                                         index.block_size, index.sharing)
        assert len(keys) >= 4
        wait_indexed(client, fleet, int(home), keys)
        before = matched_total(client, fleet)
        again = post(client, fleet, "/v1/chat/completions", body)
        after = matched_total(client, fleet)
    assert again.headers["x-batchpilot-replica"] == home
    # every one of the request's blocks was found where its replica had put them: the
    # ingress computed the replica's own keys (template, tokenizer, tenant, secret key)
    assert after[home] - before.get(home, 0.0) == len(keys)
    assert index.matched(int(home), keys) == len(keys)
    # another tenant's identical request holds none of them (its own cache domain)
    other = fleet.ingress.prefix.keys("/v1/chat/completions", body,
                                      httpx.Headers({"X-Tenant": "zeta"}),
                                      index.block_size, index.sharing)
    assert index.matched(int(home), other) == 0


def test_bad_bodies_have_no_keys_and_get_the_replicas_own_400(fleet):
    prefix = fleet.ingress.prefix
    assert prefix.keys("/v1/chat/completions", {"messages": "nope"}, TENANT, 16, "tenant") == []
    assert prefix.keys("/v1/completions", {"prompt": SHARED}, {"x-tenant": "\x01"}, 16,
                       "tenant") == []
    with httpx.Client(timeout=60) as client:
        reply = client.post(f"{fleet.url}/v1/chat/completions", headers=TENANT,
                            json={"messages": "nope"})
        assert reply.status_code == 400 and "messages" in reply.text
        # a token id past int64, which the ingress cannot hash: the replica's 400, not a 500
        ids = client.post(f"{fleet.url}/v1/completions", headers=TENANT,
                          json={"prompt": [2**70] * 40, "max_tokens": 1})
        assert ids.status_code == 400 and "token ids" in ids.text, ids.text
        # a ~1 MB prompt: the ingress tokenizes only its first MAX_CHARS characters, and
        # the replica refuses it as too long for the model, in its own words
        huge = client.post(f"{fleet.url}/v1/completions", headers=TENANT,
                           json={"prompt": "router " * 140_000, "max_tokens": 1})
        assert huge.status_code == 400, huge.text
        assert huge.json()["error"]["code"] in ("prompt_too_long", "context_length_exceeded",
                                                "invalid_value"), huge.text
        post(client, fleet, "/v1/completions", {"prompt": "still serving"})


def timeline(client: httpx.Client, fleet: LocalFleet, request_id: str) -> dict:
    """The request's timeline through the ingress's trace read API, once its record is in."""
    deadline = time.monotonic() + 10
    while True:
        reply = client.get(f"{fleet.url}/v1/trace/requests/{request_id}")
        if reply.status_code == 200 and reply.json()["request"] is not None:
            return reply.json()
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.1)


def test_each_replicas_trace_says_why_the_ingress_sent_it_there(fleet):
    shared = SHARED.replace("ACME", "Globex")  # blocks no other test has put anywhere
    with httpx.Client(timeout=60) as client:
        first = post(client, fleet, "/v1/completions", {"prompt": shared + "Q0: reset?"})
        home = int(first.headers["x-batchpilot-replica"])
        wait_indexed(client, fleet, home, prompt_keys(fleet, "/v1/completions",
                                                      {"prompt": shared + "Q0: reset?"}))
        # a client's own routing header is dropped at the ingress: it cannot write the
        # trace's story of where its request went
        follower = post(client, fleet, "/v1/completions", {"prompt": shared + "Q1: WPA3?"},
                        headers={**TENANT, "X-Batchpilot-Routed": "reason=random; blocks=99"})
        told = [timeline(client, fleet, reply.json()["id"]) for reply in (first, follower)]
    rows = [tl["request"] for tl in told]
    assert rows[0]["routing_reason"] == "affinity"  # nobody held the new prefix
    assert rows[0]["routing_matched_blocks"] == 0
    assert rows[1]["routing_reason"] == "precise"
    assert 4 <= rows[1]["routing_matched_blocks"] < 99
    assert told[1]["replica"] == str(home)
    text = format_request.request(told[1])
    assert (f"routed to replica {home} by the fleet ingress:"
            f" {format_request.ROUTING_WORDS['precise']}; it held"
            f" {rows[1]['routing_matched_blocks']} leading blocks of the prompt") in text
