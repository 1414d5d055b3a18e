"""When a request reached the server: stamped by an ASGI middleware before anything else
runs for it (body read, validation, tokenization, chat templating), so queue delay, TTFT
and E2E count everything the client waits for, not just the time after the engine thread
took the request.

The stamp is monotonic (`time.perf_counter()`, in the ASGI scope's `state`); the route
turns it into the engine clock when it reads it, as `clock() - elapsed`: right whatever
the engine's clock is (wall time by default) and unmoved by a wall-clock step in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

ARRIVAL_KEY = "batchpilot_arrival"  # in scope["state"]: time.perf_counter() at arrival


class StampArrival:
    """Pure ASGI middleware (no per-chunk cost on responses): one stamp per HTTP request."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVAL_KEY] = time.perf_counter()
        await self.app(scope, receive, send)


def arrival_time(request: Request, clock: Callable[[], float]) -> float:
    """The request's arrival on `clock` (seconds); now, if no middleware stamped it."""
    return clock() - seconds_since_arrival(request)


def seconds_since_arrival(request: Request) -> float:
    """How long ago the request reached the server (0 if no middleware stamped it)."""
    stamp = request.scope.get("state", {}).get(ARRIVAL_KEY)
    return 0.0 if stamp is None else max(0.0, time.perf_counter() - stamp)
