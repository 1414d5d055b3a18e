"""The sampling fields through the HTTP API on the tiny model: each one has its effect on
/v1/completions and /v1/chat/completions, a bad value is a 400 naming the field, a field
outside the OpenAI and vLLM shapes is ignored with a warning naming it, and a field this
server does not implement is a 400 naming it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.response_schemas import ErrorResponse

CHAT = {"messages": [{"role": "user", "content": "Tell me about the scheduler"}]}
PROMPT = {"prompt": "The scheduler picks the running decodes"}
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 8}


@pytest.fixture(scope="module")
def api(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    yield engine, settings, tiny_loaded.tokenizer
    engine.stop()


def post(api, path: str, body: dict):
    engine, settings, _ = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            return await client.post(path, json=body)

    return asyncio.run(scenario())


def generate(api, path: str, body: dict) -> tuple[str, int, str]:
    """(text, completion tokens, finish reason) of a 200."""
    resp = post(api, path, body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return text, data["usage"]["completion_tokens"], choice["finish_reason"]


ENDPOINTS = [("/v1/completions", PROMPT), ("/v1/chat/completions", CHAT)]


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_logit_bias_and_min_tokens_steer_greedy_decoding(api, path, base):
    tokenizer = api[2]
    token = tokenizer.encode(" the", add_special_tokens=False)[0]
    text, n, _ = generate(api, path, {**base, **GREEDY, "max_tokens": 4,
                                      "logit_bias": {str(token): 100}})
    assert (text, n) == (tokenizer.decode([token] * 4), 4)
    eos = tokenizer.eos_token_id
    favour_eos = {**base, "temperature": 0, "max_tokens": 6, "logit_bias": {str(eos): 100}}
    assert generate(api, path, favour_eos)[1:] == (1, "stop")  # EOS at once
    assert generate(api, path, {**favour_eos, "min_tokens": 3})[1:] == (4, "stop")
    # ignore_eos (vLLM's): an EOS sampled does not end it, max_tokens does
    assert generate(api, path, {**favour_eos, "ignore_eos": True})[1:] == (6, "length")


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize("field", [{"frequency_penalty": 2.0}, {"repetition_penalty": 50.0}])
def test_penalties_change_the_greedy_output(api, path, base, field):
    plain = generate(api, path, {**base, **GREEDY, "max_tokens": 16})[0]
    penalized = generate(api, path, {**base, **GREEDY, "max_tokens": 16, **field})[0]
    assert penalized != plain


FIELDS = {"presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
          "logit_bias": {"5": 2.5}, "min_p": 0.1, "min_tokens": 2}


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_every_field_reaches_the_engine(api, path, base):
    """The engine's SamplingParams carry each field (the effects: test_sampler_penalties)."""
    executor = api[0].parts.engine.executor
    seen = []
    inner = executor.execute

    def recording(out):
        seen.extend(r.sampling_params for r in out.decodes)
        return inner(out)

    executor.execute = recording
    try:
        generate(api, path, {**base, **GREEDY, **FIELDS})
    finally:
        del executor.execute  # the class's method again
    assert seen, "no decode step ran"
    params = seen[0]
    assert {name: getattr(params, name) for name in FIELDS} == {
        **FIELDS, "logit_bias": ((5, 2.5),)}


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_min_p_one_keeps_only_the_top_token(api, path, base):
    greedy = generate(api, path, {**base, **GREEDY})[0]
    sampled = {**base, **GREEDY, "temperature": 1.5, "seed": 3}
    assert generate(api, path, {**sampled, "min_p": 1.0})[0] == greedy


def test_without_min_p_that_seed_samples_another_text(api):
    """The control for the test above (the chat prompt is too peaked to show it)."""
    sampled = {**PROMPT, **GREEDY, "temperature": 1.5, "seed": 3}
    assert generate(api, "/v1/completions", sampled)[0] != generate(
        api, "/v1/completions", {**PROMPT, **GREEDY})[0]


def test_top_k_minus_one_is_off_as_in_vllm(api):
    """vLLM's clients send top_k -1 for "no top-k" (and 0 means the same here): it samples
    exactly as 0 does with the same seed, never a 400."""
    sampled = {**PROMPT, **GREEDY, "temperature": 1.5, "seed": 3}
    assert generate(api, "/v1/completions", {**sampled, "top_k": -1}) == generate(
        api, "/v1/completions", {**sampled, "top_k": 0})


def test_max_completion_tokens_is_max_tokens(api):
    assert generate(api, "/v1/chat/completions", {
        **CHAT, "ignore_eos": True, "max_completion_tokens": 3})[1] == 3
    assert generate(api, "/v1/chat/completions", {
        **CHAT, "ignore_eos": True, "max_completion_tokens": 3, "max_tokens": 3})[1] == 3


def error_of(resp) -> dict:
    assert resp.status_code == 400, resp.text
    assert "Traceback" not in resp.text
    return ErrorResponse.model_validate(resp.json()).error.model_dump()


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(("field", "param"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.2}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
])
def test_bad_values_are_400_naming_the_field(api, path, base, field, param):
    error = error_of(post(api, path, {**base, **field}))
    assert param in error["message"]
    assert error["param"] == param


def test_max_completion_tokens_and_max_tokens_must_agree(api):
    error = error_of(post(api, "/v1/chat/completions",
                          {**CHAT, "max_completion_tokens": 3, "max_tokens": 4}))
    assert "max_completion_tokens=3" in error["message"]


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_a_field_outside_the_shapes_is_ignored_with_a_warning(api, path, base, caplog):
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        text = generate(api, path, {**base, **GREEDY, "frobnicate": 1,
                                    "metadata": {"user": "a"}})[0]
    assert text == generate(api, path, {**base, **GREEDY})[0]
    warned = [r.getMessage() for r in caplog.records if "frobnicate" in r.getMessage()]
    assert len(warned) == 1 and "metadata" in warned[0]


@pytest.mark.parametrize(("path", "base", "field"), [
    ("/v1/completions", PROMPT, {"best_of": 3}),
    ("/v1/completions", PROMPT, {"guided_regex": "[a-z]+"}),
    ("/v1/chat/completions", CHAT, {"echo": True}),
    ("/v1/chat/completions", CHAT, {"tools": [{"type": "function"}]}),
    ("/v1/chat/completions", CHAT, {"tool_choice": "auto"}),
    # the answer would not be stored where OpenAI's dashboards find it
    ("/v1/chat/completions", CHAT, {"store": True}),
])
def test_an_unimplemented_field_is_400_naming_it(api, path, base, field):
    (name, _), = field.items()
    error = error_of(post(api, path, {**base, **field}))
    assert name in error["message"] and error["param"] == name, error


@pytest.mark.parametrize(("path", "base", "field"), [
    ("/v1/completions", PROMPT, {"n": 1, "logprobs": None, "echo": False}),
    ("/v1/chat/completions", CHAT, {"n": 1, "logprobs": False, "tool_choice": "none",
                                    "store": False, "response_format": {"type": "text"}}),
])
def test_unimplemented_fields_at_their_off_values_are_accepted(api, path, base, field):
    assert generate(api, path, {**base, **GREEDY, **field})[1] == GREEDY["max_tokens"]


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_seed_range_is_exactly_a_signed_64_bit_int(api, path, base):
    body = {**base, "temperature": 1.0, "max_tokens": 2}
    assert post(api, path, {**body, "seed": 2**63 - 1}).status_code == 200
    assert post(api, path, {**body, "seed": 0}).status_code == 200
    for seed in (2**63, -1):
        assert error_of(post(api, path, {**body, "seed": seed}))["param"] == "seed"
