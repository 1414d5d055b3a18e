"""The CLIs' one HTTP client: a JSON request to a batchpilot server, with the stdlib only
(the serving package does not need an HTTP client library to run).

A failure is an HTTPFailure: `status` is the HTTP status with the server's error message
and JSON body, or None when the server could not be reached or did not answer JSON.

Redirects are never followed: urllib would send the request's `Authorization` header on to
wherever a 3xx points, another host included, so a server (or anyone who can make it
answer 3xx) could collect the operator's bearer token. A 3xx is a failure that names where
it pointed; the operator gives that URL instead. Every client here that may carry a token
opens URLs through `open_url`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPResponse
from typing import Any


class HTTPFailure(Exception):
    def __init__(self, status: int | None, message: str, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.body = status, message, body or {}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """No new request for a 3xx: the opener's default error handler then raises it as an
    HTTPError carrying the status and the Location header."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def open_url(request: urllib.request.Request, timeout_s: float) -> HTTPResponse:
    """urlopen without redirects: a 3xx raises urllib.error.HTTPError (see
    `redirect_message`)."""
    return _OPENER.open(request, timeout=timeout_s)


def is_redirect(exc: urllib.error.HTTPError) -> bool:
    return 300 <= exc.code < 400


def redirect_message(exc: urllib.error.HTTPError, base: str, method: str, path: str) -> str:
    """What to tell the operator about a 3xx: where it pointed and which URL to give."""
    url = base + path
    location = exc.headers.get("Location")
    if not location:
        return (f"{method} {url}: the server answered {exc.code} (a redirect) without a"
                " Location; the CLI does not follow redirects with a token")
    target = urllib.parse.urljoin(url, location)
    # the base to give instead: the target less the path asked for, when it kept that path
    suggested = target[:-len(path)] if path and target.endswith(path) else target
    return (f"{method} {url}: the server redirected ({exc.code}) to {target}; the CLI does"
            " not follow redirects with a token (it would send the token there too); if"
            f" that is the server, use --url {suggested}")


def request_json(base: str, path: str, *, method: str = "GET", body: Any = None,
                 headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> Any:
    url = base + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with open_url(request, timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        if is_redirect(exc):
            raise HTTPFailure(exc.code, redirect_message(exc, base, method, path)) from None
        error_body, message = _error_of(exc)
        raise HTTPFailure(exc.code, message, error_body) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HTTPFailure(None, f"cannot reach the server at {base}: {reason}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise HTTPFailure(None, f"{method} {path} did not answer with JSON; is {base} a"
                          " batchpilot server?") from None


def _error_of(exc: urllib.error.HTTPError) -> tuple[dict[str, Any], str]:
    """(its JSON body, its message) of an HTTP error: our error's message, else what HTTP
    said. A JSON object of another shape is kept as the body: a fleet ingress's 503 /readyz
    lists its replicas (the trace CLI and the dashboard read one replica through it)."""
    try:
        body = json.loads(exc.read())
    except Exception:  # not JSON
        return {}, str(exc.reason)
    if not isinstance(body, dict):
        return {}, str(exc.reason)
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return body, message if isinstance(message, str) else str(exc.reason)
