"""A key inside stream_options that is outside its shape (a typo such as include_usge) is
treated like an unknown top-level field: ignored, named as stream_options.<key> in the
server log (and in the answer: test_ignored_fields.py), the request still served, the keys
it does declare still honoured."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fixtures.serving import asgi_client

from control.api.schemas import ChatCompletionRequest, CompletionRequest

CHAT = {"messages": [{"role": "user", "content": "Tell me about the scheduler"}]}
PROMPT = {"prompt": "The scheduler picks the running decodes"}
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 4}
ENDPOINTS = [("/v1/completions", PROMPT), ("/v1/chat/completions", CHAT)]


def warnings_naming(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "batchpilot.http" and r.levelno == logging.WARNING
            and text in r.getMessage()]


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_a_misspelt_stream_options_key_parses_with_a_warning_naming_it(model, caplog):
    base = PROMPT if model is CompletionRequest else CHAT
    body = {**base, "stream": True, "stream_options": {"include_usge": True}}
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        request = model.model_validate(body)
    assert request.stream_options is not None
    assert request.include_usage is False  # the typo asked for nothing
    warned = warnings_naming(caplog, "stream_options.include_usge")
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "ignored fields" in warned[0]


def test_nested_and_top_level_unknowns_are_each_named_by_their_path(caplog):
    body = {**CHAT, "stream": True, "frobnicate": 1,
            "stream_options": {"include_usage": True, "zz_knob": 1, "include_usge": 0}}
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        request = ChatCompletionRequest.model_validate(body)
    assert request.include_usage is True  # the declared key still counts
    # one warning for the request, naming each by its path, with the key it was meant to be
    [line] = warnings_naming(caplog, "frobnicate")
    assert request.ignored_fields == [
        "frobnicate", "stream_options.include_usge (did you mean stream_options.include_usage?)",
        "stream_options.zz_knob"]
    assert ", ".join(request.ignored_fields) in line


def test_a_nested_key_is_judged_by_its_path_not_its_bare_name(caplog):
    """`echo` is refused at the top of a chat request unless false (field_policy's
    UNIMPLEMENTED); inside stream_options it is just an unknown key."""
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        request = ChatCompletionRequest.model_validate(
            {**CHAT, "stream": True, "stream_options": {"echo": True}})
    assert request.stream_options is not None
    assert len(warnings_naming(caplog, "stream_options.echo")) == 1


def stream_chunks(api, path: str, body: dict) -> list[dict]:
    """The data chunks of a 200 streamed answer, [DONE] excluded."""
    engine, settings = api

    async def scenario() -> list[dict]:
        async with (asgi_client(engine, settings, stop=False) as client,
                    client.stream("POST", path, json=body) as resp):
            assert resp.status_code == 200, await resp.aread()
            return [json.loads(line[len("data: "):]) async for line in resp.aiter_lines()
                    if line.startswith("data: ") and line != "data: [DONE]"]

    return asyncio.run(scenario())


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_a_misspelt_key_is_logged_and_the_stream_is_served(api, path, base, caplog):
    body = {**base, **GREEDY, "stream": True}
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        chunks = stream_chunks(api, path, {
            **body, "stream_options": {"include_usage": True, "include_usge": True}})
    warned = warnings_naming(caplog, "stream_options.include_usge")
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    # the same stream as without the typo
    plain = stream_chunks(api, path, {**body, "stream_options": {"include_usage": True}})
    assert [c["choices"] for c in chunks] == [c["choices"] for c in plain]


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
def test_without_include_usage_no_chunk_carries_usage(api, path, base):
    body = {**base, **GREEDY, "stream": True}
    for options in (None, {"include_usage": False, "continuous_usage_stats": True}):
        sent = {**body, **({"stream_options": options} if options else {})}
        chunks = stream_chunks(api, path, sent)
        assert chunks and all(c["choices"] for c in chunks)
        assert all("usage" not in c for c in chunks), chunks
