"""vLLM's /health, /version, /tokenize and /detokenize over ASGI: each endpoint's happy
path against the tokenizer and the generation routes, bad input (400 naming the field, no
stack trace), a wrong model (the completion routes' 404), and where the work runs."""

from __future__ import annotations

import asyncio
import logging
import threading
from importlib.metadata import version

import httpx
import pytest
from fixtures.serving import asgi_client, make_engine

from control.api.app import create_app
from control.api.request_limits import prompt_char_limit
from control.api.response_schemas import ErrorResponse
from control.api.vllm_schemas import DetokenizeResponse, TokenizeResponse
from control.serve.engine_loop import AsyncEngine
from control.serve.settings import ServeSettings

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What does the scheduler do?"}]
PROMPT = "The scheduler picks the running decodes"


def call(api, *requests: tuple[str, str, dict | bytes | None]) -> list[httpx.Response]:
    """(method, path, json body or raw bytes) -> the responses, in order."""
    engine, settings = api

    async def scenario():
        async with asgi_client(engine, settings, stop=False) as client:
            out = []
            for method, path, body in requests:
                if isinstance(body, bytes):
                    out.append(await client.request(
                        method, path, content=body,
                        headers={"Content-Type": "application/json"}))
                else:
                    out.append(await client.request(method, path, json=body))
            return out

    return asyncio.run(scenario())


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert "Traceback" not in resp.text
    return ErrorResponse.model_validate(resp.json()).error.model_dump()


