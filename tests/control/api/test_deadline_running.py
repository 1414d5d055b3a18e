"""X-Deadline-Ms means "done by" on a live server (issue 17, item 8): a request still
running at its deadline answers with the tokens it has, finish_reason "timeout", and says
why; its KV is freed."""

from __future__ import annotations

import asyncio

from fixtures.serving import asgi_client, kv_in_use, make_engine, wait_until_idle


def test_a_request_running_past_its_deadline_answers_with_what_it_has(tiny_loaded):
    # 20 ms a step: 400 tokens take 8 s; the deadline is 300 ms away. The first request,
    # so no throughput is measured yet: admission estimates nothing and accepts it.
    engine, _, settings = make_engine(tiny_loaded, delay_s=0.02)

    async def scenario():
        async with asgi_client(engine, settings) as client:
            resp = await client.post("/v1/completions", headers={"X-Deadline-Ms": "300"},
                                     json={"prompt": "The scheduler", "max_tokens": 400,
                                           "ignore_eos": True})
            await wait_until_idle(engine)
            return resp, await kv_in_use(engine)

    resp, used = asyncio.run(scenario())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "timeout"
    assert body["batchpilot"]["finish_detail"] == "deadline passed while running"
    assert 0 < body["usage"]["completion_tokens"] < 400
    assert 0.3 <= body["batchpilot"]["timing"]["e2e_s"] < 5.0
    assert used == 0
