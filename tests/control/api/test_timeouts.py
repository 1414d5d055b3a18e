"""Request timeout, deadline, stream idle timeout, engine errors: each abort frees the request's KV
blocks and is counted by its reason."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.serving import asgi_client, kv_in_use, make_engine, sse_events, wait_until_idle


# 20 ms a step: 400 tokens take 8 s; the limit is 300 ms away. A deadline ("done by") is no
# client abort; it is checked while running too (the first request: no throughput measured
# yet, so admission estimates nothing and accepts it).
@pytest.mark.parametrize(("header", "detail", "aborts"), [
    ("X-Request-Timeout-Ms", "request timeout", {"request_timeout": 1}),
    ("X-Deadline-Ms", "deadline passed while running", {}),
])
def test_a_request_out_of_time_answers_with_what_it_has(tiny_loaded, header, detail, aborts):
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.02)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            resp = await client.post("/v1/completions", headers={header: "300"}, json={
                "prompt": "The scheduler", "max_tokens": 400, "ignore_eos": True})
            await wait_until_idle(engine)
            return resp, await kv_in_use(engine)

    resp, used = asyncio.run(scenario())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "timeout"
    assert body["batchpilot"]["finish_detail"] == detail
    assert 0 < body["usage"]["completion_tokens"] < 400
    assert 0.3 <= body["batchpilot"]["timing"]["e2e_s"] < 5.0
    assert engine.abort_counts == aborts
    assert used == 0


def test_server_max_request_timeout_caps_the_header(tiny_loaded):
    from control.serve.settings import ServeSettings

    engine, _, settings = make_engine(
        tiny_loaded, delay_s=0.02, settings=ServeSettings(model="tiny",
                                                          max_request_timeout_s=0.3))

    async def scenario():
        async with asgi_client(engine, settings) as client:
            return await client.post("/v1/completions", headers={
                "X-Request-Timeout-Ms": "600000"}, json={
                "prompt": "The scheduler", "max_tokens": 400, "ignore_eos": True})

    body = asyncio.run(scenario()).json()
    assert body["choices"][0]["finish_reason"] == "timeout"
    assert engine.abort_counts == {"request_timeout": 1}


def test_stream_idle_timeout_ends_a_stalled_stream(tiny_loaded, tmp_path):
    # Each step takes 0.3 s; a stream may idle 0.1 s between tokens.
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.3, stream_idle_timeout_ms=100)
    request = {"prompt": "The scheduler", "max_tokens": 50, "ignore_eos": True}

    async def scenario():
        async with asgi_client(engine, settings) as client:
            stream = await client.post("/v1/completions", json={**request, "stream": True})
            # The idle timeout is for streams: a plain request waits for its tokens.
            plain = await client.post("/v1/completions", json={**request, "max_tokens": 3})
            await wait_until_idle(engine)
            return stream, plain, await kv_in_use(engine)

    stream, plain, used = asyncio.run(scenario())
    events = sse_events(stream.text.splitlines())
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["choices"][0]["finish_reason"] == "timeout"
    assert final["batchpilot"]["finish_detail"] == "stream idle timeout"
    assert final["batchpilot"]["usage"]["completion_tokens"] < 5
    assert plain.json()["choices"][0]["finish_reason"] == "length"
    assert engine.abort_counts == {"stream_idle_timeout": 1}
    assert used == 0


class _FailingOnce:
    def __init__(self, inner):
        self.inner, self.failed = inner, False

    def execute(self, out):
        if not self.failed:
            self.failed = True
            raise RuntimeError("device lost")
        return self.inner.execute(out)


def test_an_engine_error_fails_the_batch_and_the_server_goes_on(tiny_loaded):
    engine, spy, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            await engine.call(lambda e: setattr(e, "executor", _FailingOnce(e.executor)))
            failed = await client.post("/v1/completions", json={"prompt": "Hi"})
            stream = await client.post("/v1/completions", json={
                "prompt": "Hi", "max_tokens": 3, "stream": True})
            await wait_until_idle(engine)
            return failed, stream, await kv_in_use(engine)

    failed, stream, used = asyncio.run(scenario())
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "engine_error"
    assert "device lost" not in failed.text
    assert sse_events(stream.text.splitlines())[-2]["choices"][0]["finish_reason"] == "length"
    assert engine.abort_counts == {}  # a failed step is no abort: the engine ends it
    assert engine.step_health.failed_requests == 1
    assert used == 0