def test_health_is_empty_200_and_stays_up_while_draining_and_version_is_the_package(
        tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            health = await client.get("/health")
            assert health.status_code == 200 and health.content == b""
            assert (await client.get("/version")).json() == {"version": version("batchpilot")}
            engine.start_draining()
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/health")).status_code == 200  # alive, not ready
            engine.stop()  # the engine loop is gone: the process can no longer serve
            return await client.get("/health")

    dead = asyncio.run(scenario())
    assert "engine loop is not running" in error_of(dead, 503)["message"]
    assert dead.headers["retry-after"]


def test_health_and_tokenize_are_503_while_the_model_loads():
    release = threading.Event()

    def slow_then_broken():
        release.wait(30)
        raise FileNotFoundError("no such checkpoint 'nowhere'")

    engine = AsyncEngine(slow_then_broken).start()

    async def scenario():
        app = create_app(ServeSettings(model="tiny"), engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client:
            loading = await client.get("/health")
            tokenize = await client.post("/tokenize", json={"prompt": "Hi"})
            release.set()
            engine.loaded.wait(10)
            return loading, tokenize, await client.get("/health")

    loading, tokenize, failed = asyncio.run(scenario())
    assert "loading" in error_of(loading, 503)["message"]
    assert error_of(tokenize, 503)["code"] == "loading"
    assert "no such checkpoint" in error_of(failed, 503)["message"]


def test_tokenize_counts_what_the_generation_routes_count(api, tiny_loaded):
    tok = tiny_loaded.tokenizer
    chat = {"messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    prompt, strs, chat_tok, chat_gen, completion = call(
        api, ("POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False}),
        ("POST", "/tokenize", {"model": "tiny", "prompt": PROMPT, "return_token_strs": True}),
        ("POST", "/tokenize", {"messages": MESSAGES}),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}))
    body = TokenizeResponse.model_validate(prompt.json())
    assert body.tokens == tok.encode(PROMPT, add_special_tokens=False)
    assert body.count == len(body.tokens) and body.max_model_len == 512
    assert body.token_strs is None and "token_strs" in prompt.json()  # vLLM's null
    with_strs = TokenizeResponse.model_validate(strs.json())
    assert with_strs.tokens == tok.encode(PROMPT, add_special_tokens=True)
    assert with_strs.token_strs == tok.convert_ids_to_tokens(with_strs.tokens)
    assert body.count == completion.json()["usage"]["prompt_tokens"]
    rendered = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_body = TokenizeResponse.model_validate(chat_tok.json())
    assert chat_body.tokens == tok.encode(rendered, add_special_tokens=False)
    assert chat_body.count == chat_gen.json()["usage"]["prompt_tokens"]


def test_chat_tokenize_can_leave_the_last_message_open(api, tiny_loaded):
    tok = tiny_loaded.tokenizer
    messages = [*MESSAGES, {"role": "assistant", "content": "It picks"}]
    resp, = call(api, ("POST", "/tokenize", {"messages": messages, "add_generation_prompt":
                                             False, "continue_final_message": True}))
    rendered = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert rendered.endswith("It picks")
    assert resp.json()["tokens"] == tok.encode(rendered, add_special_tokens=False)


def test_text_parts_are_the_message_their_texts_make(api):
    """A message's content sent as text parts is their texts run together: tokenized and
    answered as the same message sent as one string."""
    parts = [{"type": "text", "text": "What does the sched"},
             {"type": "text", "text": "uler do?"}]
    as_parts = [MESSAGES[0], {"role": "user", "content": parts}]
    whole, split, chat = call(
        api, ("POST", "/tokenize", {"messages": MESSAGES}),
        ("POST", "/tokenize", {"messages": as_parts}),
        ("POST", "/v1/chat/completions", {"messages": as_parts, "max_tokens": 1}))
    assert split.status_code == chat.status_code == 200, (split.text, chat.text)
    assert split.json()["tokens"] == whole.json()["tokens"]
    assert chat.json()["usage"]["prompt_tokens"] == whole.json()["count"]


def test_detokenize_inverts_tokenize(api):
    text = "Paged KV blocks, 16 tokens each: the pool's unit."
    tokens = call(api, ("POST", "/tokenize", {"prompt": text}))[0].json()["tokens"]
    resp, = call(api, ("POST", "/detokenize", {"model": "tiny", "tokens": tokens}))
    assert DetokenizeResponse.model_validate(resp.json()).prompt == text


@pytest.mark.parametrize(("path", "body", "param", "needle"), [
    ("/tokenize", {}, "prompt", "Field required"),
    ("/tokenize", {"prompt": 5}, "prompt", "string"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "maybe"}, "add_special_tokens", "bool"),
    ("/tokenize", {"messages": []}, "messages", "at least 1"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages", "role"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True},
     "continue_final_message", "add_generation_prompt"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ messages }}"}, "chat_template",
     "not supported"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools",
     "not supported"),
    ("/tokenize", [1, 2], None, "dictionary"),
    ("/tokenize", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", None, "not valid JSON"),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, None, "not both"),  # one went unread
    ("/tokenize", {"prompt": "hi", "add_special_tokens": "no"}, "add_special_tokens", "bool"),
    ("/tokenize", b"{bad", None, "not valid JSON"),
    ("/detokenize", {}, "tokens", "Field required"),
    ("/detokenize", {"tokens": "abc"}, "tokens", "list"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens", "99999"),
    ("/detokenize", {"tokens": [-1, 2]}, "tokens", "-1"),
    ("/detokenize", b"", None, "not valid JSON"),
    # the routes FastAPI parses answer as those parsed by hand, saying what was wrong
    ("/v1/completions", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", None,
     "nests deeper"),
    ("/v1/chat/completions", b'{"messages": "\xff\xfe"}', None, "not valid JSON ('utf-8'"),
])
def test_bad_input_is_400_naming_the_field(api, path, body, param, needle):
    resp, = call(api, ("POST", path, body))
    error = error_of(resp, 400)
    assert error["param"] == param, error
    assert needle in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_empty_values_of_unsupported_fields_count_as_not_sent(api):
    """A client that sends `tools: []` or `chat_template_kwargs: {}` with every request
    (nothing to pass on) gets the count it gets without them, not a 400."""
    plain, empty = call(api, ("POST", "/tokenize", {"messages": MESSAGES}),
                        ("POST", "/tokenize", {"messages": MESSAGES, "tools": [],
                                               "chat_template_kwargs": {},
                                               "chat_template": None,
                                               "mm_processor_kwargs": {}}))
    assert empty.status_code == 200, empty.text
    assert empty.json()["tokens"] == plain.json()["tokens"]


def test_wrong_model_is_the_completion_routes_404(api):
    model = {"model": "gpt-9"}
    completion, prompt, chat, detok = call(
        api, ("POST", "/v1/completions", {**model, "prompt": "x"}),
        ("POST", "/tokenize", {**model, "prompt": "x"}),
        ("POST", "/tokenize", {**model, "messages": MESSAGES}),
        ("POST", "/detokenize", {**model, "tokens": [1, 2]}))
    expected = error_of(completion, 404)
    assert expected["code"] == "model_not_found" and expected["param"] == "model"
    for resp in (prompt, chat, detok):
        assert error_of(resp, 404) == expected


