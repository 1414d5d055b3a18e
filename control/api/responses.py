"""Answer an admitted request: one JSON body, or a stream of server-sent events.

A stream's cleanup (abort if unfinished, in-flight count) runs in `SSEResponse.__call__`'s
finally, so it happens however the response ends: finished, client gone before the first
byte, or the task cancelled at shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi.responses import JSONResponse
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from control.api.errors import APIError, error_detail, retry_after
from control.api.generation import ClientDisconnected, EngineUnresponsive, Generation
from control.api.openai_format import ResponseFormat
from control.serve.engine_loop import ABORT_REASONS
from control.serve.streams import StreamEvent

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


async def collect(gen: Generation, fmt: ResponseFormat) -> JSONResponse:
    """Wait for the whole answer; a request the server ended early is an error response."""
    texts = []
    while True:
        event = await gen.next_event()
        texts.append(event.delta_text)
        if event.finished:
            break
    info = fmt.info(event, event.num_output_tokens)
    headers = fmt.final_headers(info)
    failure = _server_error(event)
    if failure is not None:
        status, code, message = failure
        if status == 503:
            headers.update(retry_after(SHUTDOWN_RETRY_AFTER_S))
        raise APIError(status, message, code=code, headers=headers,
                       extra={"batchpilot": info.model_dump()})
    response = JSONResponse(fmt.body("".join(texts), event, info), headers=headers)
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


def sse_response(gen: Generation, fmt: ResponseFormat,
                 on_close: Callable[[], None]) -> SSEResponse:
    def close() -> None:
        gen.close()
        on_close()

    headers = {**fmt.start_headers(), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return SSEResponse(_sse_body(gen, fmt), headers, close)


async def _sse_body(gen: Generation, fmt: ResponseFormat) -> AsyncIterator[bytes]:
    if fmt.kind == "chat":
        yield fmt.role_chunk()
    event: StreamEvent | None = None
    first = True
    try:
        while True:
            event = await gen.next_event()
            if event.delta_text:
                yield fmt.text_chunk(event.delta_text)  # resumes once the chunk is sent
                gen.delivered(event, "first_token" if first else "token")
                first = False
            if event.finished:
                break
    except ClientDisconnected:
        return  # nobody to tell
    except EngineUnresponsive as exc:
        tokens = event.num_output_tokens if event else 0
        for chunk in fmt.finish_chunks(event, tokens, "error", error_detail(
                500, str(exc), code="engine_unresponsive")):
            yield chunk
        return
    failure = _server_error(event)
    error = error_detail(failure[0], failure[2], code=failure[1]) if failure else None
    for chunk in fmt.finish_chunks(event, event.num_output_tokens,
                                   event.finish_reason or "stop", error):
        yield chunk
