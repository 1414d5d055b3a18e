"""SIGTERM during streams: the server stops admitting (503), lets in-flight requests finish
within the grace period, ends the rest with a clear final event, and exits 0."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from fixtures.serving import ServerProcess, sse_events

GRACE_S = 0.5  # well under the long streams' ~1 s of decoding at >= 2 ms a step
CONFIG = {"serving": {"num_kv_blocks": 256}}


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


def test_sigterm_drains_then_exits_zero(tiny_llama_dir, tmp_path):
    with ServerProcess(tiny_llama_dir, tmp_path, CONFIG,
                       "--shutdown-grace-s", str(GRACE_S)) as server:
        url = server.url

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as client:
                # Two streams far longer than the grace period (480 tokens at >= 2 ms a
                # step), then one that needs a fraction of it.
                long = [asyncio.ensure_future(_chat_stream(client, url, 480))
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
        assert 0 < final["batchpilot"]["usage"]["completion_tokens"] < 480
    assert "Traceback" not in log
