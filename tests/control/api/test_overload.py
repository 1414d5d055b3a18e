"""A burst beyond the lane queue limits: 429s with Retry-After, no 5xx, and every accepted
request completes (real HTTP, uvicorn in a thread on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import httpx
from fixtures.serving import LiveServer, kv_in_use, make_engine, wait_until_idle

BURST = 40
CONFIG = {
    "serving": {"max_active_sequences": 2, "max_waiting_requests": 12},
    "lanes": {"interactive": {"weight": 4, "policy": "priority", "max_waiting": 4,
                              "slo": {"ttft_s": 30, "tpot_s": 5}},
              "long_context": {"weight": 2}, "batch": {"weight": 1, "max_waiting": 6}},
}


def test_a_burst_gets_429s_and_every_accepted_request_completes(tiny_loaded, tmp_path):
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.05, config=CONFIG,
                                      tmp_path=tmp_path)

    async def one(client: httpx.AsyncClient, url: str, i: int) -> httpx.Response:
        lane = "batch" if i % 2 else "interactive"
        return await client.post(f"{url}/v1/completions", headers={"X-Lane": lane}, json={
            "prompt": f"Request {i}", "max_tokens": 8, "ignore_eos": True})

    async def scenario(url: str):
        limits = httpx.Limits(max_connections=BURST)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            responses = await asyncio.gather(*[one(client, url, i) for i in range(BURST)])
        await wait_until_idle(engine)
        return responses, await kv_in_use(engine)

    with LiveServer(engine, settings) as url:
        responses, used = asyncio.run(scenario(url))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses  # no 5xx, nothing else
    rejected = [r for r in responses if r.status_code == 429]
    accepted = [r for r in responses if r.status_code == 200]
    # 2 run and 4 + 6 wait; a request runs >= 0.4 s (8 steps of >= 50 ms), so most of a
    # burst that arrives within a fraction of that finds the queues full
    assert len(rejected) >= BURST // 2, statuses
    assert len(accepted) >= 4 + 6, statuses  # the lane queues were filled
    for r in rejected:
        assert int(r.headers["retry-after"]) >= 1
        error = r.json()["error"]
        assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
        assert "max_waiting" in error["message"]
    for r in accepted:
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 8
    lanes = {r.json()["batchpilot"]["lane"] for r in accepted}
    assert lanes == {"batch", "interactive"}
    for r in accepted:  # each response names its lane's SLO, the targets goodput counts by
        info = r.json()["batchpilot"]
        assert info["slo"] == ({"ttft_s": 30, "tpot_s": 5} if info["lane"] == "interactive"
                               else None)
    assert used == 0
