"""A hostile client's request fields, on the tiny model's real app: every token id a request
carries is checked against the vocabulary (a 400 naming the field, never a 500 or a silent
acceptance), '²' is not a token id, names in any script are served and echoed safely, and
every size bound answers with the limit's name."""

from __future__ import annotations

import asyncio
import urllib.parse

import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.limits import RequestLimits
from control.api.request_limits import longest_token_chars
from control.serve.settings import ServeSettings

PROMPT = {"prompt": "x", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
ENDPOINTS = [("/v1/completions", PROMPT), ("/v1/chat/completions", CHAT)]


@pytest.fixture(scope="module")
def api(tiny_loaded):
    limits = RequestLimits(max_logit_bias=4, max_stop_chars=8, max_generated_tokens=64,
                           max_prompt_chars=2000)
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", limits=limits, metrics_tenants=("用户",)))
    yield engine, settings, tiny_loaded
    engine.stop()


def send(api, requests: list[tuple[str, dict, dict]]) -> list:
    """POST each (path, body, headers) on one client; the replies in order."""
    engine, settings, _ = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return [await client.post(path, json=body, headers=headers)
                    for path, body, headers in requests]

    return asyncio.run(scenario())


def error(reply) -> dict:
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    return reply.json()["error"]


@pytest.mark.parametrize("path,base", ENDPOINTS)
@pytest.mark.parametrize("ids", [[-1000000], [-1], [1000000000], [2**63], [0, -5]])
def test_stop_token_ids_outside_the_vocabulary_are_a_400_naming_the_field(api, path, base,
                                                                        ids):
    body = {**base, "min_tokens": 2, "stop_token_ids": ids}
    reply, = send(api, [(path, body, {})])
    assert reply.status_code == 400, reply.text
    assert error(reply)["param"] == "stop_token_ids"
    assert "stop_token_ids" in error(reply)["message"]


def test_every_token_id_field_is_checked(api):
    vocab = api[2].hf_config.vocab_size
    replies = send(api, [
        ("/v1/completions", {**PROMPT, "logit_bias": {str(vocab): 1}}, {}),
        ("/v1/completions", {**PROMPT, "logit_bias": {"²": 1}}, {}),
        ("/v1/completions", {**PROMPT, "logit_bias": {"1" * 30: 1}}, {}),
        ("/v1/completions", {**PROMPT, "prompt": [1, vocab]}, {}),
        ("/v1/completions", {**PROMPT, "prompt": [-1]}, {}),
        ("/detokenize", {"tokens": [vocab + 10]}, {}),
        ("/detokenize", {"tokens": [-(2**40)]}, {}),
    ])
    params = [error(r)["param"] for r in replies]
    assert params == ["logit_bias"] * 3 + ["prompt"] * 2 + ["tokens"] * 2
    assert all(r.status_code == 400 for r in replies)
    ok, = send(api, [("/v1/completions", {**PROMPT, "stop_token_ids": [vocab - 1],
                                          "logit_bias": {"0": 1}}, {})])
    assert ok.status_code == 200, ok.text


LOOSE = [  # (field, value): each was read as something else, as OpenAI's API never does
    ("max_tokens", "4"), ("max_tokens", True), ("max_tokens", 4.0), ("n", "1"),
    ("stream", "yes"), ("stream", 1), ("ignore_eos", "false"), ("seed", "7"),
    ("priority", True),
]


@pytest.mark.parametrize("path,base", ENDPOINTS)
def test_a_value_of_the_wrong_type_is_a_400_not_a_guess(api, path, base):
    replies = send(api, [(path, {**base, field: value}, {}) for field, value in LOOSE])
    for (field, value), reply in zip(LOOSE, replies, strict=True):
        assert reply.status_code == 400, (field, value, reply.text)
        assert error(reply)["param"] == field, (field, value, reply.text)
    if "messages" in base:  # null content: only an assistant's message may have none
        empty, = send(api, [(path, {**base, "messages": [{"role": "user", "content": None}]},
                             {})])
        assert error(empty)["param"] == "messages" and "needs content" in empty.text
        image, = send(api, [(path, {**base, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]}, {})])
        assert error(image)["param"] == "messages", image.text
        assert ("part 1 is of type 'image_url': this server serves a text-only model"
                in error(image)["message"]), image.text
    twice, = send(api, [(path, {**base, "logit_bias": {"5": 1, "005": -1}}, {})])
    assert error(twice)["param"] == "logit_bias" and "both name token 5" in twice.text
    completion_only = send(api, [("/v1/completions", {**PROMPT, "logprobs": True}, {})])[0]
    assert completion_only.status_code == 400  # an int there: true was taken as 1
    fine, = send(api, [(path, {**base, "temperature": 0, "top_p": 1}, {})])  # ints as floats
    assert fine.status_code == 200, fine.text


