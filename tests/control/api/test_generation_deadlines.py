"""When a Generation (control/api/generation.py) gives up on a request, on its own clock:
the request timeout counts from arrival (time spent before admission included), a stream's
idle limit from its last token, whichever comes first; no slack past either. (The live
tests in test_timeouts.py bound the same on a real server only loosely.)"""

from __future__ import annotations

import asyncio
import types

import pytest

from control.api.generation import Generation
from control.serve.streams import StreamEvent


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def generation(clock: Clock, *, streaming: bool, idle_ms: int = 10_000,
               stall_after_s: float = 5.0) -> Generation:
    """A Generation 0.5 s after its arrival, 2 s to run; its engine records each abort in
    `gen.engine.aborts` as (request id, reason)."""
    aborts: list[tuple[str, str]] = []
    engine = types.SimpleNamespace(
        live_config=types.SimpleNamespace(stream_idle_timeout_ms=idle_ms),
        stall_after_s=stall_after_s, aborts=aborts,
        abort=lambda rid, why: aborts.append((rid, why)))
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


def token(n: int) -> StreamEvent:
    return StreamEvent("r", "x", (7,), n)


def test_a_request_is_aborted_once_with_its_first_reason():
    """Timed out, then its client leaves (the response closes): the engine is asked once,
    and the reason counted and traced stays the timeout."""
    async def scenario():
        gen = generation(Clock(), streaming=True)
        gen.abort("request_timeout")
        gen.close()
        return gen

    gen = asyncio.run(scenario())
    assert gen.engine.aborts == [("r", "request_timeout")]
    assert gen.abort_reason == "request_timeout"


def test_an_aborted_request_gets_the_engines_stall_limit_when_longer_than_the_grace():
    """An abort lands between two steps: a step may run up to the engine's stall limit, so
    the final event is awaited that long before the engine is called unresponsive."""
    async def scenario():
        clock = Clock()
        gen = generation(clock, streaming=True, stall_after_s=30.0)
        gen.abort("client_disconnect")
        clock.now += 20.0  # past ABORT_GRACE_S (10 s), within the stall limit
        gen._watcher.cancel()
        return gen._wait_s()

    assert asyncio.run(scenario()) == pytest.approx(10.0)


def test_a_timer_that_fires_after_a_new_token_re_arms_instead_of_aborting():
    """The idle timer was armed before the last token moved the deadline on: when it
    fires, the stream is not idle, and the token is handed out with no abort."""
    async def scenario():
        clock = Clock()
        gen = generation(clock, streaming=True, idle_ms=1000)
        gen.last_token = clock.now
        clock.now += 0.9
        gen.stream.queue.put_nowait(token(2))
        assert (await gen.next_event()).num_output_tokens == 2  # last token now at +0.9
        clock.now += 0.2  # the timer armed for +1.0 fires: 0.8 s of idle limit (and 0.4 s
        # of the request's 2 s, 0.5 of them spent before admission) are left
        gen._expire()
        gen.stream.queue.put_nowait(token(3))
        event = await gen.next_event()
        gen.close()
        return event, gen.engine.aborts

    event, aborts = asyncio.run(scenario())
    assert event.num_output_tokens == 3
    assert aborts == [("r", "client_disconnect")]  # only close()'s: never "idle"
