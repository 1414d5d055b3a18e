"""The official `openai` client against `batchpilot serve` (a subprocess on 127.0.0.1)."""

from __future__ import annotations

import openai
import pytest
from fixtures.serving import ServerProcess

CONFIG = {"serving": {"num_kv_blocks": 256, "max_active_sequences": 16}}
HELLO = [{"role": "user", "content": "Hello world! How are you today?"}]


@pytest.fixture(scope="module")
def client(tiny_llama_dir, tmp_path_factory):
    with ServerProcess(tiny_llama_dir, tmp_path_factory.mktemp("serve"), CONFIG,
                       "--served-model-name", "tiny") as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                            timeout=60)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_chat_streaming_and_not_agree(client):
    kwargs = {"model": "tiny", "messages": HELLO, "max_tokens": 10, "temperature": 0,
              "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 10
    info = whole.model_extra["batchpilot"]
    assert info["lane"] == "interactive" and info["timing"]["ttft_s"] > 0
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10  # the include_usage chunk


def test_completions_streaming_and_not_agree(client):
    kwargs = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 12,
              "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**kwargs)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["batchpilot"]["usage"]["completion_tokens"] == 12


def test_seeded_sampling_repeats(client):
    def sample(seed: int, stream: bool = False) -> str:
        kwargs = {"model": "tiny", "prompt": "The scheduler", "max_tokens": 16,
                  "temperature": 1.0, "top_p": 0.9, "seed": seed,
                  "extra_body": {"ignore_eos": True, "top_k": 50}}
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(
                **kwargs, stream=True))
        return client.completions.create(**kwargs).choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert sample(7, stream=True) == first
    assert sample(8) != first  # the seed matters


def test_stop_strings_cut_the_text(client):
    kwargs = {"model": "tiny", "prompt": "The quick brown", "max_tokens": 24,
              "temperature": 0}
    free = client.completions.create(**kwargs).choices[0].text
    assert len(free) > 12, free
    stop = free[6:9]
    cut = free[:free.find(stop)]
    stopped = client.completions.create(**kwargs, stop=[stop])
    assert stopped.choices[0].text == cut
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 24
    chunks = list(client.completions.create(**kwargs, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_errors_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt="Hi", n=17)
    assert "n=17" in bad.value.message
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="tiny", prompt="Hello world! " * 300, max_tokens=4)
    assert "512" in long.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
