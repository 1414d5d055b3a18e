"""What a web page in the operator's browser must not be able to do to a local server.

Without tokens the control plane is open on loopback (control/admin/auth.py), and a browser
is a local process: any page it shows can send a no-cors POST to 127.0.0.1:8000, and a page
on a name that rebinds to 127.0.0.1 reads the answers too. So:

    every request, tokenless server on loopback   Host, when sent, must name loopback
                                                  (127.0.0.1, localhost, [::1]): else 421
    a change to the control plane (POST/PUT/PATCH/DELETE on /control/*, /v1/whatif,
    /v1/loadtest/results), always:
        Origin, when sent, names this Host        else 403 (a cross-origin page)
        Content-Type is application/json          else 415 (a form or text/plain POST: the
                                                  only kinds a page sends without CORS)

The CLI, the dashboard and the fleet send JSON with no Origin; curl sends no Origin either.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from control.api.errors import APIError

CONTROL_PREFIXES = ("/control/", "/v1/whatif", "/v1/loadtest/results")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class OriginGuard:
    """Pure ASGI middleware. `check_host`: the server listens on loopback without tokens."""

    def __init__(self, app: ASGIApp, *, check_host: bool):
        self.app = app
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.problem(scope)
            if problem is not None:
                await problem.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, scope: Scope) -> APIError | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host")
        # NOTE: no Host at all is an in-process call (a fleet replica reached by handle,
        # control/fleet/asgi_call.py): a browser always sends one
        if self.check_host and host is not None and _hostname(host) not in LOOPBACK_NAMES:
            return APIError(421, f"Host {host!r} is not a loopback name: this server listens"
                            " on loopback without tokens, and answers only requests addressed"
                            " to 127.0.0.1, localhost or [::1] (a page on another name that"
                            " resolves here must not steer or read it)",
                            code="misdirected_request", param="Host")
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if method in SAFE_METHODS or not path.startswith(CONTROL_PREFIXES):
            return None
        origin = headers.get("origin")
        if origin is not None and _authority(origin) != (host or "").lower():
            return APIError(403, f"Origin {origin!r} is not this server ({host}): the control"
                            " plane refuses cross-origin changes", code="cross_origin",
                            param="Origin")
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            return APIError(415, f"Content-Type {media_type or 'none'!r}: changes to the"
                            " control plane must be sent as application/json",
                            code="unsupported_media_type", param="Content-Type")
        return None


def _hostname(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1'; '[::1]:8000' -> '::1'; lower-cased."""
    try:
        return (urlsplit(f"//{host}").hostname or "").lower()
    except ValueError:  # a malformed port or bracket
        return ""


def _authority(origin: str) -> str | None:
    """'http://127.0.0.1:8000' -> '127.0.0.1:8000' (what the Host header says)."""
    try:
        return urlsplit(origin).netloc.lower() or None
    except ValueError:
        return None
