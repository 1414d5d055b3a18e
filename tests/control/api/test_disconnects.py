"""Clients that leave: over real HTTP (uvicorn in a thread on 127.0.0.1), a closed stream
aborts its request, frees its KV blocks and is counted; a queued request never runs."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from fixtures.serving import (
    LiveServer,
    asgi_client,
    kv_in_use,
    make_engine,
    requests_ended,
    wait_until_idle,
)

from control.serve.streams import Submission
from engine import SamplingParams

NUM_STREAMS = 50
MAX_TOKENS = 60


async def _stream(client: httpx.AsyncClient, url: str, leave: asyncio.Event | None = None,
                  ) -> tuple[str, list[str]]:
    """Read a completion stream to its end; or, given `leave`, hold it open unread until
    `leave` is set, then close the connection."""
    events: list[str] = []
    async with client.stream("POST", f"{url}/v1/completions", json={
            "prompt": "The scheduler", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True}) as resp:
        assert resp.status_code == 200
        if leave is not None:
            await leave.wait()
            return "closed", events  # leaving the block closes the connection
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    return "read", events


async def _until(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def test_disconnect_storm_frees_every_block(tiny_loaded):
    # 50 ms per step: a stream lasts seconds, so the clients surely leave mid-stream.
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.05)

    async def scenario(url: str):
        leave = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:
            streams = asyncio.gather(*[
                _stream(client, url, leave if i % 2 == 0 else None)
                for i in range(NUM_STREAMS)])
            await _until(lambda: engine.stats.running == NUM_STREAMS, 60)
            steps = engine.stats.steps
            await _until(lambda: engine.stats.steps >= steps + 3, 60)  # tokens flowing
            leave.set()  # half the clients leave, each ~55 tokens before its end
            results = await streams
        await _until(lambda: engine.abort_counts["client_disconnect"] >= NUM_STREAMS // 2, 30)
        await wait_until_idle(engine)
        return results, await kv_in_use(engine)

    with LiveServer(engine, settings) as url:
        results, used = asyncio.run(scenario(url))
    closed = [events for how, events in results if how == "closed"]
    read = [events for how, events in results if how == "read"]
    assert len(closed) == len(read) == NUM_STREAMS // 2
    for events in read:  # the streams that stayed got everything
        assert events[-1] == "[DONE]"
        assert '"finish_reason":"length"' in events[-2]
        assert f'"completion_tokens":{MAX_TOKENS}' in events[-2]
    assert used == 0  # the idle level: no block held by any request
    assert engine.abort_counts == {"client_disconnect": NUM_STREAMS // 2}
    assert engine.stats.streams == 0


def test_a_queued_request_whose_client_leaves_never_runs(tiny_loaded):
    engine, spy, settings = make_engine(tiny_loaded, delay_s=0.01, max_num_seqs=1)

    async def scenario(url: str):
        async with httpx.AsyncClient(timeout=60) as client:
            first = asyncio.ensure_future(_stream(client, url))
            await _until(lambda: engine.stats.running == 1, 30)
            async with client.stream("POST", f"{url}/v1/completions", json={
                    "prompt": "Hello", "max_tokens": 5, "stream": True}) as resp:
                queued_id = resp.headers["x-batchpilot-request-id"]
                await _until(lambda: engine.stats.waiting == 1, 30)
            # the client has left while its request waited behind the first one
            await _until(lambda: engine.abort_counts["client_disconnect"] == 1, 30)
            how, events = await first
            await wait_until_idle(engine)
            metrics = (await client.get(f"{url}/metrics")).text
            return queued_id, how, events, await kv_in_use(engine), metrics

    with LiveServer(engine, settings) as url:
        queued_id, how, events, used, metrics = asyncio.run(scenario(url))
    assert how == "read" and events[-1] == "[DONE]"
    # the dashboards count it as a client that left, not as a request out of time
    assert requests_ended(metrics, "cancelled", "client_disconnected") == 1
    assert requests_ended(metrics, "timeout", "client_disconnected") == 0
    assert queued_id not in spy.ran  # never scheduled, not even a prefill chunk
    assert len(spy.ran) == 1
    assert engine.abort_counts == {"client_disconnect": 1}
    assert used == 0


def test_an_abort_that_comes_after_the_request_finished_is_not_counted(tiny_loaded):
    """The client's abort can reach the engine thread after its request finished (the
    answer was on its way): nothing is aborted, so /readyz's `aborts` does not count it."""
    engine, _, settings = make_engine(tiny_loaded)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            done = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert done.status_code == 200, done.text
            engine.abort(done.json()["id"], "client_disconnect")
            await engine.call(lambda e: None)  # after the abort command
            return await client.get("/readyz")

    ready = asyncio.run(scenario())
    assert ready.json()["aborts"] == {}


def test_a_client_that_leaves_before_admission_leaves_no_error_in_the_log(tiny_loaded,
                                                                          caplog):
    """The engine thread answers an admission whose caller has left (the client went away
    while the engine was busy): the answer is dropped, where raising it on the event loop
    would log an asyncio error with a traceback for every such client."""
    engine, _, _ = make_engine(tiny_loaded)
    sub = Submission("cmpl-left", "Hi", [1, 2, 3], SamplingParams(max_tokens=2))

    async def scenario():
        busy = asyncio.ensure_future(engine.call(lambda e: time.sleep(0.3)))
        await asyncio.sleep(0.05)  # the engine thread is in that call
        adding = asyncio.ensure_future(engine.add(sub))
        await asyncio.sleep(0.05)
        adding.cancel()  # the client leaves while its admission waits
        await busy
        await wait_until_idle(engine)  # answered after the add: its answer has run

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        try:
            asyncio.run(scenario())
        finally:
            engine.stop()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    assert engine.abort_counts == {"client_disconnect": 1}
