"""Issue 17.1 over HTTP: a tenant cannot see (num_cached_tokens) whether another tenant sent
a prompt; `cache_salt` in a body names a shared cache domain and is validated."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.serving import asgi_client

from control.api.response_schemas import CompletionResponse, ErrorResponse

# Long enough for several full 16-token blocks of the tiny model's tokenizer.
PROMPT = ("Each block of the key value cache holds sixteen tokens of one sequence; when the"
          " cache is almost full the scheduler preempts the request that arrived last. ") * 2
CHAT = {"messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": "Hi"}]}
SALT = "d5c0b1e8a7f94c2b9e61a3f0"


def _post(api, path: str, body: dict, tenant: str | None = None):
    engine, settings = api
    headers = {"X-Tenant": tenant} if tenant else {}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.post(path, json=body, headers=headers)

    return asyncio.run(scenario())


def _cached(api, path: str, tenant: str, **extra) -> int:
    body = {"max_tokens": 2, "temperature": 0, **extra}
    body.update({"prompt": PROMPT} if path == "/v1/completions" else CHAT)
    resp = _post(api, path, body, tenant)
    assert resp.status_code == 200, resp.text
    return resp.json()["batchpilot"]["num_cached_tokens"]


def test_another_tenant_sees_no_cached_tokens_while_the_owner_does(api):
    path = "/v1/completions"
    assert _cached(api, path, "alice") == 0
    assert _cached(api, path, "mallory") == 0  # no signal that alice sent it
    repeat = _cached(api, path, "alice")
    assert repeat >= 32  # alice's own repeat hits its full blocks
    assert _cached(api, path, "mallory") == repeat  # mallory's own repeat hits its blocks
    assert _cached(api, path, "trent") == 0  # and a third tenant sees neither


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_the_same_cache_salt_shares_across_tenants(api, path):
    salt = f"{SALT}-{path}"
    assert _cached(api, path, "carol", cache_salt=salt) == 0
    shared = _cached(api, path, "dave", cache_salt=salt)
    assert shared >= 32
    assert _cached(api, path, "erin", cache_salt=salt + "-other") == 0
    body = CompletionResponse.model_validate(_post(api, "/v1/completions", {
        "prompt": "Hi", "max_tokens": 1, "cache_salt": salt}).json())
    assert body.batchpilot.finish_reason == "length"


@pytest.mark.parametrize(("path", "salt", "needle"), [
    ("/v1/completions", "", "non-empty string of at most 256 characters, got 0"),
    ("/v1/completions", "s" * 257, "got 257 characters"),
    ("/v1/chat/completions", "", "non-empty string"),
    ("/v1/chat/completions", 12345, "valid string"),
    ("/v1/completions", ["a"], "valid string"),
])
def test_a_bad_cache_salt_is_400(api, path, salt, needle):
    body = {"prompt": "Hi"} if path == "/v1/completions" else dict(CHAT)
    resp = _post(api, path, {**body, "cache_salt": salt})
    assert resp.status_code == 400, resp.text
    error = ErrorResponse.model_validate(resp.json()).error
    assert needle in error.message and "cache_salt" in error.message, error.message
    assert error.param == "cache_salt"
