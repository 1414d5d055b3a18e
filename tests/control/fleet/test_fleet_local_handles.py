"""The no-Ray fleet's stand-ins for Serve's handles (control/fleet/local.py) behave as Serve's
do where the ingress relies on it: a cancelled call closes the replica's stream, a drain
carries its grace, and waiting for health gives up."""

from __future__ import annotations

import asyncio

import pytest

from control.fleet.local import LocalCall, LocalHandle, wait_healthy


def test_cancelling_a_call_closes_the_replicas_stream():
    """A client that leaves: the replica's generator is closed (its request aborted), as
    Serve's cancel does, not left to generate for nobody."""
    closed = []

    async def replica_stream():
        try:
            for i in range(100):
                yield {"chunk": i}
        finally:
            closed.append(True)

    async def client() -> list[bool]:
        call = LocalCall(replica_stream())
        assert await call.__anext__() == {"chunk": 0}
        call.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        return list(closed)  # before asyncio.run's own clean-up closes it anyway

    assert asyncio.run(client()) == [True]


def test_a_drain_reaches_the_replica_with_its_grace():
    class Replica:
        async def drain(self, grace_s: float) -> int:
            self.grace_s = grace_s
            return 0

    replica = Replica()
    assert asyncio.run(LocalHandle(replica).drain.remote(7.5)) == 0  # type: ignore[arg-type]
    assert replica.grace_s == 7.5


def test_waiting_for_a_fleet_that_never_polls_healthy_gives_up():
    with pytest.raises(TimeoutError, match="did not all poll healthy"):
        # (bounded here: a wait_healthy that never gave up would hang the test)
        asyncio.run(asyncio.wait_for(wait_healthy(lambda: False, timeout_s=0.1), 2.0))