def test_detokenize_takes_no_more_ids_than_a_sequence_holds(api):
    # the tokenizer thread is every request's: a million ids held it ~0.3 s a call
    ok, over, huge = send(api, [("/detokenize", {"tokens": [5] * 64}, {}),
                                ("/detokenize", {"tokens": [5] * 100_000}, {}),
                                ("/detokenize", {"tokens": [5] * 200_000}, {})])
    assert ok.status_code == 200, ok.text
    for reply in (over, huge):
        assert reply.status_code == 400 and error(reply)["param"] == "tokens", reply.text
    assert "max_model_len" in error(over)["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,base", ENDPOINTS)
def test_a_user_in_any_script_is_served_and_echoed(api, path, base, stream):
    replies = send(api, [(path, {**base, "user": "用户", "stream": stream}, {}),
                         (path, {**base, "user": "José", "stream": stream}, {})])
    for reply, name in zip(replies, ("用户", "José"), strict=True):
        assert reply.status_code == 200, reply.text
        assert urllib.parse.unquote(reply.headers["x-batchpilot-tenant"]) == name


def test_a_utf8_tenant_header_is_the_tenant_everywhere(tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, settings=ServeSettings(
        model="tiny", metrics_tenants=("租户-α",), trace_db=str(tmp_path / "t.duckdb")))
    raw = "租户-α".encode()  # a gateway's UTF-8 bytes (the ASGI server decodes Latin-1)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            client.app.state.serving.trace.start()
            reply = await client.post("/v1/completions", json=PROMPT,
                                      headers={"X-Tenant": raw})
            metrics = (await client.get("/metrics")).text
            request_id = reply.json()["id"]
            timeline = await client.get(f"/v1/trace/requests/{request_id}")
            return reply, metrics, timeline

    reply, metrics, timeline = asyncio.run(scenario())
    assert reply.status_code == 200, reply.text
    assert urllib.parse.unquote(reply.headers["x-batchpilot-tenant"]) == "租户-α"
    assert reply.json()["batchpilot"]["tenant"] == "租户-α"
    assert 'tenant="租户-α"' in metrics
    assert "租户-α" in timeline.text, timeline.text


def test_a_control_character_in_a_tenant_is_a_400(api):
    reply, = send(api, [("/v1/completions", PROMPT, {"X-Tenant": "a\x7fb"})])
    assert error(reply)["param"] == "X-Tenant"


@pytest.mark.parametrize("headers,body,param", [
    ({"X-Tenant": "t" * 129}, {}, "X-Tenant"), ({"X-Lane": "l" * 129}, {}, "X-Lane"),
    ({}, {"user": "u" * 129}, "user")], ids=["X-Tenant", "X-Lane", "user"])
def test_a_name_over_128_characters_is_a_400(api, headers, body, param):
    """A tenant names metric labels, trace rows and a prefix-cache root: 128 at most, as
    a config may name one (engine/config/schema.py MAX_NAME_CHARS); 128 is served."""
    reply, at_limit = send(api, [("/v1/completions", {**PROMPT, **body}, headers),
                                 ("/v1/completions", PROMPT, {"X-Tenant": "t" * 128})])
    assert reply.status_code == 400 and error(reply)["param"] == param, reply.text
    assert at_limit.status_code == 200, at_limit.text


