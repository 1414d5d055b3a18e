"""Bearer tokens for the control API: each has a name (who changed what, in the audit) and
a scope, `read` (GETs) or `admin` (changes too).

    BATCHPILOT_CONTROL_TOKENS="alice:admin:s3cret,grafana:read:t0ken"   # or --control-tokens FILE
    FILE: one token per line, "name scope secret"; blank lines and # comments are skipped

Without any token the control API is open, and only on a loopback address: the server
refuses to start it on another one (see `check_exposure`).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from control.api.errors import APIError

SCOPES = ("read", "admin")
ENV_VAR = "BATCHPILOT_CONTROL_TOKENS"
LOCAL_ACTOR = "local"  # who made a change when no tokens are configured


@dataclass(frozen=True)
class Token:
    name: str
    scope: str
    secret: str


def parse_tokens(entries: list[str], where: str) -> tuple[Token, ...]:
    tokens = []
    for i, entry in enumerate(entries, 1):
        parts = entry.replace(":", " ").split()
        if len(parts) != 3:
            raise ValueError(f"{where}, entry {i}: expected 'name scope secret'")
        name, scope, secret = parts
        if scope not in SCOPES:
            raise ValueError(f"{where}, entry {i} ({name}): scope {scope!r} must be one of"
                             f" {', '.join(SCOPES)}")
        if len(secret) < 8:
            raise ValueError(f"{where}, entry {i} ({name}): the secret must be at least 8"
                             " characters")
        tokens.append(Token(name, scope, secret))
    names = [t.name for t in tokens]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: token names must be unique")
    return tuple(tokens)


def load_tokens(path: str | None) -> tuple[Token, ...]:
    """Tokens from --control-tokens FILE and the environment variable (both may be set)."""
    tokens: list[Token] = []
    if path:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"control tokens file {path!r} does not exist")
        lines = [ln.strip() for ln in file.read_text().splitlines()]
        tokens += parse_tokens([ln for ln in lines if ln and not ln.startswith("#")], path)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        tokens += parse_tokens([e for e in env.split(",") if e.strip()], ENV_VAR)
    return tuple(tokens)


def check_exposure(host: str, tokens: tuple[Token, ...], loopback: tuple[str, ...]) -> None:
    if not tokens and host not in loopback:
        raise ValueError(f"the control API has no tokens, so it may only listen on 127.0.0.1;"
                         f" --host {host} needs --control-tokens FILE or {ENV_VAR}, or"
                         " --no-control-api")


def authorize(request: Request, tokens: tuple[Token, ...], scope: str) -> str:
    """The caller's name if it may use `scope`; else 401 (no or unknown token) / 403."""
    if not tokens:
        return LOCAL_ACTOR
    header = request.headers.get("authorization", "")
    kind, _, secret = header.partition(" ")
    if kind.lower() != "bearer" or not secret:
        raise APIError(401, "the control API needs 'Authorization: Bearer <token>'",
                       code="unauthorized", headers={"WWW-Authenticate": "Bearer"})
    for token in tokens:
        if hmac.compare_digest(token.secret.encode(), secret.strip().encode()):
            if scope == "admin" and token.scope != "admin":
                raise APIError(403, f"token {token.name!r} is read-only; this needs an admin"
                               " token", code="forbidden")
            return token.name
    raise APIError(401, "unknown token", code="unauthorized",
                   headers={"WWW-Authenticate": "Bearer"})
