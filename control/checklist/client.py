"""The live server's side of the evidence: GET /metrics (text), /control/config and
/control/history (JSON, with the bearer token from an environment variable, as
`batchpilot ctl` sends it). Unreachable, or a refused token: ChecklistError (exit 2);
a 404 (metrics or the control API off) or 503 (loading) is an answer: `Unavailable`.

A fleet ingress (`batchpilot fleet`) answers for every replica, its /metrics labelled
`replica="<id>"`; with `replica`, requests name it (X-Batchpilot-Replica) and /metrics keeps
that replica's samples only."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

from control.checklist.result import ChecklistError
from control.cli.http_json import (
    HTTPFailure,
    is_redirect,
    open_url,
    redirect_message,
    request_json,
)
from control.trace.sources import REPLICA_HEADER

TOKEN_ENV = "BATCHPILOT_TOKEN"  # the same default as `batchpilot ctl`
HTTP_TIMEOUT_S = 30.0


class Unavailable(Exception):
    """The server answered, but has no such evidence (metrics off, control API off)."""


class ControlClient:
    def __init__(self, url: str, token_env: str = TOKEN_ENV, replica: str | None = None):
        if not url.startswith(("http://", "https://")):
            raise ChecklistError(f"--url {url!r} must start with http:// or https://")
        self.url, self.token_env, self.replica = url.rstrip("/"), token_env, replica
        self.token = os.environ.get(token_env) or None

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.replica is not None:
            headers[REPLICA_HEADER] = self.replica
        return headers

    def get_json(self, path: str) -> Any:
        try:
            return request_json(self.url, path, headers=self._headers(),
                                timeout_s=HTTP_TIMEOUT_S)
        except HTTPFailure as exc:
            raise self._failure(exc.status, exc.message, path) from None

    def get_text(self, path: str) -> str:
        request = urllib.request.Request(self.url + path, headers=self._headers())
        try:  # open_url: a redirect is not followed (it would carry the token on)
            with open_url(request, HTTP_TIMEOUT_S) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            if is_redirect(exc):
                raise ChecklistError(redirect_message(exc, self.url, "GET", path)) from None
            raise self._failure(exc.code, str(exc.reason), path) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise self._failure(None, f"cannot reach the server at {self.url}: {reason}",
                                path) from None
        if path == "/metrics" and self.replica is not None:
            return only_replica(text, self.replica)
        return text

    def _failure(self, status: int | None, message: str, path: str) -> Exception:
        if status is None:
            return ChecklistError(message)
        if status in (401, 403):
            hint = (f"no token was sent (${self.token_env} is not set)" if not self.token
                    else f"check the token in ${self.token_env}")
            return ChecklistError(f"GET {path}: the server answered {status}: {message};"
                                  f" {hint}; --token-env NAME reads it from another variable")
        if status in (404, 503):
            return Unavailable(f"GET {path} answered {status}: {message}")
        return ChecklistError(f"GET {path}: the server answered {status}: {message}")


def only_replica(text: str, replica: str) -> str:
    """A fleet's merged /metrics -> one replica's samples (and every comment line); a
    server's own /metrics (no replica label) is returned as it is."""
    if f'replica="{replica}"' not in text and 'replica="' in text:
        raise ChecklistError(f"replica={replica!r}: /metrics has no such replica")
    if 'replica="' not in text:
        raise ChecklistError(f"replica={replica!r}: this server is not a fleet ingress"
                             " (its /metrics has no replica label)")
    keep = [line for line in text.splitlines()
            if line.startswith("#") or f'replica="{replica}"' in line]
    return "\n".join(keep) + "\n"