def test_fields_outside_the_shape_are_ignored_with_a_warning(api, caplog):
    with caplog.at_level(logging.WARNING, logger="batchpilot.http"):
        resp, = call(api, ("POST", "/tokenize", {"prompt": "Hi", "frobnicate": 1}))
    assert resp.status_code == 200, resp.text
    assert any("frobnicate" in r.getMessage() for r in caplog.records)


class RecordingTokenizer:
    """The routes' tokenizer, noting which thread each encode and decode ran on."""

    def __init__(self, inner):
        self.inner, self.threads = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        return self.inner.encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        return self.inner.decode(*args, **kwargs)


def test_tokenizing_runs_on_the_tokenizer_thread_not_the_event_loop(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    recorder = RecordingTokenizer(engine.parts.frontend_tokenizer)
    engine.parts.frontend_tokenizer = recorder
    # as long as the server tokenizes (longer cannot fit the context: a 400, untokenized)
    limit = prompt_char_limit(settings.limits, recorder, engine.parts.static.max_model_len)
    long_prompt = ("the scheduler picks the running decodes " * 2000)[:limit]
    max_len = engine.parts.static.max_model_len  # /detokenize takes no more ids
    try:
        prompt, chat, detok = call(
            (engine, settings), ("POST", "/tokenize", {"prompt": long_prompt}),
            ("POST", "/tokenize", {"messages": MESSAGES}),
            ("POST", "/detokenize", {"tokens": (list(range(1, 400)) * 40)[:max_len]}))
    finally:
        engine.stop()
    assert prompt.json()["count"] > 1_000 and chat.status_code == detok.status_code == 200
    assert len(recorder.threads) == 3
    assert all(name.startswith("tokenizer") for name in recorder.threads), recorder.threads


def test_openapi_documents_both_tokenize_shapes_without_dangling_refs(api):
    resp, = call(api, ("GET", "/openapi.json", None))
    doc = resp.json()
    body = doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
    shapes = [set(s["properties"]) for s in body["schema"]["anyOf"]]
    assert {"prompt", "add_special_tokens"} <= shapes[0]
    assert {"messages", "add_generation_prompt"} <= shapes[1]
    assert "#/$defs/" not in resp.text  # pydantic's refs point nowhere in an OpenAPI doc
    assert "tokens" in doc["paths"]["/detokenize"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]


def test_a_tokenizer_that_adds_a_bos_gets_it_as_vllm_gives_it(api):
    """vLLM's add_special_tokens: a completions text prompt gets the tokenizer's BOS (for
    the models whose tokenizer adds one) unless it is false; a chat request gets none on
    top of its template's unless it is true; /tokenize counts what each route counts."""
    from tokenizers.processors import TemplateProcessing

    tok = api[0].parts.frontend_tokenizer
    backend = tok.backend_tokenizer
    bos = tok.convert_tokens_to_ids(tok.bos_token)
    saved = backend.post_processor
    backend.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A",
                                                special_tokens=[(tok.bos_token, bos)])
    try:
        plain = tok.encode(PROMPT, add_special_tokens=False)
        assert tok.encode(PROMPT) == [bos, *plain]  # the stand-in adds a BOS
        chat = {"messages": MESSAGES, "max_tokens": 1, "temperature": 0}
        completion = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        replies = call(api, ("POST", "/v1/completions", completion),
                       ("POST", "/v1/completions", {**completion, "add_special_tokens": False}),
                       ("POST", "/tokenize", {"prompt": PROMPT}),
                       ("POST", "/v1/chat/completions", chat),
                       ("POST", "/v1/chat/completions", {**chat, "add_special_tokens": True}),
                       ("POST", "/tokenize", {"messages": MESSAGES}))
    finally:
        backend.post_processor = saved
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    counts = [r.json()["usage"]["prompt_tokens"] if "usage" in r.json() else r.json()["count"]
              for r in replies]
    assert counts[:3] == [len(plain) + 1, len(plain), len(plain) + 1]
    assert counts[3] == counts[5] and counts[4] == counts[3] + 1
