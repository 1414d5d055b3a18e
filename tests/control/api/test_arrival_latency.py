"""Issue 22: the latency a user sees is the latency the server reports.

A long prefill holds the engine thread for one long step; a short streamed request that
arrives meanwhile waits for that step to end before the engine thread even takes it. The
server must count that wait (queue delay, TTFT) from when the request reached it, agree
with the client's stopwatch within 100 ms, and say in the trace where the wait went.
"""

from __future__ import annotations

import asyncio
import json
import time

import duckdb
import httpx
from fixtures.long_step import LONG_PROMPT, LongPrefill
from fixtures.serving import LiveServer, make_engine

from control.serve.settings import ServeSettings

LONG_STEP_S = 1.5  # the step that runs the long prompt's prefill
SHORT_AFTER_S = 0.3  # the short request is sent this long after the long one
TOLERANCE_S = 0.1


async def _short_stream(client: httpx.AsyncClient, url: str) -> tuple[float, dict]:
    """(client-measured TTFT, the final chunk's batchpilot object)."""
    sent = time.perf_counter()
    first: float | None = None
    info = None
    async with client.stream("POST", f"{url}/v1/completions", json={
            "prompt": "Hi", "max_tokens": 2, "ignore_eos": True, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            info = chunk.get("batchpilot") or info
    assert first is not None and info is not None
    return first - sent, info


def test_server_ttft_counts_the_wait_behind_a_long_prefill(tiny_loaded, tmp_path):
    db = tmp_path / "trace.duckdb"
    engine, _, settings = make_engine(
        tiny_loaded, settings=ServeSettings(model="tiny", trace_db=str(db)),
        prefill_chunk_size=512, max_num_batched_tokens=512)
    long_step = LongPrefill(engine.parts.engine.executor, LONG_STEP_S)
    engine.parts.engine.executor = long_step  # the engine thread is idle: nothing runs yet

    async def scenario(url: str) -> tuple[float, dict, int]:
        async with httpx.AsyncClient(timeout=60) as client:
            sent = time.perf_counter()
            long = asyncio.ensure_future(client.post(f"{url}/v1/completions", json={
                "prompt": LONG_PROMPT, "max_tokens": 1}))
            assert await asyncio.to_thread(long_step.started.wait, 10), "no long step"
            await asyncio.sleep(max(0.0, sent + SHORT_AFTER_S - time.perf_counter()))
            client_ttft, info = await _short_stream(client, url)
            long_resp = await long
            assert long_resp.status_code == 200
            return client_ttft, info, long_resp.json()["usage"]["prompt_tokens"]

    with LiveServer(engine, settings) as url:
        client_ttft, info, long_tokens = asyncio.run(scenario(url))
    assert long_tokens >= 200
    timing = info["timing"]
    # The short request waited most of the long step: the client saw it, so must the server.
    assert client_ttft > LONG_STEP_S - SHORT_AFTER_S - 0.2, client_ttft
    assert abs(timing["ttft_s"] - client_ttft) < TOLERANCE_S, (timing, client_ttft)
    assert timing["queue_delay_s"] > LONG_STEP_S - SHORT_AFTER_S - 0.2 - TOLERANCE_S, timing
    assert timing["queue_delay_s"] <= timing["ttft_s"]

    # The trace says where the wait went: the engine thread was busy, and the reasons add
    # up to the queue delay.
    con = duckdb.connect(str(db), read_only=True)
    queue_delay, reasons = con.execute(
        "SELECT queue_delay_s, wait_reasons FROM requests WHERE request_id = ?",
        [info["request_id"]]).fetchone()
    con.close()
    assert abs(queue_delay - timing["queue_delay_s"]) < 1e-6
    assert abs(sum(reasons.values()) - queue_delay) < 1e-3, reasons
    assert reasons.get("engine_busy", 0.0) > queue_delay - TOLERANCE_S, reasons
    assert "tokenize" in reasons, reasons
