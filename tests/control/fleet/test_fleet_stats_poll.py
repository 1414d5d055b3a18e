"""The ingress's load poll is a long poll: a replica whose stats routing would read the same
as the last answer holds the poll until they change (or a second passes), so an idle fleet
is asked about once a second per replica instead of five times, and a change (a request
queued) reaches the router at once. A replica not known healthy answers at once."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from fixtures.local_fleet import LocalFleet

from control.fleet.loads import STATS_WAIT_S, LoadTable, poll_forever, routing_key


def test_a_poll_waits_only_past_a_healthy_answer():
    table, asked = LoadTable(1), []
    answers = [{"ready": False, "reason": "loading"}, {"ready": True, "waiting": 0},
               {"ready": True, "waiting": 2}]

    async def fetch(since: tuple | None, wait_s: float) -> dict:
        asked.append((since, wait_s))
        return answers[min(len(asked), len(answers)) - 1]

    async def run() -> None:
        task = asyncio.ensure_future(poll_forever(table, 0, fetch, poll_s=0.001))
        while len(asked) < 4:
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # not polled yet, then not ready: at once; then past each healthy answer, its key
    assert asked[:4] == [(None, STATS_WAIT_S), (None, STATS_WAIT_S),
                         (routing_key(answers[1]), STATS_WAIT_S),
                         (routing_key(answers[2]), STATS_WAIT_S)]


@pytest.fixture(scope="module")
def idle_fleet(tiny_llama_dir, tmp_path_factory):
    with LocalFleet(tiny_llama_dir, tmp_path_factory.mktemp("stats-poll")) as running:
        yield running


def test_an_idle_replica_is_asked_about_once_a_second(idle_fleet):
    replica = idle_fleet.replicas[0]
    calls = 0
    stats = replica.stats

    async def counted(*args):
        nonlocal calls
        calls += 1
        return await stats(*args)

    replica.stats = counted  # LocalHandle looks it up at each call
    try:
        time.sleep(3.0)
    finally:
        del replica.stats
    # a 0.2 s poll asked 15 times in 3 s; the long poll ~3 (a second's wait, then 0.2 s)
    assert 1 <= calls <= 5, calls


def test_a_change_ends_the_wait_at_once(idle_fleet):
    replica = idle_fleet.replicas[1]

    async def scenario() -> tuple[float, float, dict]:
        idle = await replica.stats()
        started = time.monotonic()
        same = await replica.stats(routing_key(idle), 0.4)  # nothing changes: the whole wait
        waited = time.monotonic() - started
        poll = asyncio.ensure_future(replica.stats(routing_key(same), 5.0))
        await asyncio.sleep(0.1)
        replica.state.inflight += 1  # a request reached the replica
        started = time.monotonic()
        try:
            changed = await poll
        finally:
            replica.state.inflight -= 1
        return waited, time.monotonic() - started, changed

    waited, answered_after, changed = asyncio.run_coroutine_threadsafe(
        scenario(), idle_fleet.loop).result(30)
    assert waited >= 0.39
    assert answered_after < 0.5 and changed["inflight"] == 1
