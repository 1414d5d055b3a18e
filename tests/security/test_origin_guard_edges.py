"""The origin guard's edges (control/admin/origin_guard.py), asked directly, with no engine:
which Host names a tokenless loopback server answers, which Origin and Content-Type a change
must carry, which methods are changes, and what each token may do before its body is read."""

from __future__ import annotations

import pytest

from control.admin.auth import Token
from control.admin.origin_guard import OriginGuard

TOKENS = (Token("ops", "admin", "ops-secret-1"), Token("viewer", "read", "view-secret-1"),
          Token("acme-ro", "read", "acme-secret1", ("acme",)))
JSON = ("content-type", "application/json")


def status(guard: OriginGuard, method: str, path: str, *headers: tuple[str, str]) -> int:
    """The guard's refusal's status for this request; 0 when it lets it through."""
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]}
    problem = guard.problem(scope)
    return 0 if problem is None else problem.status


def loopback_guard() -> OriginGuard:
    return OriginGuard(None, check_host=True)


@pytest.mark.parametrize("host", ["localhost.evil.example", "127.0.0.1.nip.io:8000",
                                  "localhostevil", "127.0.0.10", "[::1.evil]"])
def test_a_name_that_only_begins_like_loopback_is_a_421(host):
    """A page on a name that rebinds to 127.0.0.1 must not read the answers: only the three
    loopback names, whatever the port or the case, are answered."""
    assert status(loopback_guard(), "GET", "/v1/models", ("host", host)) == 421
    for good in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LocalHost"):
        assert status(loopback_guard(), "GET", "/v1/models", ("host", good)) == 0, good


def test_a_host_holding_a_list_without_spaces_is_a_400():
    """'localhost:8000,evil.example': two names, one of which a proxy may pick."""
    guard = loopback_guard()
    assert status(guard, "GET", "/v1/models", ("host", "localhost:8000,evil.example")) == 400


@pytest.mark.parametrize("origin", ["null", "http://localhost:3000", "http://127.0.0.1:9999",
                                    "http://evil.example:8000", "file://"])
def test_an_origin_of_another_server_or_null_is_a_403(origin):
    """A sandboxed page (Origin: null) or another local server's page (same name, another
    port) changes nothing; the operator's own page on this host and port does."""
    guard = loopback_guard()
    host = ("host", "localhost:8000")
    assert status(guard, "POST", "/control/drain", host, JSON, ("origin", origin)) == 403
    assert status(guard, "POST", "/control/drain", host, JSON,
                  ("origin", "HTTP://LOCALHOST:8000")) == 0


@pytest.mark.parametrize("media", ["text/plain; x=json", "text/plain;charset=json",
                                   "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=json", "application/jsonp"])
def test_a_change_a_page_can_send_without_cors_is_a_415(media):
    guard = loopback_guard()
    host = ("host", "127.0.0.1:8000")
    assert status(guard, "PATCH", "/control/config", host, ("content-type", media)) == 415
    for good in ("application/json", "Application/JSON; charset=utf-8"):
        assert status(guard, "PATCH", "/control/config", host, ("content-type", good)) == 0


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_every_changing_method_is_checked(method):
    guard = loopback_guard()
    host = ("host", "127.0.0.1:8000")
    evil = ("origin", "http://evil.example")
    assert status(guard, method, "/control/config", host, JSON, evil) == 403
    assert status(guard, method, "/control/config", host) == 415
    for safe in ("GET", "HEAD", "OPTIONS"):
        assert status(guard, safe, "/control/config", host, evil) == 0


def test_each_token_is_ruled_on_before_the_body_is_read():
    """A read token writes no load-test results (they go into the trace) but may ask a
    what-if (it only reads); a tenant-bound token reads nothing of the control plane; no
    token is a 401; an admin token may do all."""
    guard = OriginGuard(None, check_host=False, tokens=TOKENS)

    def call(method: str, path: str, secret: str | None) -> int:
        auth = () if secret is None else (("authorization", f"Bearer {secret}"),)
        return status(guard, method, path, ("host", "batchpilot.internal"), JSON, *auth)

    assert call("POST", "/v1/loadtest/results", "view-secret-1") == 403
    assert call("POST", "/v1/whatif", "view-secret-1") == 0
    assert call("GET", "/control/config", "view-secret-1") == 0
    assert call("PATCH", "/control/config", "view-secret-1") == 403
    assert call("GET", "/control/config", "acme-secret1") == 403
    assert call("GET", "/control/history", None) == 401
    assert call("POST", "/v1/loadtest/results", "ops-secret-1") == 0
    assert call("GET", "/v1/models", None) == 0  # the data plane: not this guard's
