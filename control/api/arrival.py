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
# Seconds a request spent in the edge process before it was forwarded (control/edge/):
# trusted only by a server behind its own edge (it then listens on a Unix socket only)
EDGE_ELAPSED_HEADER = "x-batchpilot-edge-elapsed-s"
MAX_EDGE_ELAPSED_S = 3600.0


class StampArrival:
    """Pure ASGI middleware (no per-chunk cost on responses): one stamp per HTTP request.
    `behind_edge`: the stamp moves back by the edge's EDGE_ELAPSED_HEADER."""

    def __init__(self, app: ASGIApp, behind_edge: bool = False):
        self.app = app
        self.behind_edge = behind_edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            stamp = time.perf_counter()
            if self.behind_edge:
                stamp -= _edge_elapsed(scope)
            scope.setdefault("state", {})[ARRIVAL_KEY] = stamp
        await self.app(scope, receive, send)


def _edge_elapsed(scope: Scope) -> float:
    """The edge's header as seconds in [0, MAX_EDGE_ELAPSED_S]; 0 if absent or garbled."""
    wanted = EDGE_ELAPSED_HEADER.encode()
    for name, value in scope.get("headers", ()):
        if name.lower() == wanted:
            try:
                seconds = float(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return 0.0
            return min(max(seconds, 0.0), MAX_EDGE_ELAPSED_S) if seconds == seconds else 0.0
    return 0.0


def arrival_time(request: Request, clock: Callable[[], float]) -> float:
    """The request's arrival on `clock` (seconds); now, if no middleware stamped it."""
    return clock() - seconds_since_arrival(request)


def seconds_since_arrival(request: Request) -> float:
    """How long ago the request reached the server (0 if no middleware stamped it)."""
    stamp = request.scope.get("state", {}).get(ARRIVAL_KEY)
    return 0.0 if stamp is None else max(0.0, time.perf_counter() - stamp)
