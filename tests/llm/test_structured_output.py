"""Structured output through LLM.generate on a tiny random model: a random model sampled at
temperature 1.0 writes JSON that parses and follows the schema, every time; a cut before the
end says "length"; unconstrained neighbours in the batch are untouched."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.models import load_model
from engine.structured import StructuredOutput

PERSON = {  # bounded: every branch ends within a few dozen tokens
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "color", "member"],
}
ORDER = {  # nested object, an array with bounds, a number
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "items": {"type": "array", "minItems": 1, "maxItems": 3,
                  "items": {"type": "object",
                            "properties": {"sku": {"enum": ["a1", "b2"]},
                                           "qty": {"type": "integer", "minimum": 1,
                                                   "maximum": 5}},
                            "required": ["sku", "qty"]}},
        "rush": {"type": "boolean"},
    },
    "required": ["id", "items", "rush"],
}
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(load_model(tiny_llama_dir), num_kv_blocks=256)


def _sampled(fmt: StructuredOutput, n: int = 20, max_tokens: int = 160,
             ) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed,
                           structured_output=fmt) for seed in range(n)]


@pytest.mark.parametrize("schema", [PERSON, ORDER], ids=["person", "order"])
def test_schema_output_always_parses_and_validates(llm, schema):
    outs = llm.generate([PROMPT] * 20, _sampled(StructuredOutput.json_schema(schema)),
                        use_tqdm=False)
    for out in outs:
        assert out.finish_reason == "stop", out.text  # ended by EOS, the JSON complete
        value = json.loads(out.text)
        jsonschema.validate(value, schema)
        assert list(value) == list(schema["properties"])  # the schema's property order
    assert len({o.text for o in outs}) > 5  # sampled, not one forced string
    assert llm.engine.block_manager.num_used == 0


def test_json_object_gives_an_object(llm):
    greedy = llm.generate("Hello world!", SamplingParams(
        max_tokens=64, temperature=0.0, structured_output=StructuredOutput.json_object()),
        use_tqdm=False)[0]
    assert greedy.finish_reason == "stop" and isinstance(json.loads(greedy.text), dict)
    outs = llm.generate([PROMPT] * 20, _sampled(StructuredOutput.json_object(), max_tokens=48),
                        use_tqdm=False)
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert stopped  # a random model often opens a string it never closes: those run out
    for out in stopped:
        assert isinstance(json.loads(out.text), dict), out.text
    for out in outs:
        if out.finish_reason != "stop":
            assert out.finish_reason == "length" and len(out.token_ids) == 48
            assert out.text.startswith("{")


def test_max_tokens_cut_ends_length_with_incomplete_json(llm):
    out = llm.generate(PROMPT, SamplingParams(
        max_tokens=4, temperature=1.0, seed=3,
        structured_output=StructuredOutput.json_schema(PERSON)), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    assert out.text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_unconstrained_rows_are_unaffected_by_constrained_neighbours(llm):
    prompts = ["Hello world!", "The scheduler", "A request waits", "Numbers like"]
    plain = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    alone = llm.generate(prompts[1::2], plain, use_tqdm=False)
    constrained = SamplingParams(max_tokens=60, temperature=1.0, seed=11,
                                 structured_output=StructuredOutput.json_schema(PERSON))
    mixed = llm.generate(prompts, [constrained, plain, constrained, plain], use_tqdm=False)
    assert [o.token_ids for o in mixed[1::2]] == [o.token_ids for o in alone]
    single = llm.generate(prompts[0], constrained, use_tqdm=False)[0]
    assert mixed[0].token_ids == single.token_ids  # and the seeded constrained row too
    jsonschema.validate(json.loads(mixed[0].text), PERSON)


def test_preempted_requests_still_follow_their_schema(tiny_llama_dir):
    # 6 blocks of 16 tokens for 6 requests of ~45 tokens: they preempt each other
    small = LLM(load_model(tiny_llama_dir), num_kv_blocks=12, block_size=16)
    outs = small.generate([PROMPT] * 6, _sampled(StructuredOutput.json_schema(PERSON), n=6),
                          use_tqdm=False)
    assert sum(o.record.num_preemptions for o in outs) > 0
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)


def test_bad_schema_and_conflicting_fields_are_refused(llm):
    bad = SamplingParams(structured_output=StructuredOutput.json_schema({"type": "objectx"}))
    with pytest.raises(ValueError, match=r"response_format: the schema is not supported.*"
                                         r"objectx"):
        llm.generate(PROMPT, bad, use_tqdm=False)
    with pytest.raises(ValueError, match="ignore_eos=True cannot be combined"):
        SamplingParams(ignore_eos=True, structured_output=StructuredOutput.json_object())
    with pytest.raises(ValueError, match="must be a StructuredOutput"):
        SamplingParams(structured_output={"type": "json_object"})
    with pytest.raises(ValueError, match="min_tokens=2 cannot be combined"):
        SamplingParams(min_tokens=2, structured_output=StructuredOutput.json_object())
    assert not llm.engine.has_unfinished_requests()
