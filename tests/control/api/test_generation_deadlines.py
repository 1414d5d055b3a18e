"""When a Generation (control/api/generation.py) gives up on a request, on its own clock:
the request timeout counts from arrival (time spent before admission included), a stream's
idle limit from its last token, whichever comes first; no slack past either. (The live
tests in test_timeouts.py bound the same on a real server only loosely.)"""

from __future__ import annotations

import asyncio
import types

import pytest

from control.api.generation import Generation


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def generation(clock: Clock, *, streaming: bool, idle_ms: int = 10_000) -> Generation:
    engine = types.SimpleNamespace(live_config=types.SimpleNamespace(
        stream_idle_timeout_ms=idle_ms), stall_after_s=5.0)
    stream = types.SimpleNamespace(request_id="r", queue=asyncio.Queue())

    async def never():
        await asyncio.Event().wait()

    return Generation(engine, stream, never, timeout_s=2.0, streaming=streaming,
                      clock=clock, waited_s=0.5)


def run(body):
    async def scenario():
        clock = Clock()
        gen = body(clock)
        gen._watcher.cancel()
    asyncio.run(scenario())


def test_the_request_timeout_counts_from_arrival_with_no_slack():
    def body(clock):
        gen = generation(clock, streaming=False)
        assert gen._wait_s() == pytest.approx(1.5)  # 0.5 s were spent before admission
        clock.now += 1.5
        assert gen._wait_s() == 0.0
        return gen
    run(body)


def test_a_streams_idle_limit_counts_from_its_last_token():
    def body(clock):
        gen = generation(clock, streaming=True, idle_ms=400)
        assert gen._wait_s() == pytest.approx(1.5)  # no token yet: the timeout alone
        gen.last_token = clock.now
        assert gen._wait_s() == pytest.approx(0.4)
        clock.now += 0.4
        assert gen._wait_s() == 0.0
        return gen
    run(body)
