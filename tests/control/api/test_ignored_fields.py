"""A request field outside the OpenAI and vLLM shapes is ignored, as vLLM does, but never
silently: the answer names it (X-Batchpilot-Ignored-Fields, batchpilot.ignored_fields)
with the field it was probably meant to be, bounded however many and however long the
client's keys are, and a request without one is answered as before."""

from __future__ import annotations

import asyncio
import json
import urllib.parse

from fixtures.serving import asgi_client

from control.api.field_policy import MAX_IGNORED_HEADER, MAX_NAME_CHARS, MAX_NAMED

PROMPT = {"prompt": "The scheduler picks the running decodes", "temperature": 0,
          "ignore_eos": True}
HEADER = "x-batchpilot-ignored-fields"


def post_all(api, bodies: list[dict], path: str = "/v1/completions") -> list:
    """The answers to `bodies`, all sent at once."""
    engine, settings = api

    async def scenario() -> list:
        async with asgi_client(engine, settings, stop=False) as client:
            return await asyncio.gather(*(client.post(path, json=b) for b in bodies))

    return asyncio.run(scenario())


def test_a_misspelt_field_is_named_in_the_answer_and_a_clean_request_is_untouched(api):
    typo, clean = post_all(api, [{**PROMPT, "max_token": 3, "max_tokens": 2},
                                 {**PROMPT, "max_tokens": 2}])
    assert typo.status_code == clean.status_code == 200
    named = ["max_token (did you mean max_tokens?)"]
    assert typo.headers[HEADER] == named[0]
    assert typo.json()["batchpilot"]["ignored_fields"] == named
    assert HEADER not in clean.headers and clean.json()["batchpilot"]["ignored_fields"] == []
    assert typo.json()["choices"][0]["text"] == clean.json()["choices"][0]["text"]


def test_hostile_keys_are_named_bounded_and_header_safe(api):
    junk = {f"k{i:02d}" + "用" * 100: 1 for i in range(50)}  # 8 KB if all were named
    long_key = "\r\nSet-Cookie: a=b" + "用" * 5000
    hostile, after = post_all(api, [{**PROMPT, "max_tokens": 2, long_key: 1, **junk},
                                    {**PROMPT, "max_tokens": 2}])
    assert hostile.status_code == after.status_code == 200
    names = hostile.json()["batchpilot"]["ignored_fields"]
    assert len(names) == MAX_NAMED + 1 and names[-1] == "and 43 more"
    assert all(len(n) <= MAX_NAME_CHARS for n in names)
    header = hostile.headers[HEADER]
    assert header.isascii() and header.isprintable() and "set-cookie" not in hostile.headers
    assert len(header) == MAX_IGNORED_HEADER and header.endswith(" ...")
    assert HEADER not in after.headers


def test_a_request_and_its_messages_share_the_cap_on_names(api):
    """The cap counts a body's unknown fields and its messages' together: eight at the top
    and a misspelt message key are eight names and "and 1 more", not nine names."""
    body = {"messages": [{"role": "user", "content": "hi", "nmae": "x"}], "max_tokens": 2,
            **{f"extra_{i}": 1 for i in range(MAX_NAMED)}}
    reply, = post_all(api, [body], "/v1/chat/completions")
    assert reply.status_code == 200, reply.text
    names = reply.json()["batchpilot"]["ignored_fields"]
    assert len(names) == MAX_NAMED + 1 and names[-1] == "and 1 more", names
    assert reply.headers[HEADER].endswith(", and 1 more")


def test_a_name_with_a_percent_sign_comes_back_whole_from_the_header(api):
    """The header's names are percent-encoded, so a '%' in one is encoded too: unquoting
    the header gives the names back (a raw "size%41x" would read as "sizeAx")."""
    reply, = post_all(api, [{**PROMPT, "max_tokens": 2, "size%41x": 1}])
    assert reply.status_code == 200, reply.text
    names = reply.json()["batchpilot"]["ignored_fields"]
    assert names[0].startswith("size%41x")
    assert urllib.parse.unquote(reply.headers[HEADER]) == ", ".join(names)


def test_a_stream_names_them_in_its_headers_and_last_chunk(api):
    engine, settings = api
    body = {"messages": [{"role": "user", "content": "hi", "nmae": "ann"}],
            "temprature": 0.5, "max_tokens": 2, "stream": True}

    async def scenario():
        async with (asgi_client(engine, settings, stop=False) as client,
                    client.stream("POST", "/v1/chat/completions", json=body) as resp):
            chunks = [json.loads(line[6:]) async for line in resp.aiter_lines()
                      if line.startswith("data: {")]
            return resp, chunks

    resp, chunks = asyncio.run(scenario())
    named = ["temprature (did you mean temperature?)",
             "messages[].nmae (did you mean messages[].name?)"]
    assert resp.status_code == 200 and resp.headers[HEADER] == ", ".join(named)
    assert chunks[-1]["batchpilot"]["ignored_fields"] == named


def test_tokenize_and_detokenize_name_them_in_a_header(api):
    tokenize, chat, detokenize, clean = (
        post_all(api, [{"prompt": "hi", "add_special_token": False}], "/tokenize")[0],
        post_all(api, [{"messages": [{"role": "user", "content": "hi", "nmae": "x"}]}],
                 "/tokenize")[0],
        post_all(api, [{"tokens": [1, 2], "tokenz": [3]}], "/detokenize")[0],
        post_all(api, [{"prompt": "hi"}], "/tokenize")[0])
    assert tokenize.status_code == chat.status_code == detokenize.status_code == 200
    assert tokenize.headers[HEADER] == "add_special_token (did you mean add_special_tokens?)"
    assert chat.headers[HEADER] == "messages[].nmae (did you mean messages[].name?)"
    assert detokenize.headers[HEADER] == "tokenz (did you mean tokens?)"
    assert clean.status_code == 200 and HEADER not in clean.headers
