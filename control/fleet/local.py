"""The fleet without Ray: replicas in this process behind stand-ins for Serve's handles,
for the routing bench and tests that need no cluster (same ingress, same replica code).

    replicas = [await EngineReplica(settings, i).start() for i in range(2)]
    fleet = FleetIngress([LocalHandle(r) for r in replicas], RoutingPolicy())
    fleet.start_polls(); app = build_app(fleet)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from control.fleet.replica import EngineReplica


class LocalCall:
    """A streamed call: async-iterable, and `cancel()` closes it (as Serve's cancel does:
    the replica sees the client leave)."""

    def __init__(self, stream: AsyncIterator[dict[str, Any]]):
        self._stream = stream

    def __aiter__(self) -> LocalCall:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._stream.__anext__()

    def cancel(self) -> None:
        asyncio.ensure_future(self._stream.aclose())  # type: ignore[attr-defined]


class _Method:
    def __init__(self, fn: Callable[..., Any]):
        self.remote = fn


class LocalHandle:
    """What FleetIngress uses of a DeploymentHandle: `.options(stream=True).http.remote`,
    `.stats.remote(since, wait_s)`, `.drain.remote(grace_s)`."""

    def __init__(self, replica: EngineReplica):
        self.replica = replica

    def options(self, **_: Any) -> LocalHandle:
        return self

    @property
    def http(self) -> _Method:
        return _Method(lambda *args: LocalCall(self.replica.http(*args)))

    @property
    def stats(self) -> _Method:
        return _Method(lambda *args: _result(self.replica.stats(*args)))

    @property
    def drain(self) -> _Method:
        return _Method(lambda grace_s: self.replica.drain(grace_s))

    def __getattr__(self, name: str) -> _Method:
        """Any other replica method (install, window, audit_event, control_state), awaitable
        as Serve's `handle.<method>.remote(...)` is."""
        method = getattr(self.replica, name)
        return _Method(lambda *args, **kwargs: _result(method(*args, **kwargs)))


async def _result(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


async def wait_healthy(table_ready: Callable[[], bool], timeout_s: float = 30.0,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Until `table_ready()` (e.g. every replica polled healthy), or TimeoutError."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not table_ready():
        if loop.time() > deadline:
            raise TimeoutError("the fleet's replicas did not all poll healthy in time")
        await sleep(0.05)
