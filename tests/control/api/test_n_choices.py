"""n > 1 through the HTTP API with the official `openai` client: one choice per index,
streaming and not, usage counting the prompt once, seeds seed + i, the prompt's blocks
shared through the prefix cache, and a client that leaves cancelling every choice."""

from __future__ import annotations

import asyncio
import time
import uuid

import openai
import pytest
from fixtures.serving import LiveServer, make_engine

HELLO = [{"role": "user", "content": "Hello world! How are you today?"}]
LONG_PROMPT = ("Each block of the key value cache holds sixteen tokens of one sequence. When"
               " the cache is almost full, the scheduler preempts a request")


@pytest.fixture(scope="module")
def api(tiny_loaded, one_torch_thread):
    engine, spy, settings = make_engine(tiny_loaded)
    with LiveServer(engine, settings) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=60)
        yield client, engine, spy, tiny_loaded.tokenizer
    engine.stop()


def on_engine(engine, fn):
    return asyncio.run(engine.call(fn))


def test_completions_n_greedy_choices_share_the_prompt_blocks(api):
    client, engine, _, tok = api
    prompt_len = len(tok.encode(LONG_PROMPT, add_special_tokens=False))
    hits = on_engine(engine, lambda e: e.block_manager.prefix_hit_tokens)
    out = client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=5, n=3,
                                    temperature=0, extra_body={"ignore_eos": True,
                                                               "cache_salt": uuid.uuid4().hex})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 1  # greedy: the same text
    assert out.usage.prompt_tokens == prompt_len  # the prompt once
    assert out.usage.completion_tokens == 15 and out.usage.total_tokens == prompt_len + 15
    full = (prompt_len - 1) // 16 * 16
    assert full >= 16
    assert on_engine(engine, lambda e: e.block_manager.prefix_hit_tokens) - hits == 2 * full


def test_seeded_choices_use_seed_plus_index(api):
    client = api[0]
    kwargs = {"model": "tiny", "prompt": "The scheduler", "max_tokens": 12,
              "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    both = client.completions.create(**kwargs, n=2, seed=5).choices
    alone = [client.completions.create(**kwargs, seed=s).choices[0].text for s in (5, 6)]
    assert [c.text for c in both] == alone and alone[0] != alone[1]


def test_chat_n_streaming_agrees_with_the_whole_reply(api):
    client = api[0]
    kwargs = {"model": "tiny", "messages": HELLO, "max_tokens": 6, "n": 2, "seed": 3,
              "logprobs": True, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == ["length"]
        streamed = [e.logprob for c in mine if c.logprobs for e in c.logprobs.content]
        # batches differ between the two runs: the same tokens, logprobs to float noise
        assert streamed == pytest.approx([e.logprob for e in choice.logprobs.content],
                                         abs=1e-4)
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []


def test_a_client_that_leaves_cancels_every_choice(api):
    client, engine, spy, _ = api
    before = dict(engine.abort_counts)
    spy.delay_s = 0.05  # 300 tokens would take 15 s
    try:
        stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=300, n=2,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
        deadline = time.monotonic() + 10
        while on_engine(engine, lambda e: e.has_unfinished_requests()):
            assert time.monotonic() < deadline, "the choices were not cancelled"
            time.sleep(0.05)
    finally:
        spy.delay_s = 0.0
    aborted = engine.abort_counts["client_disconnect"] - before.get("client_disconnect", 0)
    assert aborted == 2
    assert on_engine(engine, lambda e: e.block_manager.num_used) == 0


def test_best_of_and_too_many_choices_are_400(api):
    client = api[0]
    for kwargs, param in (({"n": 17}, "n"), ({"best_of": 3}, None)):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2, **kwargs)
        assert ("n=17" if param else "best_of=3") in err.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_echoed_prompt_logprobs_come_from_the_first_choice_for_all(api, stream):
    """Only the first choice computes the prompt's logprobs (a later one asking would
    skip the prefix cache): every choice shows them, and the later one still hits."""
    client, engine, _, tok = api
    prompt_len = len(tok.encode(LONG_PROMPT, add_special_tokens=False))
    hits = on_engine(engine, lambda e: e.block_manager.prefix_hit_tokens)
    kwargs = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 3, "n": 2, "echo": True,
              "logprobs": 1, "temperature": 0,
              "extra_body": {"ignore_eos": True, "cache_salt": uuid.uuid4().hex}}
    if stream:
        chunks = list(client.completions.create(**kwargs, stream=True))
        by_choice = [[v for c in chunks for v in (c.choices[0].logprobs.token_logprobs
                                                  if c.choices[0].logprobs else [])
                      if c.choices[0].index == i] for i in (0, 1)]
    else:
        out = client.completions.create(**kwargs)
        by_choice = [c.logprobs.token_logprobs for c in out.choices]
    for values in by_choice:
        assert len(values) == prompt_len + 3 and values[0] is None
        assert all(v is not None for v in values[1:])
    assert by_choice[0][:prompt_len] == by_choice[1][:prompt_len]
    full = (prompt_len - 1) // 16 * 16
    assert on_engine(engine, lambda e: e.block_manager.prefix_hit_tokens) - hits == full


class RecordingEngine:
    """AsyncEngine's add/abort as admit_choices uses them: every submission recorded, the
    `refuse_at`-th (0-based) refused."""

    def __init__(self, refuse_at: int | None = None):
        self.added, self.aborted, self.refuse_at = [], [], refuse_at

    async def add(self, sub):
        from engine.records import AdmissionDecision

        self.added.append(sub)
        if len(self.added) - 1 == self.refuse_at:
            return AdmissionDecision(False, sub.request_id, "queue_full"), None
        return AdmissionDecision(True, sub.request_id), type("Stream", (), {
            "request_id": sub.request_id})()

    def abort(self, request_id, reason):
        self.aborted.append((request_id, reason))


def submission(seed=None):
    from control.serve.streams import Submission
    from engine import SamplingParams
    from engine.request import TraceLink

    return Submission("req", "x", [1, 2, 3], SamplingParams(seed=seed, prompt_logprobs=2),
                      trace=TraceLink("a" * 32, "b" * 16))


def test_later_choices_wait_for_the_first_ones_prompt_with_seeds_of_their_own():
    """The wiring the engine's sibling wait relies on (engine/request.py waits_for_sibling):
    without wait_for, choice i would compute the whole prompt again, unseen by any
    timing-based test whenever the first choice's prefill won the race."""
    from control.api.choices import SEED_MODULUS, admit_choices

    engine = RecordingEngine()
    decision, streams = asyncio.run(admit_choices(engine, submission(SEED_MODULUS - 2), 3))
    assert decision.accepted and [s.request_id for s in streams] == ["req", "req-1", "req-2"]
    first, *later = engine.added
    assert first.wait_for is None and [s.wait_for for s in later] == ["req", "req"]
    assert [s.params.seed for s in engine.added] == [SEED_MODULUS - 2, SEED_MODULUS - 1, 0]
    assert [s.params.prompt_logprobs for s in engine.added] == [2, None, None]
    assert len({s.trace.span_id for s in engine.added}) == 3  # one span each, one trace
    assert {s.trace.trace_id for s in engine.added} == {"a" * 32}


def test_a_refused_later_choice_ends_the_admitted_ones():
    from control.api.choices import admit_choices

    engine = RecordingEngine(refuse_at=2)
    decision, streams = asyncio.run(admit_choices(engine, submission(), 3))
    assert not decision.accepted and decision.reason == "queue_full" and streams == []
    assert engine.aborted == [("req", "choice_rejected"), ("req-1", "choice_rejected")]
