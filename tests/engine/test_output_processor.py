"""The output processor (engine/output/processor.py) at a request's last step: the text it
hands out then is the whole output (less a stop string), and the finish reason says why
the text ends where it does. Steps are built by hand, one sampled token a step."""

from __future__ import annotations

import pytest
from fixtures.tiny_models import build_tokenizer

from engine.output.processor import OutputProcessor
from engine.records import StepOutput
from engine.request import Request, SamplingParams

TEXT = "the quick brown fox"  # its last token is " fox"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def stream(tokenizer, params: SamplingParams) -> tuple[list, str]:
    """TEXT's tokens through the processor, one a step, the last ending the request by
    length -> (the outputs, the streamed text)."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    processor = OutputProcessor(tokenizer)
    processor.add("r", "Say:", prompt, params)
    req = Request("r", prompt, params, 0.0)
    outputs, streamed = [], ""
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        step = StepOutput(None, rows=[req], sampled=[token],
                          stop_reasons={"r": "length"} if last else {})
        changed, to_stop = processor.process(step)
        assert to_stop == []  # the request ends in this step anyway
        outputs += changed
        streamed += changed[0].delta_text
        if changed[0].finished:
            break
    return outputs, streamed


def test_the_last_output_hands_out_the_text_held_back_for_a_stop_string(tokenizer):
    """While streaming, the last characters wait in case they begin a stop string; when
    the request ends (by length here, the stop string never seen) they go out with the
    final delta: the answer is whole."""
    outputs, streamed = stream(tokenizer, SamplingParams(max_tokens=7, stop=("zzzz",)))
    final = outputs[-1]
    assert final.finished and final.finish_reason == "length"
    assert final.text == streamed == TEXT


def test_a_stop_string_completed_by_the_last_token_is_the_finish_reason(tokenizer):
    """The token that reaches max_tokens also completes the stop string: the text ends
    before the stop string, so the reason is "stop", not "length"."""
    outputs, streamed = stream(tokenizer, SamplingParams(max_tokens=7, stop=("fox",)))
    final = outputs[-1]
    assert final.finished and final.finish_reason == "stop"
    assert final.text == streamed == "the quick brown "
