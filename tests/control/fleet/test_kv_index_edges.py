"""The ingress's KV index (control/fleet/kv_index.py) and prefix keys
(control/fleet/prefix_keys.py) where test_kv_index.py and test_prefix_keys.py do not look:
prefix caching off, a follower that outlives a replica's failure, one whose slot is off,
one of a replica without events; each tenant's and cache salt's own keys (one tenant's
cache is never credited to another), a cut prompt, the last token's block, a prompt in a
list, and add_special_tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from control.fleet.kv_index import KVIndex, follow_forever
from control.fleet.prefix_keys import RequestKeys

HEAD = {"enabled": True, "block_size": 16, "sharing": "tenant", "prefix_caching": True}
SNAPSHOT = {**HEAD, "epoch": "a", "seq": 1, "snapshot": [1, 2]}


def test_a_replica_with_prefix_caching_off_turns_the_index_off():
    index = KVIndex(1)
    index.apply(0, {**SNAPSHOT, "prefix_caching": False, "dropped": 3})
    assert not index.enabled
    assert index.families_data()[0]["dropped"] == 3


def follow(index: KVIndex, fetch, until=None, active=None, timeout_s: float = 2.0) -> None:
    """Run one replica's follower until `until()` holds (None: for `timeout_s`), then
    cancel it."""

    async def run() -> None:
        task = asyncio.create_task(follow_forever(index, 0, fetch, poll_s=0.001,
                                                  timeout_s=1.0, active=active, wait_s=0.0))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not (until is not None and until()) and not task.done():
            if asyncio.get_running_loop().time() >= deadline:
                assert until is None, "the follower did not get there"
                break
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


def test_a_follower_outlives_a_replica_that_failed_a_read():
    """A replica restarting answers an error once; its follower reads it again after."""
    index, calls = KVIndex(1), []

    async def fetch(epoch, seq, wait_s):
        calls.append(epoch)
        if len(calls) == 1:
            raise RuntimeError("replica actor died")
        return SNAPSHOT

    follow(index, fetch, lambda: index.cursor(0) == ("a", 1))
    assert index.matched(0, [1, 2]) == 2


def test_a_replica_whose_slot_is_off_is_not_read_until_it_is_on():
    index, calls, on = KVIndex(1), [], []

    async def fetch(epoch, seq, wait_s):
        calls.append(epoch)
        return SNAPSHOT

    follow(index, fetch, active=lambda: bool(on), timeout_s=0.05)
    assert calls == []
    on.append(True)
    follow(index, fetch, lambda: bool(calls), active=lambda: bool(on))
    assert index.cursor(0) == ("a", 1)


def test_a_replica_without_events_is_followed_no_more():
    index, calls = KVIndex(1), []

    async def fetch(epoch, seq, wait_s):
        calls.append(epoch)
        return {"enabled": False}

    async def run() -> None:
        await asyncio.wait_for(follow_forever(index, 0, fetch, poll_s=0.001, wait_s=0.0), 2.0)

    asyncio.run(run())  # it returns by itself
    assert calls == [None]


# ---- prefix keys ---------------------------------------------------------------------------

BLOCK = 4


class Tokenizer:
    """One token per character, a BOS token (1) when asked for special tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * add_special_tokens + [ord(c) for c in text]

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)


@pytest.fixture
def request_keys() -> Iterator[RequestKeys]:
    made = RequestKeys(Tokenizer(), b"k" * 32)
    yield made
    made.close()


def keys_of(made: RequestKeys, body: dict, headers: dict | None = None,
            sharing: str = "tenant", path: str = "/v1/completions") -> list[int]:
    return made.keys(path, body, headers or {}, BLOCK, sharing)


PROMPT = {"prompt": "the same long system prompt, word for word"}


def test_each_tenant_has_its_own_keys_and_the_same_tenant_the_same(request_keys):
    """A trust boundary: a prefix tenant A cached must never be credited to tenant B (the
    router would send B where A's cache is, and B's replica would hash it apart anyway)."""
    a = keys_of(request_keys, PROMPT, {"x-tenant": "a"})
    assert a and a == keys_of(request_keys, PROMPT, {"x-tenant": "a"})
    b = keys_of(request_keys, PROMPT, {"x-tenant": "b"})
    assert len(b) == len(a) and not set(a) & set(b)
    alice = keys_of(request_keys, {**PROMPT, "user": "alice"})
    bob = keys_of(request_keys, {**PROMPT, "user": "bob"})
    assert not set(alice) & set(bob)  # the body's user is the tenant without an X-Tenant
    assert alice == keys_of(request_keys, PROMPT, {"x-tenant": "alice"})


def test_a_cache_salt_is_a_domain_of_its_own(request_keys):
    plain = keys_of(request_keys, PROMPT, {"x-tenant": "a"})
    salted = keys_of(request_keys, {**PROMPT, "cache_salt": "s1"}, {"x-tenant": "a"})
    other = keys_of(request_keys, {**PROMPT, "cache_salt": "s2"}, {"x-tenant": "a"})
    assert salted and not set(salted) & set(plain) and not set(salted) & set(other)


def test_a_prompt_cut_at_max_chars_drops_the_block_the_cut_may_split():
    whole, cut = RequestKeys(Tokenizer(), b"k" * 32), RequestKeys(Tokenizer(), b"k" * 32, 40)
    try:
        body = {"prompt": "x" * 100, "add_special_tokens": False}
        full = keys_of(whole, body)
        assert keys_of(cut, body) == full[:(40 - BLOCK - 1) // BLOCK]
    finally:
        whole.close()
        cut.close()


def test_the_block_of_the_last_prompt_token_has_no_key(request_keys):
    """The replica caches full blocks before a prompt's last token (that token is run to
    sample the first output): 16 tokens are 3 blocks of 4 to look up, not 4."""
    assert len(keys_of(request_keys, {"prompt": [5] * 16})) == 3
    assert len(keys_of(request_keys, {"prompt": [5] * 17})) == 4


def test_one_prompt_in_a_list_is_the_same_request(request_keys):
    text = "a prompt sent as a list of one"
    assert keys_of(request_keys, {"prompt": [text]}) == keys_of(request_keys, {"prompt": text})
    assert keys_of(request_keys, {"prompt": [[7] * 9]}) == keys_of(request_keys,
                                                                    {"prompt": [7] * 9})
    assert keys_of(request_keys, {"prompt": [text]})


def test_add_special_tokens_is_the_bodys(request_keys):
    text = "x" * 20
    ids = [ord(c) for c in text]
    assert keys_of(request_keys, {"prompt": text, "add_special_tokens": False}) == keys_of(
        request_keys, {"prompt": ids})
    assert keys_of(request_keys, {"prompt": text}) == keys_of(request_keys,
                                                              {"prompt": [1, *ids]})
