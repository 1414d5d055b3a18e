"""Errors in OpenAI's format, `{"error": {"message", "type", "param", "code"}}`, for every
failure: bad input (400, never FastAPI's 422), admission rejections (400 / 429 / 503 with
Retry-After), unknown routes, and anything unexpected (500, logged, no stack trace sent).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.records import AdmissionDecision

log = logging.getLogger("batchpilot.http")

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error",
               403: "permission_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error",
               421: "invalid_request_error",
               429: "rate_limit_error", 500: "server_error",
               503: "service_unavailable_error"}

# Starlette's HTTP errors -> the `code` of our body (413: control/api/body_limit.py)
HTTP_ERROR_CODES = {413: "body_too_large", 415: "unsupported_media_type"}

# Admission reason -> HTTP status. Unknown reasons are 503: the server could not take it.
REJECTION_STATUS = {
    "too_long": 400, "empty_prompt": 400, "unknown_lane": 400,
    "queue_full": 429, "deadline": 429, "slo_unreachable": 429,
    "kv_reject_watermark": 503, "draining": 503, "admission_paused": 503, "loading": 503,
}
REJECTION_PARAM = {"too_long": "max_tokens", "empty_prompt": "prompt", "unknown_lane": "X-Lane"}


# A client's value quoted in an error message keeps at most this many characters: a 1 MB
# model name or a URL-long id comes back clipped, with its length, never echoed whole.
ECHO_CHARS = 80
MAX_MESSAGE_CHARS = 2_000  # any error message, whatever it quotes


def shown(value: Any, limit: int = ECHO_CHARS) -> str:
    """`value` quoted for an error message (its repr), clipped past `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(value)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


class APIError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}
        self.extra = extra or {}  # more top-level keys of the body (e.g. batchpilot)

    def body(self) -> dict[str, Any]:
        return {"error": error_detail(self.status, self.message, code=self.code,
                                      param=self.param), **self.extra}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_detail(status: int, message: str, *, code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    # any other 4xx (401, 409, 428) is the client's: as OpenAI types a bad API key's 401
    default = "invalid_request_error" if status < 500 else "server_error"
    if len(message) > MAX_MESSAGE_CHARS:  # a client's value quoted whole (see `shown`)
        message = f"{message[:MAX_MESSAGE_CHARS]}... (clipped from {len(message):,} characters)"
    return {"message": message, "type": ERROR_TYPES.get(status, default),
            "param": param, "code": code}


def param_named(message: str) -> str | None:
    """The parameter a message in the house form (`name=value must be ...`, `lanes.batch.
    weight=0 ...`) names; None when it names none."""
    name = message.split("=", 1)[0] if "=" in message else ""
    return name if name and all(p.isidentifier() for p in name.split(".")) else None


def value_error(exc: ValueError) -> APIError:
    """A 400 of a ValueError in the house form, its `param` the name the message starts
    with, so a client sees which parameter without parsing the message."""
    return APIError(400, str(exc), code="invalid_value", param=param_named(str(exc)))


def retry_after(seconds: float | None) -> dict[str, str]:
    """The Retry-After header: whole seconds, at least 1."""
    return {"Retry-After": str(max(1, math.ceil(seconds or 1.0)))}


def rejection_error(decision: AdmissionDecision, headers: dict[str, str]) -> APIError:
    reason = decision.reason or "rejected"
    status = REJECTION_STATUS.get(reason, 503)
    headers = {**headers, "X-Batchpilot-Reject-Reason": reason}
    if status in (429, 503):
        headers.update(retry_after(decision.retry_after_s))
    code = "context_length_exceeded" if reason == "too_long" else reason
    return APIError(status, decision.message or f"rejected: {reason}", code=code,
                    param=REJECTION_PARAM.get(reason), headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            msg = f"the body is not valid JSON ({err.get('ctx', {}).get('error', msg)})"
            loc = []
        where = ".".join(loc)
        parts.append(f"{where}: {msg}" if loc and not msg.startswith(f"{where}=") else msg)
        # a whole-body rule (`best_of=3 is not supported ...`) names its field in the message
        param = param or (loc[0] if loc else param_named(msg))
    return "; ".join(parts) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, code="invalid_value", param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        unparsed = _body_not_parsed(exc)
        if unparsed is not None:
            return unparsed.response()
        code = HTTP_ERROR_CODES.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code,
                        param="max_body_bytes" if exc.status_code == 413 else None,
                        headers=dict(exc.headers or {})).response()

    app.add_middleware(CatchAllMiddleware)


def _body_not_parsed(exc: StarletteHTTPException) -> APIError | None:
    """FastAPI's 400 for a body its JSON parse raised on other than a syntax error ("There
    was an error parsing the body", the cause chained), said as the routes that parse by
    hand say it (body_parse.json_body): what was wrong, code invalid_value."""
    cause = exc.__cause__
    if exc.status_code != 400 or not isinstance(cause, (RecursionError, ValueError)):
        return None
    why = ("it nests deeper than the parser takes, ~1,000 levels"
           if isinstance(cause, RecursionError) else str(cause))
    return APIError(400, f"the body is not valid JSON ({why})", code="invalid_value")


class CatchAllMiddleware:
    """Anything unexpected becomes an OpenAI-format 500 (logged here with its traceback;
    the client sees no stack trace). After a stream has started nothing can be sent."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception:
            log.exception("unhandled error serving %s %s", scope.get("method"),
                          scope.get("path"))
            if not started:
                await APIError(500, "internal server error; the server log has the details",
                               code="internal_error").response()(scope, receive, send)
