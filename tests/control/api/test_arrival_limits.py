"""Issue 22: the limits a client sets, and the latency of a refusal, count from the
request's arrival at the server, not from when the engine thread took it.

A long step holds the engine thread; a request that arrives meanwhile has already spent
part of its X-Request-Timeout-Ms (and its client's patience) before admission.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from fixtures.long_step import LONG_PROMPT, LongPrefill
from fixtures.serving import asgi_client, kv_in_use, make_engine, wait_until_idle

from control.api.arrival import ARRIVAL_KEY, EDGE_ELAPSED_HEADER, StampArrival
from control.api.choices import choice_generations
from control.serve.streams import RequestStream
from engine.request import RequestStatus
from tests.engine.engine_helpers import make_engine as make_sim_engine

# The short request must reach the server early in the long step, so that its 0.5 s are
# gone before the engine thread takes it: 3 s leaves a loaded CI machine 2.5 s to send it
# (at 1.2 s, a request sent late could still finish its 3 tokens in time).
LONG_STEP_S = 3.0


def test_request_timeout_counts_from_arrival(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, prefill_chunk_size=512,
                                      max_num_batched_tokens=512)
    long_step = LongPrefill(engine.parts.engine.executor, LONG_STEP_S)
    engine.parts.engine.executor = long_step

    async def scenario():
        async with asgi_client(engine, settings) as client:
            long = asyncio.ensure_future(client.post("/v1/completions", json={
                "prompt": LONG_PROMPT, "max_tokens": 1}))
            assert await asyncio.to_thread(long_step.started.wait, 10), "no long step"
            # 0.5 s to live; the engine thread takes it only after the long step (~3 s)
            short = await client.post("/v1/completions", headers={
                "X-Request-Timeout-Ms": "500"}, json={
                "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
            assert (await long).status_code == 200
            await wait_until_idle(engine)
            return short, await kv_in_use(engine)

    short, used = asyncio.run(scenario())
    assert short.status_code == 200, short.text
    body = short.json()
    assert body["choices"][0]["finish_reason"] == "timeout", body
    assert body["batchpilot"]["timing"]["e2e_s"] >= 0.5, body["batchpilot"]["timing"]
    assert engine.abort_counts == {"request_timeout": 1}
    assert used == 0


def test_a_refusal_counts_its_wait_from_arrival():
    engine, clock = make_sim_engine()
    arrived = clock() - 2.5  # it reached the server 2.5 s before the engine could decide
    decision = engine.refuse("r0", [5, 6, 7], "draining", "shutting down",
                             arrival_time=arrived)
    assert not decision.accepted and decision.arrival_time == arrived
    records = engine.step().finished
    (record,) = [r for r in records if r.request_id == "r0"]
    assert record.status == RequestStatus.REJECTED.name
    assert record.arrival_time == arrived
    assert abs(record.e2e_s - 2.5) < 1e-9, record


def test_a_refusal_without_arrival_is_stamped_now():
    engine, clock = make_sim_engine()
    decision = engine.refuse("r0", [5, 6, 7], "draining", "shutting down")
    assert decision.arrival_time == decision.time == clock()


def test_every_choices_timeout_counts_from_arrival():
    """n choices share the request's X-Request-Timeout-Ms from its arrival: one that waited
    3 s before admission has 3 s less left on every choice, not the whole timeout again."""
    engine = SimpleNamespace(abort=lambda request_id, reason: None, live_config=None,
                             stall_after_s=60.0)
    state = SimpleNamespace(engine=engine, delivery=None, finished_one=lambda: None)

    async def never() -> dict:
        await asyncio.Event().wait()
        return {}

    request = SimpleNamespace(receive=never, scope={
        "state": {ARRIVAL_KEY: time.perf_counter() - 3.0}})

    async def scenario() -> list[float]:
        gens, done = choice_generations(state, request, [RequestStream("r"),
                                                         RequestStream("r-1")],
                                        timeout_s=10.0, streaming=False)
        left = [gen._wait_s() for gen in gens]  # seconds until each one's deadline
        for gen in gens:
            gen.close()
        done()
        return left

    left = asyncio.run(scenario())
    assert all(6.0 < s <= 7.0 for s in left), left


@pytest.mark.parametrize(("value", "moved_s"), [
    ("2.5", 2.5), ("-5", 0.0), ("nan", 0.0), ("1e9", 3600.0), ("soon", 0.0)])
def test_the_edges_elapsed_header_moves_arrival_back_within_bounds(value, moved_s):
    """Behind its edge the server counts the time the request spent there: the arrival
    moves back by the edge's header, never forward (a negative value) and at most an
    hour; a value that is not a number moves nothing."""
    seen: dict = {}

    async def app(scope, receive, send) -> None:
        seen.update(scope["state"])

    scope = {"type": "http", "headers": [(EDGE_ELAPSED_HEADER.encode(), value.encode())]}
    before = time.perf_counter()
    asyncio.run(StampArrival(app, behind_edge=True)(scope, None, None))
    after = time.perf_counter()
    assert before - moved_s <= seen[ARRIVAL_KEY] <= after - moved_s


def test_only_a_server_behind_its_edge_counts_the_edges_time(tiny_loaded):
    """The app trusts the edge's elapsed header behind its own edge (edge="on"): a request
    that spent 3 s there has an E2E over 3 s; a server without the edge ignores a client's
    copy of the header."""
    engine, _, settings = make_engine(tiny_loaded)
    body = {"prompt": "Hi", "max_tokens": 2}
    headers = {EDGE_ELAPSED_HEADER: "3"}

    async def scenario():
        replies = []
        for edge in ("on", "off"):
            async with asgi_client(engine, settings.replace(edge=edge), stop=False) as client:
                replies.append(await client.post("/v1/completions", json=body,
                                                 headers=headers))
        engine.stop()
        return replies

    behind, direct = asyncio.run(scenario())
    assert behind.status_code == direct.status_code == 200, (behind.text, direct.text)
    assert behind.json()["batchpilot"]["timing"]["e2e_s"] >= 3.0
    assert direct.json()["batchpilot"]["timing"]["e2e_s"] < 3.0
