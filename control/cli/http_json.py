"""The CLIs' one HTTP client: a JSON request to a batchpilot server, with the stdlib only
(the serving package does not need an HTTP client library to run).

A failure is an HTTPFailure: `status` is the HTTP status with the server's error message
and JSON body, or None when the server could not be reached or did not answer JSON.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HTTPFailure(Exception):
    def __init__(self, status: int | None, message: str, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.body = status, message, body or {}


def request_json(base: str, path: str, *, method: str = "GET", body: Any = None,
                 headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> Any:
    url = base + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        try:
            error_body = json.loads(exc.read())
            message = error_body["error"]["message"]
        except Exception:  # not our JSON error: say what HTTP said
            error_body, message = {}, str(exc.reason)
        raise HTTPFailure(exc.code, message, error_body) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HTTPFailure(None, f"cannot reach the server at {base}: {reason}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise HTTPFailure(None, f"{method} {path} did not answer with JSON; is {base} a"
                          " batchpilot server?") from None
