"""SIGTERM during streams: the server stops admitting (503), lets in-flight requests finish
within the grace period, ends the rest with a clear final event, and exits 0."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fixtures.serving import ServerProcess, sse_events
from fixtures.tiny_models import TINY_LLAMA, write_checkpoint

GRACE_S = 0.5
# The long streams decode far longer than the grace period at any plausible speed: 4000
# tokens at ~1 ms a step (the tiny model in the native decode layers) is ~4 s; the tiny
# checkpoint's 512 positions (480 tokens, ~0.6 s) were once enough and no longer are.
LONG_TOKENS, CONTEXT = 4000, 4096
CONFIG = {"serving": {"num_kv_blocks": 1024}}  # 16-token blocks: both long streams fit


@pytest.fixture(scope="module")
def long_context_llama_dir(tmp_path_factory):
    """The tiny Llama with CONTEXT positions."""
    spec = dict(TINY_LLAMA)
    arch, seed = spec.pop("arch"), spec.pop("seed")
    return write_checkpoint(tmp_path_factory.mktemp("tiny-llama-long"), arch, seed, **spec,
                            max_position_embeddings=CONTEXT)


async def _chat_stream(client: httpx.AsyncClient, url: str, max_tokens: int) -> list:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        return sse_events([line async for line in resp.aiter_lines()])


async def _running(client: httpx.AsyncClient, url: str, count: int, streams: list,
                   quick: asyncio.Future | None = None) -> None:
    """Until `count` requests run. `streams` must not end first (one that does says why);
    `quick`, a stream of a few steps, may end between two polls: that also ends the wait."""
    deadline = time.monotonic() + 30
    while (await client.get(f"{url}/readyz")).json()["engine"]["running"] < count:
        ended = [s for s in streams if s.done()]
        assert not ended, f"a stream ended before the others ran: {ended[0].result()}"
        if quick is not None and quick.done():
            return
        assert time.monotonic() < deadline, "the streams never ran"
        await asyncio.sleep(0.02)


def test_sigterm_drains_then_exits_zero(long_context_llama_dir, tmp_path):
    with ServerProcess(long_context_llama_dir, tmp_path, CONFIG,
                       "--shutdown-grace-s", str(GRACE_S)) as server:
        url = server.url

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as client:
                # Two streams far longer than the grace period, then one that needs a
                # fraction of it.
                long = [asyncio.ensure_future(_chat_stream(client, url, LONG_TOKENS))
                        for _ in range(2)]
                await _running(client, url, 2, long)
                short = asyncio.ensure_future(_chat_stream(client, url, 8))
                await _running(client, url, 3, long, quick=short)
                server.terminate()
                await asyncio.sleep(0.1)  # draining, well within the grace period
                refused = await client.post(f"{url}/v1/completions", json={"prompt": "Hi"})
                ready = await client.get(f"{url}/readyz")
                return await asyncio.gather(*long), await short, refused, ready

        long, short, refused, ready = asyncio.run(scenario())
        code = server.wait(30)
        log = server.log()
    assert code == 0, log
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "draining"
    assert ready.status_code == 503 and "draining" in ready.json()["reason"]
    # in flight and short: it finished normally
    assert short[-1] == "[DONE]"
    assert short[-2]["choices"][0]["finish_reason"] == "length"
    assert short[-2]["batchpilot"]["usage"]["completion_tokens"] == 8
    # still running when the grace period ended: a clear final event, then [DONE]
    for events in long:
        assert events[-1] == "[DONE]", events[-3:]
        final = events[-2]
        assert final["choices"][0]["finish_reason"] == "cancelled", json.dumps(final)
        assert final["error"]["code"] == "server_shutdown"
        assert "shutting down" in final["error"]["message"]
        assert final["batchpilot"]["finish_detail"] == "server shutting down"
        assert 0 < final["batchpilot"]["usage"]["completion_tokens"] < LONG_TOKENS
    assert "Traceback" not in log
