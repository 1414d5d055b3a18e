"""Every OpenAI/vLLM sampling field through the official `openai` client, in one place,
against `batchpilot serve` (a subprocess: the real CLI, its logging and its JSON).

The other tests check each field's semantics in depth (test_sampling_fields over ASGI,
test_logprobs_api against a direct forward, test_n_choices, test_response_format); this one
checks what a user of the client sees: the client's typed arguments (`logit_bias` with int
keys, `max_completion_tokens`, `presence_penalty`, `response_format`, `n`, ...) and
`extra_body` for vLLM's fields serialize into requests this server honours, with an effect
on the output; a field outside both shapes is ignored with a warning naming it in the
server's own log; an unimplemented one comes back as the client's BadRequestError naming it.
"""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pytest
from fixtures.serving import ServerProcess
from transformers import AutoTokenizer

CONFIG = {"serving": {"num_kv_blocks": 256, "max_active_sequences": 16}}
CHAT = [{"role": "user", "content": "Tell me about the scheduler"}]
PROMPT = "The scheduler picks the running decodes"
GREEDY = {"model": "tiny", "temperature": 0}
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def served(tiny_llama_dir, tmp_path_factory):
    with ServerProcess(tiny_llama_dir, tmp_path_factory.mktemp("serve"), CONFIG,
                       "--served-model-name", "tiny") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                               timeout=60)
        yield client, server, AutoTokenizer.from_pretrained(tiny_llama_dir)


def chat_text(client: openai.OpenAI, **kwargs) -> str:
    return client.chat.completions.create(messages=CHAT, **GREEDY, **kwargs
                                          ).choices[0].message.content


def test_logit_bias_min_tokens_and_max_completion_tokens(served):
    client, _, tokenizer = served
    token = tokenizer.encode(" the", add_special_tokens=False)[0]
    out = client.chat.completions.create(messages=CHAT, **GREEDY, max_completion_tokens=4,
                                         logit_bias={token: 100}, extra_body=IGNORE_EOS)
    assert out.choices[0].message.content == tokenizer.decode([token] * 4)
    assert out.usage.completion_tokens == 4
    eos = {tokenizer.eos_token_id: 100}
    stop_at_once = client.completions.create(prompt=PROMPT, **GREEDY, max_tokens=6,
                                             logit_bias=eos)
    assert (stop_at_once.usage.completion_tokens, stop_at_once.choices[0].finish_reason) == (
        1, "stop")
    held = client.completions.create(prompt=PROMPT, **GREEDY, max_tokens=6, logit_bias=eos,
                                     extra_body={"min_tokens": 3})
    assert (held.usage.completion_tokens, held.choices[0].finish_reason) == (4, "stop")


@pytest.mark.parametrize("field", [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                                   {"extra_body": {"repetition_penalty": 50.0}}])
def test_penalties_change_the_greedy_output(served, field):
    client = served[0]
    typed = {k: v for k, v in field.items() if k != "extra_body"}
    extra = {**IGNORE_EOS, **field.get("extra_body", {})}
    plain = chat_text(client, max_tokens=16, extra_body=IGNORE_EOS)
    assert chat_text(client, max_tokens=16, extra_body=extra, **typed) != plain


def test_min_p_one_samples_the_greedy_text(served):
    client = served[0]
    kwargs = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 1.5,
              "seed": 3}
    greedy = client.completions.create(**{**kwargs, "temperature": 0}).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text != greedy  # the control
    kept = client.completions.create(**kwargs, extra_body={"min_p": 1.0})
    assert kept.choices[0].text == greedy


def test_chat_logprobs_and_top_logprobs(served):
    out = served[0].chat.completions.create(messages=CHAT, **GREEDY, max_tokens=5,
                                            logprobs=True, top_logprobs=3,
                                            extra_body=IGNORE_EOS)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 5
    assert "".join(e.token for e in content) == out.choices[0].message.content
    for entry in content:  # greedy: the chosen token is the likeliest
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token and entry.logprob <= 0


def test_completions_logprobs_with_echo(served):
    client, _, tokenizer = served
    out = client.completions.create(prompt=PROMPT, **GREEDY, max_tokens=4, logprobs=2,
                                    echo=True, extra_body=IGNORE_EOS)
    choice, usage = out.choices[0], out.usage
    assert choice.text.startswith(PROMPT)
    assert len(choice.logprobs.tokens) == usage.prompt_tokens + usage.completion_tokens
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has none
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert usage.prompt_tokens == len(tokenizer.encode(PROMPT, add_special_tokens=False))


def test_n_choices(served):
    # completions: the chat prompt is too peaked for three seeds to differ on the tiny model
    out = served[0].completions.create(prompt=PROMPT, model="tiny", n=3, max_tokens=6,
                                       temperature=1.5, seed=3, extra_body=IGNORE_EOS)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == 18
    assert len({c.text for c in out.choices}) > 1  # seeds seed, seed+1, seed+2


def test_response_format_json_schema_parses(served):
    schema = {"type": "object", "properties": {
        "lane": {"type": "string", "enum": ["interactive", "batch"]},
        "blocks": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["lane", "blocks"], "additionalProperties": False}
    out = served[0].chat.completions.create(
        messages=CHAT, model="tiny", max_tokens=40, temperature=1.0, seed=5,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "lane", "schema": schema, "strict": True}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


@pytest.mark.parametrize("n", [1, 2])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(served, n):
    """vLLM's stream_options.continuous_usage_stats (GuideLLM sends it); without it only
    the last chunk carries usage, as OpenAI's API."""
    kwargs = {"messages": CHAT, "model": "tiny", "max_tokens": 5, "n": n, "stream": True,
              "extra_body": IGNORE_EOS}
    chunks = list(served[0].chat.completions.create(
        **kwargs, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages), usages
    assert len({u.prompt_tokens for u in usages}) == 1
    done = [u.completion_tokens for u in usages]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 5 * n, done
    assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in usages)
    plain = list(served[0].chat.completions.create(
        **kwargs, stream_options={"include_usage": True}))
    assert [c.usage is None for c in plain] == [True] * (len(plain) - 1) + [False]
    assert plain[-1].usage.completion_tokens == 5 * n


def test_unknown_fields_are_ignored_with_a_warning_in_the_server_log(served):
    client, server, _ = served
    plain = chat_text(client, max_tokens=6, extra_body=IGNORE_EOS)
    extra = {**IGNORE_EOS, "frobnicate": 1, "zz_unknown_knob": "x"}
    assert chat_text(client, max_tokens=6, extra_body=extra) == plain
    deadline = time.monotonic() + 10
    while "zz_unknown_knob" not in server.log():
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.1)
    [line] = [ln for ln in server.log().splitlines() if "zz_unknown_knob" in ln]
    assert "WARNING" in line and "frobnicate" in line, line


@pytest.mark.parametrize(("call", "field"), [
    ("chat", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("completions", {"best_of": 2}),
    ("completions", {"suffix": " and so on"}),
])
def test_unimplemented_fields_are_400_naming_the_field(served, call, field):
    client = served[0]
    (name, _), = field.items()
    with pytest.raises(openai.BadRequestError) as bad:
        if call == "chat":
            client.chat.completions.create(messages=CHAT, model="tiny", **field)
        else:
            client.completions.create(prompt=PROMPT, model="tiny", **field)
    assert name in bad.value.message and "Traceback" not in bad.value.message
