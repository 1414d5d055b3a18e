"""Logprobs through the HTTP API with the official `openai` client (uvicorn in a thread over
the tiny model): chat's logprobs / top_logprobs, completions' logprobs and echo, vLLM's
prompt_logprobs, streaming and not, against a direct forward of the checkpoint; bad values
and an engine without a model are a 400 naming the field."""

from __future__ import annotations

import json
import math

import openai
import pytest
import torch
from fixtures.serving import LiveServer, make_engine
from transformers import AutoModelForCausalLM

from control.api import response_schemas as shapes
from control.api.logprobs_format import (
    MIN_LOGPROB,
    CompletionLogprobs,
    chat_logprobs,
    vllm_prompt_logprobs,
)
from engine.output.processor import Logprob

HELLO = [{"role": "user", "content": "Hello world! How are you today?"}]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def api(tiny_loaded, one_torch_thread):
    engine, spy, settings = make_engine(tiny_loaded)
    with LiveServer(engine, settings) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=60)
        yield client, spy, tiny_loaded.tokenizer
    engine.stop()


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)


def reference_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation and log_softmax over the whole sequence [len, V]."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return ids, torch.log_softmax(logits, dim=-1)


def test_completions_echo_logprobs_equal_a_direct_forward(api, reference):
    client, _, tok = api
    prompt = tok.encode("The scheduler picks the running decodes", add_special_tokens=False)
    ids, ref = reference_greedy(reference, prompt, 6)
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, echo=True,
                                    logprobs=2, **GREEDY)
    choice = out.choices[0]
    lp = choice.logprobs
    texts = [tok.decode([t]) for t in ids]
    assert lp.tokens == texts
    assert choice.text == tok.decode(prompt) + tok.decode(ids[len(prompt):])
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    for i, top in enumerate(lp.top_logprobs[1:], start=1):
        values, best = torch.topk(ref[i - 1], 2)
        want = {tok.decode([t]): v for t, v in zip(best.tolist(), values.tolist(),
                                                    strict=True)}
        want.setdefault(texts[i], float(ref[i - 1, ids[i]]))
        assert top == pytest.approx(want, abs=1e-4)


def test_completions_streaming_logprobs_agree_with_the_whole_reply(api):
    client, _, _ = api
    kwargs = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 10,
              "logprobs": 3, "echo": True, **GREEDY}
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(**kwargs, stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert sum((p.tokens for p in parts), []) == whole.logprobs.tokens
    streamed = sum((p.token_logprobs for p in parts), [])
    assert streamed[0] is None and whole.logprobs.token_logprobs[0] is None
    assert streamed[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-4)
    assert sum((p.text_offset for p in parts), []) == whole.logprobs.text_offset
    assert whole.text.startswith("The quick brown fox")


def check_chat_content(content, top_n: int) -> None:
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == top_n
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        if top_n:  # greedy: the chosen token is the likeliest
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == entry.logprob
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)


@pytest.mark.parametrize("top_n", [0, 4, 20])  # 20: the most a request may ask for
def test_chat_logprobs_streaming_and_not(api, top_n):
    client, _, _ = api
    kwargs = {"model": "tiny", "messages": HELLO, "max_tokens": 8, "logprobs": True,
              "top_logprobs": top_n, **GREEDY}
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 8
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    check_chat_content(content, top_n)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=1e-4)


def test_chat_without_logprobs_has_none(api):
    client, _, _ = api
    out = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    assert out.choices[0].logprobs is None
    assert "prompt_logprobs" not in (out.model_extra or {})


def test_vllm_prompt_logprobs(api):
    client, _, _ = api
    out = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2,
                                         temperature=0, extra_body={"prompt_logprobs": 2})
    prompt = out.model_extra["prompt_logprobs"]
    assert len(prompt) == out.usage.prompt_tokens and prompt[0] is None
    for row in prompt[1:]:
        ranks = sorted(v["rank"] for v in row.values())
        assert 1 in ranks and len(row) in (2, 3)
    streamed = list(client.completions.create(model="tiny", prompt="Hello world", max_tokens=2,
                                              stream=True, extra_body={"prompt_logprobs": 1}))
    first = streamed[0].choices[0].model_extra["prompt_logprobs"]
    assert first[0] is None and len(first) == len(api[2].encode("Hello world"))


