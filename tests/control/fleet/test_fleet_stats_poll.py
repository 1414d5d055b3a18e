"""The ingress's load poll is a long poll: a replica whose stats routing would read the same
as the last answer holds the poll until they change (or a second passes), so an idle fleet
is asked about once a second per replica instead of five times, and a change (a request
queued) reaches the router at once. A replica not known healthy answers at once; an
idle one that holds the whole wait is not late, and an empty slot is down unasked."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

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


async def _poll_until(table: LoadTable, fetch, calls: list, n: int, max_s: float = 3.0,
                      **kwargs) -> None:
    """poll_forever on replica 0 until `fetch` was called `n` times (or max_s passed)."""
    task = asyncio.ensure_future(poll_forever(table, 0, fetch, **kwargs))
    deadline = time.monotonic() + max_s
    while len(calls) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_long_poll_answered_at_the_end_of_its_wait_is_not_late():
    """An idle replica holds each poll for the whole wait: the poll's timeout counts from
    the end of that wait, or an idle fleet would read as down every few polls."""
    table, seen = LoadTable(1), []

    async def idle(since: tuple | None, wait_s: float) -> dict:
        view = table.views[0]
        seen.append((view.healthy, view.late_polls))
        if since is not None:
            await asyncio.sleep(wait_s)  # nothing changed: the whole wait
        return {"ready": True, "waiting": 0}

    asyncio.run(_poll_until(table, idle, seen, 5, poll_s=0.001, timeout_s=0.2, wait_s=0.2))
    assert seen[1:5] == [(True, 0)] * 4


def test_a_slot_autoscaling_has_emptied_reads_as_down_without_being_asked():
    table, asked = LoadTable(1), []
    table.polled(0, {"ready": True})

    async def fetch(since: tuple | None, wait_s: float) -> dict:
        asked.append(since)
        return {"ready": True}

    asyncio.run(_poll_until(table, fetch, asked, 1, max_s=0.1, poll_s=0.01,
                            active=lambda: False))  # ~10 rounds
    assert asked == [] and not table.snapshot()[0].healthy


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


def test_a_pushed_fleet_version_ends_the_wait_at_once(idle_fleet):
    """The control plane reads convergence from the polls: a replica's new fleet version
    goes back at once, not after the idle wait."""
    replica = idle_fleet.replicas[1]
    own_store = replica.tee.store  # this fixture's replicas run without the control API
    replica.tee.store = SimpleNamespace(fleet_version=0)

    async def scenario() -> tuple[float, dict]:
        idle = await replica.stats()
        poll = asyncio.ensure_future(replica.stats(routing_key(idle), 5.0))
        await asyncio.sleep(0.1)
        replica.tee.store.fleet_version = 1  # a push landed
        started = time.monotonic()
        changed = await poll
        return time.monotonic() - started, changed

    try:
        answered_after, changed = asyncio.run_coroutine_threadsafe(
            scenario(), idle_fleet.loop).result(30)
    finally:
        replica.tee.store = own_store
    assert answered_after < 0.5 and changed["fleet_version"] == 1
