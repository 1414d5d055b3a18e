"""`response_format` and vLLM's `guided_json` through the official `openai` client against
`batchpilot serve` on a tiny random model: the output parses and follows the schema, on
chat and completions, streamed or not; a bad schema or shape is a 400 naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from fixtures.serving import LiveServer, make_engine

HELLO = [{"role": "user", "content": "Hello world! How are you today?"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6},
                   "age": {"type": "integer", "minimum": 0, "maximum": 99},
                   "color": {"enum": ["red", "green"]}},
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def served(tiny_loaded, one_torch_thread):
    engine, spy, settings = make_engine(tiny_loaded)
    with LiveServer(engine, settings) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                            timeout=60), spy
    engine.stop()


@pytest.fixture
def client(served):
    return served[0]


def test_chat_json_schema_parses_and_validates_every_time(client):
    for seed in range(8):
        reply = client.chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=80, temperature=1.0, seed=seed,
            response_format=SCHEMA_FORMAT)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=80, temperature=1.0, seed=3, stream=True,
        response_format=SCHEMA_FORMAT))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    several = client.chat.completions.create(  # n > 1: a matcher per choice
        model="tiny", messages=HELLO, max_tokens=80, temperature=1.0, n=3,
        response_format=SCHEMA_FORMAT)
    assert len(several.choices) == 3
    for choice in several.choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_and_guided_json_on_completions(client):
    whole = client.completions.create(model="tiny", prompt="The quick brown fox",
                                      max_tokens=64, temperature=0,
                                      extra_body={"response_format": {"type": "json_object"}})
    assert whole.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(whole.choices[0].text), dict)
    guided = client.completions.create(model="tiny", prompt="The quick brown fox",
                                       max_tokens=80, temperature=1.0, seed=5,
                                       extra_body={"guided_json": json.dumps(PERSON)})
    jsonschema.validate(json.loads(guided.choices[0].text), PERSON)
    text = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3,
                                          response_format={"type": "text"})
    assert text.choices[0].finish_reason == "length"  # "text": no constraint


def test_a_cut_before_the_end_is_length(client):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3,
                                           temperature=1.0, seed=1,
                                           response_format=SCHEMA_FORMAT)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content.startswith("{")


@pytest.mark.parametrize(("extra", "param", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "response_format", "objectx"),
    ({"response_format": {"type": "xml"}}, "response_format", "must be one of"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "'schema'"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_json": PERSON, "response_format": {"type": "json_object"}}, "guided_json",
     "send one"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos",
     "cannot be combined"),
])
def test_refusals_are_400s_naming_the_field(client, extra, param, message):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8,
                                       extra_body=extra)
    assert bad.value.body["param"] == param, bad.value.body
    assert message in bad.value.message


def test_an_engine_without_a_model_refuses_it(served):
    client, spy = served
    spy.computes_logprobs = False  # as an executor that runs no model (a simulator)
    try:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8,
                                           response_format={"type": "json_object"})
        assert bad.value.body["param"] == "response_format"
        assert "runs no model" in bad.value.message
    finally:
        spy.computes_logprobs = True