@pytest.mark.parametrize(("call", "param"), [
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
    ({"extra_body": {"prompt_logprobs": -1}}, "prompt_logprobs"),
])
def test_bad_chat_values_are_400_naming_the_field(api, call, param):
    client = api[0]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, **call)
    assert err.value.body["param"] == param and param in err.value.body["message"]


def test_bad_completions_logprobs_is_400_naming_it(api):
    with pytest.raises(openai.BadRequestError) as err:
        api[0].completions.create(model="tiny", prompt="Hello", max_tokens=2, logprobs=21)
    assert err.value.body["param"] == "logprobs"


def test_an_engine_without_a_model_refuses_logprobs_but_echoes(api):
    client, spy, _ = api
    spy.computes_logprobs = False
    try:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2,
                                           logprobs=True)
        assert err.value.body["param"] == "logprobs"
        assert "runs no model" in err.value.body["message"]
        echoed = client.completions.create(model="tiny", prompt="Hello", max_tokens=2,
                                           echo=True)
        assert echoed.choices[0].text.startswith("Hello")
        assert echoed.choices[0].logprobs is None
    finally:
        spy.computes_logprobs = True


def test_prompt_logprob_ranks_count_from_one(api):
    """vLLM's prompt_logprobs rank the likeliest token 1: the top-2 entries of every row
    are ranks 1 and 2, the likeliest first."""
    client, _, _ = api
    out = client.completions.create(model="tiny", prompt="Hello world, how are you", max_tokens=1,
                                    extra_body={"prompt_logprobs": 2})
    rows = out.choices[0].model_extra["prompt_logprobs"][1:]
    assert rows
    for row in rows:
        by_logprob = sorted(row.values(), key=lambda v: -v["logprob"])
        assert [v["rank"] for v in by_logprob[:2]] == [1, 2], row
        assert min(v["rank"] for v in row.values()) == 1


def test_an_engine_without_a_model_refuses_prompt_logprobs(api):
    """prompt_logprobs, like logprobs, is a 400 naming it on an engine that runs no model,
    not an answer without them."""
    client, spy, _ = api
    spy.computes_logprobs = False
    try:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt="Hello", max_tokens=2,
                                      extra_body={"prompt_logprobs": 1})
    finally:
        spy.computes_logprobs = True
    assert err.value.body["param"] == "prompt_logprobs"
    assert "runs no model" in err.value.body["message"]


def test_a_minus_infinity_logprob_is_floored_so_the_answer_is_json():
    """A token the model cannot pick (logprob -inf, e.g. masked) is shown at -9999, as vLLM
    does: JSON has no -inf, so an unfloored one would make an invalid body."""
    inf = float("-inf")
    entry = Logprob(5, "a", inf, 3, top=((7, "b", -0.1), (5, "a", inf)))
    shown = [chat_logprobs([entry], 2), CompletionLogprobs(2).render([entry]),
             vllm_prompt_logprobs([entry], 2)]
    text = json.dumps(shown, allow_nan=False)  # raises on -inf
    assert str(MIN_LOGPROB) in text
    assert shown[0]["content"][0]["logprob"] == MIN_LOGPROB
    assert shown[1]["token_logprobs"] == [MIN_LOGPROB]
    assert shown[2][1]["5"]["logprob"] == MIN_LOGPROB


def test_every_field_of_an_answer_is_in_its_documented_shape(api):
    """/openapi.json documents the answers (control/api/response_schemas.py): every field
    an answer carries, vLLM's prompt_logprobs included, is in the shape documented."""
    client, _, _ = api
    chat = json.loads(client.chat.completions.with_raw_response.create(
        model="tiny", messages=HELLO, max_tokens=2, logprobs=True, top_logprobs=1,
        extra_body={"prompt_logprobs": 1}).text)
    completion = json.loads(client.completions.with_raw_response.create(
        model="tiny", prompt="Hello", max_tokens=2, logprobs=1, echo=True,
        extra_body={"prompt_logprobs": 1}).text)
    assert set(chat) <= set(shapes.ChatCompletionResponse.model_fields), set(chat)
    assert set(chat["choices"][0]) <= set(shapes.ChatChoice.model_fields)
    assert set(chat["batchpilot"]) <= set(shapes.BatchpilotInfo.model_fields)
    assert set(completion) <= set(shapes.CompletionResponse.model_fields), set(completion)
    assert set(completion["choices"][0]) <= set(shapes.CompletionChoice.model_fields)
    assert "prompt_logprobs" in chat and "prompt_logprobs" in completion["choices"][0]
