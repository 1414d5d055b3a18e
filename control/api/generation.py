"""Drive one admitted request for a route: hand out its events in order, and abort it in
the engine when the client leaves, its time runs out, or its stream goes idle.

    time ->  arrival ........ first token ..... token ..... token ......... finish
             |<------------------ timeout_s (X-Request-Timeout-Ms) ------------->|
                                          |<- idle ->|  (stream_idle_timeout_ms,
                                                         live config; streams only)

Every abort goes through AsyncEngine.abort, which frees the request's KV blocks before the
next step and counts it by reason; the engine then sends the request's final event
(finish_reason "cancelled" or "timeout"), which this class passes on like any other.

The deadlines are one timer per request, armed when the request waits on an empty queue
and left pending while tokens come (when it fires early, because a token moved the idle
deadline on, the wait re-arms for what is left; when the deadline comes before it, as the
first token brings the idle limit in, it is re-armed): an event costs a plain queue get.
`asyncio.wait_for` per event cost ~10 us more (a task, a timer and a future each time;
14.6 against 5.0 us an event through a queue, Python 3.11), on the event loop's thread,
which shares this machine's 2 cores with the engine's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from control.api.delivery import DeliveryProbe
from control.serve.engine_loop import AsyncEngine
from control.serve.streams import CLIENT_GONE, ClientGone, RequestStream, StreamEvent

ABORT_GRACE_S = 10.0  # after an abort, the final event must come within this (or within
# the engine's stall_after_s, when longer: a long step may be running when the abort comes)


class _Deadline:
    """Put on a stream's queue by its request's timer: check the deadlines now."""


_DEADLINE = _Deadline()


class ClientDisconnected(Exception):
    """The client closed the connection; the request has been aborted."""


class EngineUnresponsive(Exception):
    """An aborted request's final event never came: the engine loop is stuck."""


class Generation:
    def __init__(self, engine: AsyncEngine, stream: RequestStream,
                 receive: Callable[[], Awaitable[dict[str, Any]]], *, timeout_s: float,
                 streaming: bool, clock: Callable[[], float] = time.monotonic,
                 waited_s: float = 0.0, probe: DeliveryProbe | None = None):
        self.engine = engine
        self.stream = stream
        self.timeout_s = timeout_s
        self.streaming = streaming  # the idle timeout applies to streams only
        self.clock = clock
        # timeout_s counts from arrival: `waited_s` already passed before admission (body
        # read, tokenization, the engine thread finishing its step)
        self.started = clock() - waited_s
        self.probe = probe  # observes each event's way to the client (the responses call it)
        self.last_token: float | None = None  # when the last token arrived
        self.aborted_at: float | None = None
        self.abort_reason: str | None = None
        self.finished = False
        self.closed = False
        self._watcher = asyncio.ensure_future(_watch_disconnect(receive, stream.queue))
        self._timer: asyncio.TimerHandle | None = None  # pending: puts _DEADLINE
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    async def next_event(self) -> StreamEvent:
        """The next event; the last one has `finished`. Raises ClientDisconnected, or
        EngineUnresponsive when an aborted request never ends."""
        while True:
            item = await self._next_item()
            if item is _DEADLINE:
                if self._wait_s() <= 0.0:  # else a token moved the idle deadline on
                    self._on_timeout()
                continue
            if isinstance(item, ClientGone):
                self.abort("client_disconnect")
                raise ClientDisconnected(self.request_id)
            if item.delta_token_ids:
                self.last_token = self.clock()
            if item.finished:
                self.finished = True
            return item

    async def _next_item(self) -> StreamEvent | ClientGone | _Deadline:
        queue = self.stream.queue
        if not queue.empty():
            return queue.get_nowait()
        loop = asyncio.get_running_loop()
        due = loop.time() + self._wait_s()
        # a pending timer that fires late is re-armed: the first token (or a live config
        # change) can bring the idle deadline before it; one that fires early re-checks
        if self._timer is None or self._timer.when() > due:
            self._cancel_timer()
            self._timer_loop, self._timer = loop, loop.call_at(due, self._expire)
        return await queue.get()

    def _expire(self) -> None:
        self._timer = None
        self.stream.queue.put_nowait(_DEADLINE)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def delivered(self, event: StreamEvent, kind: str) -> None:
        """`event`'s bytes were just handed to the transport (kind: see DeliveryProbe)."""
        if self.probe is not None:
            self.probe.delivered(event, kind)

    def abort(self, reason: str) -> None:
        if self.abort_reason is None and not self.finished:
            self.abort_reason, self.aborted_at = reason, self.clock()
            self.engine.abort(self.request_id, reason)
            if self._timer is not None:  # the grace deadline may come before the pending one
                self._cancel_timer()
                self._timer = self._timer_loop.call_later(self._wait_s(), self._expire)

    def close(self) -> None:
        """Idempotent; a request that has not finished is aborted (its client is gone)."""
        if self.closed:
            return
        self.closed = True
        self._watcher.cancel()
        self._cancel_timer()
        if not self.finished:
            self.abort("client_disconnect")

    def _wait_s(self) -> float:
        now = self.clock()
        if self.aborted_at is not None:
            grace_s = max(ABORT_GRACE_S, self.engine.stall_after_s)
            return max(0.0, self.aborted_at + grace_s - now)
        wait = self.started + self.timeout_s - now
        idle_s = self._idle_timeout_s()
        if idle_s is not None and self.last_token is not None:
            wait = min(wait, self.last_token + idle_s - now)
        return max(0.0, wait)

    def _idle_timeout_s(self) -> float | None:
        live = self.engine.live_config
        if not self.streaming or live is None:
            return None
        return live.stream_idle_timeout_ms / 1000.0

    def _on_timeout(self) -> None:
        if self.aborted_at is not None:
            raise EngineUnresponsive(f"request {self.request_id} was aborted"
                                     f" ({self.abort_reason}) but never ended")
        if self.clock() >= self.started + self.timeout_s:
            self.abort("request_timeout")
        else:
            self.abort("stream_idle_timeout")


async def merged_events(gens: list[Generation]) -> AsyncIterator[tuple[int, StreamEvent]]:
    """The events of n choices' generations as they come, each with its choice index (in
    index order within one wake-up), until every one has finished. Raises what any
    `next_event` raises (ClientDisconnected, EngineUnresponsive); the caller closes them."""
    if len(gens) == 1:  # the common case: no task per event
        while True:
            event = await gens[0].next_event()
            yield 0, event
            if event.finished:
                return
    waiting = {asyncio.ensure_future(g.next_event()): i for i, g in enumerate(gens)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=waiting.__getitem__):
                index = waiting.pop(task)
                event = task.result()
                yield index, event
                if not event.finished:
                    waiting[asyncio.ensure_future(gens[index].next_event())] = index
    finally:
        for task in waiting:
            task.cancel()


class SharedReceive:
    """One client's `receive` for n choices' Generations: the http.disconnect message is
    read once and handed to every watcher, so each choice sees its client leave (even
    after the others finished). `close()` once the response is done."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]):
        self._receive = receive
        self._task: asyncio.Future[dict[str, Any]] | None = None

    async def __call__(self) -> dict[str, Any]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._disconnect())
        return await asyncio.shield(self._task)  # a watcher's cancel leaves the others

    async def _disconnect(self) -> dict[str, Any]:
        while True:
            message = await self._receive()
            if message.get("type") == "http.disconnect":
                return message

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _watch_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]],
                            queue: asyncio.Queue) -> None:
    """The request body is already read: the next message is http.disconnect."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            queue.put_nowait(CLIENT_GONE)
            return