def test_each_size_limit_names_itself(api):
    replies = send(api, [
        ("/v1/completions", {**PROMPT, "logit_bias": {str(i): 1 for i in range(5)}}, {}),
        ("/v1/completions", {**PROMPT, "stop": ["123456789"]}, {}),
        ("/v1/completions", {**PROMPT, "n": 2, "max_tokens": 33}, {}),
        ("/v1/completions", {**PROMPT, "prompt": "word " * 500}, {}),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user",
                                                        "content": "w" * 2001}]}, {}),
        ("/v1/completions", {**PROMPT, "stop_token_ids": list(range(300))}, {}),
    ])
    messages = [error(r)["message"] for r in replies]
    for message, limit in zip(messages, ("max_logit_bias", "max_stop_chars",
                                         "max_generated_tokens", "max_prompt_chars",
                                         "max_prompt_chars"), strict=False):
        assert limit in message, message
    assert error(replies[5])["param"] == "stop_token_ids"
    assert [r.status_code for r in replies] == [400] * 6


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {**PROMPT, "logit_bias": {str(i): 1 for i in range(4)}}),
    ("/v1/completions", {**PROMPT, "stop": ["12345678"] * 16}),  # 16 strings of 8
    ("/v1/completions", {**PROMPT, "n": 2, "max_tokens": 32}),  # 2 x 32 = 64
    ("/v1/completions", {**PROMPT, "max_tokens": 65}),  # one choice: the context bounds it
    ("/tokenize", {"prompt": "w" * 2000}),  # (2,000 tokens: over the context to generate)
    ("/tokenize", {"messages": [{"role": "user", "content": "w" * 2000}]}),
    ("/tokenize", {"messages": [{"role": "user", "content": ""}] * 2048}),
])
def test_a_request_at_exactly_each_limit_is_served(api, path, body):
    """Each limit is the most a request may ask for, not the first value refused: a
    client sized to `--limit` (or the documented default) is served."""
    reply, = send(api, [(path, body, {})])
    assert reply.status_code == 200, reply.text


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)  # the derived character limit
    max_len = engine.parts.static.max_model_len
    over = max_len * longest_token_chars(engine.parts.frontend_tokenizer) + 1

    async def scenario():
        async with asgi_client(engine, settings) as client:
            state = client.app.state.serving

            async def no_tokenizer(*args):
                raise AssertionError("the prompt reached the tokenizer")

            state.run_tokenizer = no_tokenizer
            text = await client.post("/v1/completions", json={
                **PROMPT, "prompt": "a" * over})
            ids = await client.post("/v1/completions", json={
                **PROMPT, "prompt": [1] * (max_len + 1)})
            return text, ids

    text, ids = asyncio.run(scenario())
    assert text.status_code == 400 and error(text)["code"] == "context_length_exceeded"
    assert "max_model_len" in error(text)["message"]
    assert ids.status_code == 400 and error(ids)["param"] == "prompt"


def test_sampling_values_that_would_overflow_the_logits_are_refused_or_greedy(api):
    replies = send(api, [
        ("/v1/completions", {**PROMPT, "repetition_penalty": 5e-324, "top_k": 2}, {}),
        ("/v1/completions", {**PROMPT, "repetition_penalty": 1e300}, {}),
        ("/v1/completions", {**PROMPT, "temperature": 5e-324, "top_k": 2}, {}),
        ("/v1/completions", {**PROMPT, "temperature": 0, "top_k": 2}, {}),
    ])
    assert [r.status_code for r in replies] == [400, 400, 200, 200], [r.text for r in replies]
    assert error(replies[0])["param"] == "repetition_penalty"
    assert replies[2].json()["choices"][0]["text"] == replies[3].json()["choices"][0]["text"]


def test_many_messages_and_long_tokenize_prompts_are_refused_before_the_template(api):
    many = [{"role": "user", "content": "x"}] * 2049
    replies = send(api, [
        ("/v1/chat/completions", {**CHAT, "messages": many}, {}),
        ("/tokenize", {"messages": many}, {}),
        ("/tokenize", {"prompt": "b" * 2001}, {}),
        ("/tokenize", {"prompt": "b" * 20}, {}),
    ])
    assert [r.status_code for r in replies] == [400, 400, 400, 200], [r.text for r in replies]
    assert "max_messages" in error(replies[0])["message"]
    assert "max_prompt_chars" in error(replies[2])["message"]


def test_a_list_that_fits_no_shape_is_refused_with_one_error(api):
    """A union of list types reports an error per item of each member it tries: a 130k-id
    prompt with one string in it was 260,000 errors built on the event loop."""
    replies = send(api, [
        ("/v1/completions", {**PROMPT, "prompt": [1] * 130_000 + ["x"]}, {}),
        ("/v1/completions", {**PROMPT, "stop": [1] * 10_000}, {}),
        ("/v1/completions", {**PROMPT, "prompt": [1] * (1 << 17 + 1)}, {}),
    ])
    assert [r.status_code for r in replies] == [400, 400, 400], [r.text for r in replies]
    assert [error(r)["param"] for r in replies] == ["prompt", "stop", "prompt"]
    assert all(len(r.content) < 2000 for r in replies)  # one error, not one per item
