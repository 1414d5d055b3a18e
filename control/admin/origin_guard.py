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

With tokens, every control route's caller is also known here, before its body is read: a
caller without a valid token learns nothing of what the route expects (a 401, never a 400
about the body), a token bound to tenants gets a 403 (every control route shows or
changes what all tenants share), and so does a read token on a change. The routes still
check their scope. Host, Origin and Authorization sent more than once, or a Host that is
not one name, are a 400: the two readers (this guard, the route) must not pick different
copies.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from control.admin.auth import Token, require_unbound, token_caller
from control.api.errors import APIError, shown

CONTROL_PREFIXES = ("/control/", "/v1/whatif", "/v1/loadtest/results")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
SINGLE_HEADERS = ("host", "origin", "authorization")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class OriginGuard:
    """Pure ASGI middleware. `check_host`: the server listens on loopback without tokens."""

    def __init__(self, app: ASGIApp, *, check_host: bool, tokens: tuple[Token, ...] = ()):
        self.app = app
        self.check_host = check_host
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.problem(scope)
            if problem is not None:
                await problem.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, scope: Scope) -> APIError | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        repeated = _repeated(scope["headers"])
        if repeated is not None:
            return APIError(400, f"{repeated} was sent more than once; send it once",
                            code="invalid_value", param=repeated)
        host = headers.get("host")
        if host is not None and not _one_name(host):
            return APIError(400, f"Host {shown(host)} must be one host name (and port)",
                            code="invalid_value", param="Host")
        # NOTE: no Host at all is an in-process call (a fleet replica reached by handle,
        # control/fleet/asgi_call.py): a browser always sends one
        if self.check_host and host is not None and _hostname(host) not in LOOPBACK_NAMES:
            return APIError(421, f"Host {shown(host)} is not a loopback name: this server listens"
                            " on loopback without tokens, and answers only requests addressed"
                            " to 127.0.0.1, localhost or [::1] (a page on another name that"
                            " resolves here must not steer or read it)",
                            code="misdirected_request", param="Host")
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if not path.startswith(CONTROL_PREFIXES):
            return None
        if self.tokens:
            scope = "admin" if _changes(method, path) else "read"
            try:
                who = token_caller(headers.get("authorization", ""), self.tokens, scope)
                require_unbound(who, f"{path} (the server's config, its history or a change)")
            except APIError as exc:
                return exc
        if method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and _authority(origin) != (host or "").lower():
            return APIError(403, f"Origin {shown(origin)} is not this server ({host}): the control"
                            " plane refuses cross-origin changes", code="cross_origin",
                            param="Origin")
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            return APIError(415, f"Content-Type {shown(media_type or 'none')}: changes to the"
                            " control plane must be sent as application/json",
                            code="unsupported_media_type", param="Content-Type")
        return None


def _changes(method: str, path: str) -> bool:
    """A request only an admin token may send: any change under /control, and load-test
    results written to the trace (a what-if, POST /v1/whatif, only reads)."""
    return method not in SAFE_METHODS and path.startswith(("/control/", "/v1/loadtest/"))


def _repeated(raw: list[tuple[bytes, bytes]]) -> str | None:
    """The first of SINGLE_HEADERS sent more than once, by its name; else None."""
    names = [k.decode("latin-1") for k, _ in raw if k.decode("latin-1") in SINGLE_HEADERS]
    return next((n.title() for n in SINGLE_HEADERS if names.count(n) > 1), None)


def _one_name(host: str) -> bool:
    """'localhost:8000' yes; 'localhost:8000, evil.example' (a list) or 'localhost/evil'
    (a path, a user or a query in a Host) no."""
    return bool(host) and not any(c in host for c in ", \t/@?#\\")


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
