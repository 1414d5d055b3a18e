"""The HTTP API over ASGI (httpx): bodies, headers, routing metadata, probes."""

from __future__ import annotations

import asyncio

from fixtures.serving import asgi_client, kv_in_use, make_engine, sse_events, wait_until_idle

from control.api.response_schemas import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    ModelList,
)

TIMING = ("queue_delay_s", "ttft_s", "prefill_time_s", "decode_time_s", "e2e_s", "tpot_s")


def test_completion_carries_usage_timing_and_headers(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    prompt = "The scheduler picks the running decodes"
    num_prompt = len(tiny_loaded.tokenizer.encode(prompt, add_special_tokens=False))

    async def scenario():
        async with asgi_client(engine, settings) as client:
            resp = await client.post("/v1/completions", json={
                "model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            body = CompletionResponse.model_validate(resp.json())
            assert body.usage.model_dump() == {"prompt_tokens": num_prompt,
                                               "completion_tokens": 6,
                                               "total_tokens": num_prompt + 6}
            assert body.choices[0].finish_reason == "length"
            info = body.batchpilot
            assert (info.lane, info.tenant, info.priority) == ("interactive", "default", 0)
            timing = info.timing
            assert all(getattr(timing, k) is not None for k in TIMING), timing
            assert 0 <= timing.queue_delay_s <= timing.ttft_s <= timing.e2e_s
            h = resp.headers
            assert h["x-batchpilot-request-id"] == body.id == info.request_id
            assert body.id.startswith("cmpl-")
            assert h["x-batchpilot-lane"] == "interactive"
            assert h["x-batchpilot-tenant"] == "default"
            assert float(h["x-batchpilot-e2e-s"]) == round(timing.e2e_s, 6)
            assert float(h["x-batchpilot-ttft-s"]) > 0
            assert h["x-batchpilot-completion-tokens"] == "6"
            await wait_until_idle(engine)
            assert await kv_in_use(engine) == 0

    asyncio.run(scenario())


def test_chat_stream_matches_non_stream_and_ends_with_usage(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)
    request = {"messages": [{"role": "user", "content": "Hello world!"}], "max_tokens": 12,
               "temperature": 0, "ignore_eos": True}

    async def scenario():
        async with asgi_client(engine, settings) as client:
            whole = await client.post("/v1/chat/completions", json=request)
            assert whole.status_code == 200, whole.text
            body = ChatCompletionResponse.model_validate(whole.json())
            resp = await client.post("/v1/chat/completions", json={
                **request, "stream": True, "stream_options": {"include_usage": True}})
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-batchpilot-request-id"].startswith("chatcmpl-")
            assert resp.headers["x-batchpilot-lane"] == "interactive"
            assert "x-batchpilot-e2e-s" not in resp.headers  # unknown when a stream starts
            return body, sse_events(resp.text.splitlines())

    body, events = asyncio.run(scenario())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:  # OpenAI's chunk shape, plus the extension in the last ones
        ChatCompletionChunk.model_validate(chunk)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"])
    assert text == body.choices[0].message.content
    finish, usage_chunk = chunks[-2], chunks[-1]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["batchpilot"]["usage"]["completion_tokens"] == 12
    assert all(finish["batchpilot"]["timing"][k] is not None for k in TIMING)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == body.usage.model_dump()
    assert all(c["usage"] is None for c in chunks[:-1])  # OpenAI's include_usage shape


def test_routing_metadata_from_headers_and_body(tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, long_context_threshold=40)
    long_prompt = "Each block of the key value cache holds sixteen tokens. " * 4

    async def info(client, headers=None, **body):
        resp = await client.post("/v1/completions", headers=headers or {}, json={
            "prompt": "Hello", "max_tokens": 2, **body})
        assert resp.status_code == 200, resp.text
        return resp.json()["batchpilot"], resp.headers

    async def scenario():
        async with asgi_client(engine, settings) as client:
            got, headers = await info(client, {"X-Tenant": "acme"}, user="bob")
            assert got["tenant"] == "acme" and headers["x-batchpilot-tenant"] == "acme"
            assert (await info(client, user="bob"))[0]["tenant"] == "bob"
            assert (await info(client))[0]["tenant"] == "default"
            got, headers = await info(client, {"X-Lane": "batch"})
            assert got["lane"] == "batch" and headers["x-batchpilot-lane"] == "batch"
            assert (await info(client, prompt=long_prompt))[0]["lane"] == "long_context"
            assert (await info(client, {"X-Lane": "interactive"}, prompt=long_prompt)
                    )[0]["lane"] == "interactive"
            got, headers = await info(client, {"X-Priority": "-3"})
            assert got["priority"] == -3 and headers["x-batchpilot-priority"] == "-3"
            # the header wins: a gateway that sets it decides, whatever the client's body says
            assert (await info(client, {"X-Priority": "-3"}, priority=5))[0]["priority"] == -3
            assert (await info(client, priority=5))[0]["priority"] == 5
            got, _ = await info(client, {"X-Deadline-Ms": "60000"})
            assert got["finish_reason"] == "length"

    asyncio.run(scenario())


def test_probes_and_models(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["status"] == "ready"
            models = ModelList.model_validate((await client.get("/v1/models")).json())
            assert [m.id for m in models.data] == ["tiny"]
            assert models.data[0].max_model_len == 512
            engine.start_draining()
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert "draining" in ready.json()["reason"]
            assert (await client.get("/healthz")).status_code == 200  # still alive

    asyncio.run(scenario())


def test_a_model_started_by_its_path_is_served_by_its_name_and_that_path(tiny_loaded):
    """`--model checkpoints/tiny/` (a trailing slash as a shell completes it): /v1/models
    lists "tiny", and a request may name the model either way."""
    from control.serve.settings import ServeSettings

    engine, _, settings = make_engine(tiny_loaded,
                                      settings=ServeSettings(model="checkpoints/tiny/"))

    async def scenario():
        async with asgi_client(engine, settings) as client:
            models = (await client.get("/v1/models")).json()
            by = [await client.post("/v1/completions", json={
                "model": model, "prompt": "Hi", "max_tokens": 1})
                for model in ("tiny", "checkpoints/tiny/", "other")]
            return models, by

    models, (by_name, by_path, other) = asyncio.run(scenario())
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert by_name.status_code == by_path.status_code == 200, (by_name.text, by_path.text)
    assert other.status_code == 404


def test_readyz_is_503_while_the_engine_thread_is_stuck_past_stall_after_s(tiny_loaded):
    """The engine thread busy past stall_after_s (here, a call it runs that does not
    return): /readyz is 503 saying the loop made no progress."""
    import threading

    from control.serve.settings import ServeSettings

    engine, _, settings = make_engine(tiny_loaded,
                                      settings=ServeSettings(model="tiny", stall_after_s=0.05))
    started, release = threading.Event(), threading.Event()

    def hold(_engine) -> None:
        started.set()
        release.wait(30)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            held = asyncio.ensure_future(engine.call(hold))
            assert await asyncio.to_thread(started.wait, 10)
            await asyncio.sleep(0.2)  # the thread is now stuck 4 x stall_after_s
            ready = await client.get("/readyz")
            release.set()
            await held
            return ready

    ready = asyncio.run(scenario())
    assert ready.status_code == 503
    assert "made no progress" in ready.json()["reason"]


def test_readyz_fails_when_the_model_failed_to_load():
    from control.api.app import create_app
    from control.serve.engine_loop import AsyncEngine
    from control.serve.settings import ServeSettings

    def broken():
        raise FileNotFoundError("no such checkpoint 'nowhere'")

    engine = AsyncEngine(broken).start()
    engine.loaded.wait(10)

    async def scenario():
        import httpx

        app = create_app(ServeSettings(model="tiny"), engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert "no such checkpoint" in ready.json()["reason"]
            resp = await client.post("/v1/completions", json={"prompt": "Hi"})
            assert resp.status_code == 503 and resp.headers["retry-after"]
            assert resp.json()["error"]["code"] == "loading"

    asyncio.run(scenario())
