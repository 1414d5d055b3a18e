"""Answer an admitted request: one JSON body, or a stream of server-sent events; with
n > 1, one Generation per choice, their events merged as they come.

A stream's cleanup (abort if unfinished, in-flight count) runs in `SSEResponse.__call__`'s
finally, so it happens however the response ends: finished, client gone before the first
byte, or the task cancelled at shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from control.api.errors import APIError, error_detail, retry_after
from control.api.generation import (
    ClientDisconnected,
    EngineUnresponsive,
    Generation,
    merged_events,
)
from control.api.openai_format import ChoiceResult, ResponseFormat
from control.serve.loop_records import ABORT_REASONS
from control.serve.streams import StreamEvent
from engine.output.processor import Logprob

SHUTDOWN_DETAIL = ABORT_REASONS["shutdown"][1]
SHUTDOWN_MESSAGE = ("the server is shutting down and ended this request before it finished;"
                    " retry on another replica")
ENGINE_ERROR_MESSAGE = ("the engine failed while running this request{detail} and ended it;"
                        " the server log has why")
SHUTDOWN_RETRY_AFTER_S = 1.0


def _server_error(event: StreamEvent) -> tuple[int, str, str] | None:
    """(status, code, message) when the server, not the request, ended it."""
    if event.finish_detail == SHUTDOWN_DETAIL:
        return 503, "server_shutdown", SHUTDOWN_MESSAGE
    if event.finish_reason == "error":  # the detail says what failed, never how (no trace)
        detail = f" ({event.finish_detail})" if event.finish_detail else ""
        return 500, "engine_error", ENGINE_ERROR_MESSAGE.format(detail=detail)
    return None


async def collect(gens: list[Generation], fmt: ResponseFormat) -> JSONResponse:
    """Wait for the whole answer (every choice); a request the server ended early is an
    error response."""
    results = [ChoiceResult(i) for i in range(len(gens))]
    async for index, event in merged_events(gens):
        results[index].add(event)
    for r in results[1:]:  # n > 1: only the first choice computes prompt logprobs
        r.prompt = r.prompt or results[0].prompt
    events = [r.event for r in results]
    info = fmt.info(events[0], sum(e.num_output_tokens for e in events))
    headers = fmt.final_headers(info)
    failure = next((f for f in map(_server_error, events) if f is not None), None)
    if failure is not None:
        status, code, message = failure
        if status == 503:
            headers.update(retry_after(SHUTDOWN_RETRY_AFTER_S))
        raise APIError(status, message, code=code, headers=headers,
                       extra={"batchpilot": info.model_dump()})
    response = JSONResponse(fmt.body(results, info), headers=headers)
    for gen, event in zip(gens, events, strict=True):
        gen.delivered(event, "response")  # rendered; the server writes it next
    return response


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], headers: dict[str, str],
                 on_close: Callable[[], None]):
        super().__init__(content, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self._on_close()


def sse_response(gens: list[Generation], fmt: ResponseFormat,
                 on_close: Callable[[], None]) -> SSEResponse:
    def close() -> None:
        for gen in gens:
            gen.close()
        on_close()

    headers = {**fmt.start_headers(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return SSEResponse(_sse_body(gens, fmt), headers, close)


@dataclass
class _StreamedChoice:
    """What a stream has sent of one choice."""

    event: StreamEvent | None = None  # the latest
    first: bool = True  # no text sent yet
    prompt_sent: bool = False
    pending: list[Logprob] = field(default_factory=list)  # logprobs of tokens not sent yet


async def _sse_body(gens: list[Generation], fmt: ResponseFormat) -> AsyncIterator[bytes]:
    choices = [_StreamedChoice() for _ in gens]
    if fmt.kind == "chat":
        for index in range(len(gens)):
            yield fmt.role_chunk(index)
    left = len(gens)
    prompt = None  # the first choice's prompt logprobs (n > 1: it alone computes them)
    try:
        async for index, event in merged_events(gens):
            c = choices[index]
            c.event = event
            prompt = prompt or event.prompt_logprobs
            if not c.prompt_sent and event.delta_token_ids:  # the prompt is computed
                c.prompt_sent = True
                prompt_chunk = fmt.prompt_chunk(event.prompt_logprobs or prompt, index)
                if prompt_chunk is not None:
                    yield prompt_chunk
            c.pending.extend(event.delta_logprobs)
            if event.delta_text:
                yield fmt.text_chunk(event.delta_text, c.pending, index,
                                     _tokens(choices))  # resumes once sent
                c.pending = []
                gens[index].delivered(event, "first_token" if c.first else "token")
                c.first = False
            if event.finished:
                left -= 1
                failure = _server_error(event)
                error = error_detail(failure[0], failure[2], code=failure[1]) if failure \
                    else None
                for chunk in fmt.finish_chunks(event, _tokens(choices),
                                               event.finish_reason or "stop", error,
                                               c.pending, index, last=left == 0):
                    yield chunk
    except ClientDisconnected:
        return  # nobody to tell
    except EngineUnresponsive as exc:
        error = error_detail(500, str(exc), code="engine_unresponsive")
        unfinished = [i for i, c in enumerate(choices) if not (c.event and c.event.finished)]
        for index in unfinished:
            for chunk in fmt.finish_chunks(choices[index].event, _tokens(choices), "error",
                                           error, (), index, last=index == unfinished[-1]):
                yield chunk


def _tokens(choices: list[_StreamedChoice]) -> int:
    """Completion tokens of every choice so far."""
    return sum(c.event.num_output_tokens for c in choices if c.event is not None)
