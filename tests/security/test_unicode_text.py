"""A JSON body may spell a lone UTF-16 surrogate ("\\ud800"), which Python parses into a str
no encoder takes. Wherever it sits (a prompt, a chat message, a cache_salt, a schema, an
unknown field's name), the request gets a 400 naming where, no neighbour notices, and the
server counts nothing in flight for it. Before control/api/text_check.py, a cache_salt like
that raised inside a step and ended every request in the batch, and an unknown field's name
in a streamed request left a request running unseen and `inflight` one too high for good.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fixtures.serving import asgi_client, make_engine, wait_until_idle

from control.api.text_check import lone_surrogate_at
from control.serve.settings import ServeSettings

LONE = "\ud800"
INNOCENT = {"model": "tiny", "prompt": "an innocent request about paged attention",
            "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 4}

BAD = [  # (path, body, the param the 400 names)
    ("/v1/completions", {**COMPLETION, "cache_salt": LONE}, "body.cache_salt"),
    ("/v1/completions", {**COMPLETION, "prompt": f"say {LONE}"}, "body.prompt"),
    ("/v1/completions", {**COMPLETION, "stream": True, LONE: 1}, "body (a key)"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONE}]},
     "body.messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x",
                                                    LONE: 1}]}, "body.messages.0 (a key)"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "string", "enum": [LONE]}}}},
     "body.response_format.json_schema.schema.enum.0"),
    ("/tokenize", {"model": "tiny", "prompt": LONE}, "body.prompt"),
    ("/tokenize", {"model": "tiny", "messages": [{"role": "user", "content": LONE}]},
     "body.messages.0.content"),
]


@pytest.fixture(scope="module")
def served(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(model="tiny"))
    yield engine, settings
    engine.stop()


async def _stream_chunks(client) -> str:
    reply = await client.post("/v1/completions", json=INNOCENT)
    assert reply.status_code == 200, reply.text
    return reply.text.count("data: ")


@pytest.mark.parametrize("path,body,param", BAD, ids=[b[2] for b in BAD])
def test_a_lone_surrogate_anywhere_is_a_400_and_no_neighbour_notices(served, path, body,
                                                                       param):
    engine, settings = served

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            alone = await _stream_chunks(client)
            neighbours = [asyncio.ensure_future(_stream_chunks(client)) for _ in range(3)]
            await asyncio.sleep(0.05)  # they are decoding
            raw = json.dumps(body).encode()  # ensure_ascii: the surrogate as its escape
            reply = await client.post(path, content=raw,
                                      headers={"Content-Type": "application/json"})
            chunks = [await n for n in neighbours]
            await wait_until_idle(engine)
            return reply, alone, chunks, client.app.state.serving.inflight

    reply, alone, chunks, inflight = asyncio.run(scenario())
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_text" and error["param"] == param, error
    assert "surrogate" in error["message"]
    assert chunks == [alone] * 3, "a neighbour's stream changed"
    assert inflight == 0


def test_valid_text_with_escapes_passes_untouched(served):
    engine, settings = served
    body = {**COMPLETION, "prompt": "an escaped backslash \\ud800 and a pair \ud83d\ude00"}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.post("/tokenize", content=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})

    reply = asyncio.run(scenario())
    assert reply.status_code == 200, reply.text
    assert reply.json()["count"] > 0


NOT_JSON_NUMBERS = [  # (path, raw body, the param the 400 names): Python's parser took them
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}',
     "body.temperature"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "timeout": Infinity}',
     "body.timeout"),  # a field the route ignores kept it silently
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}],'
     b' "max_tokens": 2, "logit_bias": {"5": -Infinity}}', "body.logit_bias.5"),
]


def test_nan_and_infinity_are_not_json_numbers(served):
    engine, settings = served
    words = {**COMPLETION, "prompt": "NaN, Infinity and -Infinity are words here"}

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            sent = [(p, raw) for p, raw, _ in NOT_JSON_NUMBERS]
            sent.append(("/v1/completions", json.dumps(words).encode()))
            return [await client.post(p, content=raw,
                                      headers={"Content-Type": "application/json"})
                    for p, raw in sent]

    *refused, words_reply = asyncio.run(scenario())
    for (_, _, param), reply in zip(NOT_JSON_NUMBERS, refused, strict=True):
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and error["code"] == "invalid_value", error
        assert "is not a JSON number: JSON has no NaN or Infinity" in error["message"]
    assert words_reply.status_code == 200, words_reply.text


def test_the_walk_names_the_first_bad_string_without_recursing():
    deep: object = LONE
    for _ in range(50_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert lone_surrogate_at({"a": deep}).startswith("body.a.0.0.0")
    assert lone_surrogate_at({"ok": ["é", "\U0001f600", {"k": 1.5}]}) is None
    assert lone_surrogate_at({"x": {"\udfff": 1}}) == "body.x (a key)"


def test_a_stream_whose_response_cannot_be_built_ends_its_request(served, monkeypatch):
    engine, settings = served

    def broken(*args, **kwargs):
        raise RuntimeError("building the response failed")

    monkeypatch.setattr("control.api.routes.sse_response", broken)
    before = engine.abort_counts["client_disconnect"]

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            reply = await client.post("/v1/completions", json={**INNOCENT, "max_tokens": 400})
            await wait_until_idle(engine, timeout_s=5)  # aborted, not decoding 400 tokens
            return reply, client.app.state.serving.inflight

    reply, inflight = asyncio.run(scenario())
    assert reply.status_code == 500
    assert inflight == 0
    assert engine.abort_counts["client_disconnect"] == before + 1
