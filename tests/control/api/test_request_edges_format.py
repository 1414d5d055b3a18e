"""A request's shape and its answer's, asked directly with no engine: the bounds of the
request schemas (control/api/schemas.py), exactly at each end, and what the answer format
(control/api/openai_format.py) puts in usage, chunks, headers and the admitted SLO."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from control.api.openai_format import ResponseFormat, from_decision
from control.api.request_meta import RequestMeta
from control.api.response_schemas import SLOTargets
from control.api.schemas import ChatCompletionRequest, CompletionRequest
from engine.config import LiveConfig
from engine.config.slo import LaneSLO
from engine.output.processor import Logprob
from engine.records import AdmissionDecision

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"prompt": "hi"}


def refused_field(model, body: dict) -> str:
    """The field the schema's error names."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return str(caught.value.errors()[0]["loc"][0])


# ---- request bounds --------------------------------------------------------------------
@pytest.mark.parametrize("field,bad,good", [
    ("n", [0, -1, 17, 10_000], [1, 16]),
    ("max_tokens", [0, -5], [1]),
    ("temperature", [-0.01, -1.0, 2.01], [0.0, 2.0]),
    ("top_p", [0.0, -0.5, 1.01], [1e-6, 1.0]),
    ("logit_bias", [{"5": -100.5}, {"5": 101}], [{"5": -100}, {"5": 100}]),
], ids=["n", "max_tokens", "temperature", "top_p", "logit_bias"])
def test_a_sampling_field_is_bounded_at_both_ends(field, bad, good):
    for model, base in ((CompletionRequest, PROMPT), (ChatCompletionRequest, CHAT)):
        for value in bad:
            assert refused_field(model, {**base, field: value}) == field, value
        for value in good:
            assert getattr(model.model_validate({**base, field: value}), field) == value


def test_logprobs_alternatives_are_at_most_20_and_top_logprobs_needs_logprobs():
    assert CompletionRequest.model_validate({**PROMPT, "logprobs": 20}).engine_logprobs == 20
    assert refused_field(CompletionRequest, {**PROMPT, "logprobs": 21}) == "logprobs"
    assert refused_field(ChatCompletionRequest, {**CHAT, "top_logprobs": 3}) == "top_logprobs"
    assert refused_field(ChatCompletionRequest, {**CHAT, "logprobs": False,
                                                 "top_logprobs": 3}) == "top_logprobs"
    chat = ChatCompletionRequest.model_validate({**CHAT, "logprobs": True, "top_logprobs": 3})
    assert chat.engine_logprobs == 3


# ---- the answer format -----------------------------------------------------------------
def fmt(kind: str = "chat", tenant: str = "acme", **kwargs) -> ResponseFormat:
    meta = RequestMeta(tenant, None, 0, None, 60.0)
    return ResponseFormat(kind, "req-1", "tiny", 7, meta, lane="interactive", **kwargs)


def chunk(data: bytes) -> dict:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    return json.loads(data[len(b"data: "):])


def test_usage_counts_the_prompt_in_the_total():
    assert fmt().usage(5).model_dump() == {"prompt_tokens": 7, "completion_tokens": 5,
                                           "total_tokens": 12}


def test_usage_on_every_chunk_only_when_continuous_usage_was_asked():
    plain = chunk(fmt(include_usage=True).text_chunk("x", tokens=3))
    assert plain["usage"] is None
    running = chunk(fmt(include_usage=True, continuous_usage=True).text_chunk("x", tokens=3))
    assert running["usage"]["completion_tokens"] == 3


def test_a_choice_that_is_not_the_last_ends_with_its_finish_chunk_only():
    """n > 1: the usage chunk and [DONE] come once, after the last choice's finish."""
    answer = fmt(include_usage=True)
    first = answer.finish_chunks(None, 4, "length", index=0, last=False)
    assert len(first) == 1 and chunk(first[0])["choices"][0]["finish_reason"] == "length"
    last = answer.finish_chunks(None, 8, "stop", index=1)
    assert last[-1] == b"data: [DONE]\n\n" and chunk(last[1])["usage"]["completion_tokens"] == 8


def test_held_back_tokens_logprobs_come_with_the_finish_chunk():
    entry = Logprob(5, "x", -0.5, None, ((5, "x", -0.5), (6, "y", -1.5)))
    data = chunk(fmt(top_logprobs=1).finish_chunks(None, 1, "stop", entries=(entry,))[0])
    content = data["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["x"] and len(content[0]["top_logprobs"]) == 1


def test_headers_carry_a_tenant_in_any_script_and_the_engines_final_lane():
    answer = fmt(tenant="租户-α")
    headers = answer.start_headers()
    assert headers["X-Batchpilot-Tenant"] == "%E7%A7%9F%E6%88%B7-%CE%B1"
    assert all(v.isascii() for v in headers.values())
    info = answer.info(None, 2).model_copy(update={"lane": "batch"})
    final = answer.final_headers(info)
    assert final["X-Batchpilot-Lane"] == "batch" and final["X-Batchpilot-Prompt-Tokens"] == "7"


def test_the_admitted_lanes_own_slo_is_the_answers():
    live = LiveConfig(default_slo=LaneSLO(ttft_s=60.0))
    slos = {lane: from_decision(fmt(), AdmissionDecision(True, "req-1", lane=lane), live).slo
            for lane in ("interactive", "long_context", "batch")}
    assert slos == {"interactive": SLOTargets(ttft_s=5.0, tpot_s=0.5),
                    "long_context": SLOTargets(ttft_s=30.0, tpot_s=1.0),
                    "batch": SLOTargets(ttft_s=60.0, tpot_s=None)}
    unset = from_decision(fmt(), AdmissionDecision(True, "req-1", lane="batch"), LiveConfig())
    assert unset.slo is None
