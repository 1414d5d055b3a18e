"""Structured output's parts without a model: parsing OpenAI / vLLM shapes, compiling once per
schema, and the sampler's masks on random logits with the tiny test tokenizer."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import VOCAB_SIZE, build_tokenizer

from engine.execution.sampler import sample
from engine.request import Request, SamplingParams
from engine.structured import StructuredOutput
from engine.structured.constrain import constrain_logits
from engine.structured.grammar import GrammarCache, cache_for
from engine.structured.spec import MAX_SCHEMA_CHARS

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def cache(tokenizer) -> GrammarCache:
    return cache_for(tokenizer, VOCAB_SIZE, tokenizer.eos_token_id)


def _request(rid: str, params: SamplingParams, eos: int) -> Request:
    return Request(rid, [5, 6, 7], params, 0.0, eos_token_id=eos)


def test_openai_and_vllm_shapes_parse_or_name_the_problem():
    assert StructuredOutput.from_openai({"type": "text"}) is None
    assert StructuredOutput.from_openai({"type": "json_object"}) == StructuredOutput.json_object()
    spec = StructuredOutput.from_openai({"type": "json_schema", "json_schema": {
        "name": "flag", "schema": {"type": "object", "b": 1, "a": 2}, "strict": True}})
    assert spec.kind == "json_schema" and spec.name == "flag"
    assert spec.schema == '{"type":"object","b":1,"a":2}'  # compact, the client's key order
    assert spec == StructuredOutput.json_schema('{ "type": "object", "b": 1, "a": 2 }')
    cases = [({"type": "xml"}, r"response_format.type='xml' must be one of"),
             ({"type": "json_schema"}, r"response_format.json_schema must be an object"),
             ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be a JSON object"),
             ("json", "response_format must be an object")]
    for value, message in cases:
        with pytest.raises(ValueError, match=message):
            StructuredOutput.from_openai(value)
    with pytest.raises(ValueError, match="guided_json: the schema is not valid JSON"):
        StructuredOutput.json_schema("{nope", field_name="guided_json")
    with pytest.raises(ValueError, match=f"at most {MAX_SCHEMA_CHARS}"):
        StructuredOutput.json_schema({"enum": ["x" * MAX_SCHEMA_CHARS]})


def test_a_schema_of_exactly_max_schema_chars_is_accepted_and_one_more_is_refused():
    fill = MAX_SCHEMA_CHARS - len('{"enum":[""]}')  # compact JSON: the limit exactly
    assert len(StructuredOutput.json_schema({"enum": ["x" * fill]}).schema) == MAX_SCHEMA_CHARS
    with pytest.raises(ValueError, match=f"{MAX_SCHEMA_CHARS + 1} characters"):
        StructuredOutput.json_schema({"enum": ["x" * (fill + 1)]})


def test_a_grammar_cache_is_per_eos_and_refuses_an_eos_at_the_logits_width(tokenizer, cache):
    """The grammar's stop tokens are the model's EOS ids: another EOS is another cache (its
    grammars end on that EOS), and an EOS id equal to the logits' width is outside them."""
    other = cache_for(tokenizer, VOCAB_SIZE, 3)
    assert other is not cache and other.stop_token_ids == (3,)
    assert cache.stop_token_ids == (tokenizer.eos_token_id,)
    assert cache_for(tokenizer, VOCAB_SIZE, 3) is other
    GrammarCache(tokenizer, VOCAB_SIZE, (VOCAB_SIZE - 1,))  # the last id: inside
    with pytest.raises(ValueError, match=rf"EOS ids \[{VOCAB_SIZE}\] are outside"):
        GrammarCache(tokenizer, VOCAB_SIZE, (VOCAB_SIZE,))


def test_compiles_once_per_schema_and_names_the_field_when_refused(tokenizer, cache):
    assert cache_for(tokenizer, VOCAB_SIZE, tokenizer.eos_token_id) is cache
    first = cache.compile(StructuredOutput.json_schema(SCHEMA))
    assert first.grammar.tokenizer_info.vocab_size == VOCAB_SIZE
    held = cache.cached_bytes
    assert held > 0
    cache.compile(StructuredOutput.json_schema(dict(SCHEMA)))  # the same schema: a lookup
    assert cache.cached_bytes == held
    cache.compile(StructuredOutput.json_schema({**SCHEMA, "required": []}))
    assert cache.cached_bytes > held
    with pytest.raises(ValueError, match=r"^guided_json: the schema is not supported: "
                                         r"Unsupported type \"objectx\""):
        cache.compile(StructuredOutput.json_schema({"type": "objectx"}), "guided_json")
    with pytest.raises(ValueError, match="needs a model with an EOS token"):
        GrammarCache(tokenizer, VOCAB_SIZE, ())


def test_masks_only_constrained_rows_and_only_tokens_the_grammar_takes(tokenizer, cache):
    eos = tokenizer.eos_token_id
    spec = cache.bind(StructuredOutput.json_schema(SCHEMA))
    requests = [_request("free", SamplingParams(temperature=0.0), eos),
                _request("json", SamplingParams(temperature=0.0, structured_output=spec), eos)]
    logits = torch.randn(2, VOCAB_SIZE, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    out = constrain_logits(logits, requests)
    assert torch.equal(logits, before)  # the input is not changed
    assert torch.equal(out[0], logits[0])  # the unconstrained row: bit-identical
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).startswith("{") for t in allowed)
    assert torch.equal(out[1][allowed], logits[1][allowed])
    assert eos not in allowed  # EOS only once the JSON is complete


def test_greedy_run_ends_with_eos_exactly_when_json_completes(tokenizer, cache):
    eos = tokenizer.eos_token_id
    spec = cache.bind(StructuredOutput.json_schema(SCHEMA))
    req = _request("json", SamplingParams(temperature=0.0, structured_output=spec), eos)
    gen = torch.Generator().manual_seed(1)
    for _ in range(40):
        token = sample(torch.randn(1, VOCAB_SIZE, generator=gen), [req])[0]
        req.token_ids.append(token)
        if token == eos:
            break
    text = tokenizer.decode(req.output_token_ids[:-1])
    assert req.output_token_ids[-1] == eos
    assert text in ('{"ok": true}', '{"ok": false}')


def test_catch_up_is_idempotent_and_a_foreign_token_fails_the_request(tokenizer, cache):
    eos = tokenizer.eos_token_id
    spec = cache.bind(StructuredOutput.json_object())
    req = _request("json", SamplingParams(temperature=0.0, structured_output=spec), eos)
    logits = torch.randn(1, VOCAB_SIZE, generator=torch.Generator().manual_seed(2))
    first = constrain_logits(logits, [req])
    # a failed step re-run (engine/fault_isolation.py) masks again from the same tokens
    assert torch.equal(constrain_logits(logits, [req]), first)
    req.token_ids.append(int(first[0].argmax()))
    assert not torch.equal(constrain_logits(logits, [req]), first)  # one token further on
    req.token_ids.append(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    with pytest.raises(ValueError, match="breaks its grammar"):
        constrain_logits(logits, [req])


def test_an_unbound_spec_fails_with_a_clear_message(tokenizer):
    params = SamplingParams(structured_output=StructuredOutput.json_object())
    req = _request("raw", params, tokenizer.eos_token_id)
    with pytest.raises(ValueError, match="structured_output was not compiled"):
        constrain_logits(torch.zeros(1, VOCAB_SIZE), [req])
