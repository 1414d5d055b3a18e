"""What crosses between the event loop and the engine thread for one request.

A `Submission` goes in; `StreamEvent`s come out on the request's `RequestStream`. Events
are immutable snapshots: the OutputProcessor reuses its RequestOutput objects step after
step, so they never leave the engine thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine.output.processor import Logprob, RequestOutput
from engine.records import RequestRecord
from engine.request import SamplingParams, TraceLink


@dataclass(frozen=True)
class Submission:
    request_id: str
    prompt: str | None  # the text, when the client sent text
    prompt_token_ids: list[int]
    params: SamplingParams
    tenant: str = "default"
    lane: str | None = None  # None: the engine routes by prompt length
    priority: int = 0  # smaller runs first
    deadline: float | None = None  # absolute, engine clock (time.time(), seconds)
    cache_salt: str | None = None  # prefix-cache domain instead of the tenant's
    # When the HTTP request reached the server (engine clock; None: when the engine takes
    # it), and the seconds since then spent tokenizing and templating it.
    arrival_time: float | None = None
    tokenize_s: float = 0.0
    wait_for: str | None = None  # n > 1: the first choice's id (Engine.add_request)
    # arrival + X-Request-Timeout-Ms (engine clock): a request whose time ran out while it
    # waited for the engine thread is ended at admission, before any step can run it
    timeout_at: float | None = None
    trace: TraceLink | None = None  # the caller's trace (control/otel/context.py)
    resent: bool = False  # its client was refused before (X-Stainless-Retry-Count > 0)


@dataclass(frozen=True)
class StreamEvent:
    request_id: str
    delta_text: str
    delta_token_ids: tuple[int, ...]
    num_output_tokens: int  # all so far
    finished: bool = False
    finish_reason: str | None = None  # stop | length | cancelled | timeout | error
    record: RequestRecord | None = None  # once finished: timestamps, latencies, detail
    # time.perf_counter() when the step that produced it returned (0: not from a step);
    # the server's latencies end there, so the way to the client is measured from it
    step_done: float = 0.0
    delta_logprobs: tuple[Logprob, ...] = ()  # of delta_token_ids, when asked
    prompt_logprobs: tuple[Logprob, ...] | None = None  # once computed, when asked

    @classmethod
    def from_output(cls, out: RequestOutput, step_done: float = 0.0) -> StreamEvent:
        return cls(out.request_id, out.delta_text, tuple(out.delta_token_ids),
                   len(out.token_ids), out.finished, out.finish_reason, out.record,
                   step_done, tuple(out.delta_logprobs), out.prompt_logprobs)

    @property
    def finish_detail(self) -> str:
        return self.record.finish_detail if self.record is not None else ""


class ClientGone:
    """Put on a stream's queue by the disconnect watcher."""


CLIENT_GONE = ClientGone()


class RequestStream:
    """The route's end of one admitted request: its events, in order, then the last one
    with `finished`; or CLIENT_GONE when the client disconnects."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.queue: asyncio.Queue[StreamEvent | ClientGone] = asyncio.Queue()


@dataclass(frozen=True)
class Delivery:
    """Where the engine thread sends one request's events."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


def deliver(items: list[tuple[asyncio.Queue, StreamEvent]]) -> None:
    """Runs on the event loop: one call per step hands out every event of that step."""
    for q, event in items:
        q.put_nowait(event)


def resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Runs on the event loop: complete a future unless its awaiter already left."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
