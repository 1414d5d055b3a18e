"""Bearer tokens for the control plane (the control API, trace reads, what-if, load-test
results): each has a name (who changed what, in the audit), a scope, `read` (GETs, trace
reads, what-if) or `admin` (changes too), and a read token may be bound to tenants, when it
sees only their requests (control/trace/tenant_scope.py).

    BATCHPILOT_CONTROL_TOKENS="alice:admin:s3cret00,grafana:read:t0ken000"   # or a FILE:
    FILE (--control-tokens): one token per line, "name scope secret [tenant,tenant...]"
          (colons may stand for the spaces); blank lines and # comments are skipped
    FILE ending in .yaml / .yml: {"tokens": [{name, scope, secret, tenants: [...]}, ...]}
    In the variable a bound token's tenants follow it, comma-separated:
          "acme-ro:read:s3cret00:acme,acme-eu,alice:admin:s3cret11"

Tokens are loaded and enforced whatever routes are on (--no-control-api turns off /control
only). Without any token the control plane is open, and only on a loopback address: the
server refuses to start it, or a trace, on another one (see `check_exposure`).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from fastapi import Request

from control.api.errors import APIError

SCOPES = ("read", "admin")
ENV_VAR = "BATCHPILOT_CONTROL_TOKENS"
LOCAL_ACTOR = "local"  # who made a change when no tokens are configured
MAX_TENANT_LEN = 128  # as X-Tenant (control/api/request_meta.py)


@dataclass(frozen=True)
class Token:
    name: str
    scope: str
    secret: str
    tenants: tuple[str, ...] | None = None  # read tokens: the tenants it sees; None: all


@dataclass(frozen=True)
class Caller:
    """Who sent a control-plane request: `tenants` None sees every tenant's requests."""

    name: str
    scope: str
    tenants: tuple[str, ...] | None = None

    @property
    def bound(self) -> bool:
        return self.tenants is not None


LOCAL_CALLER = Caller(LOCAL_ACTOR, "admin")


def _token(name: str, scope: str, secret: str, tenants: list[str] | None, where: str,
           ) -> Token:
    if scope not in SCOPES:
        raise ValueError(f"{where} ({name}): scope {scope!r} must be one of"
                         f" {', '.join(SCOPES)}")
    if len(secret) < 8:
        raise ValueError(f"{where} ({name}): the secret must be at least 8 characters")
    if tenants is None:
        return Token(name, scope, secret)
    if scope != "read":
        raise ValueError(f"{where} ({name}): only read tokens may be bound to tenants (an"
                         " admin token changes the config every tenant runs under)")
    names = tuple(t.strip() for t in tenants if t.strip())
    if not names or any(len(t) > MAX_TENANT_LEN or not t.isprintable() for t in names):
        raise ValueError(f"{where} ({name}): tenants must be printable names of at most"
                         f" {MAX_TENANT_LEN} characters, at least one")
    return Token(name, scope, secret, names)


def parse_tokens(entries: list[str], where: str) -> tuple[Token, ...]:
    """Entries "name scope secret [tenant,tenant...]" (or with colons) -> tokens."""
    tokens = []
    for i, entry in enumerate(entries, 1):
        parts = entry.replace(":", " ").split(maxsplit=3)
        if len(parts) not in (3, 4):
            raise ValueError(f"{where}, entry {i}: expected 'name scope secret [tenants]'")
        tenants = parts[3].replace(" ", ",").split(",") if len(parts) == 4 else None
        tokens.append(_token(*parts[:3], tenants, f"{where}, entry {i}"))
    return _unique(tokens, where)


def _yaml_tokens(path: Path) -> tuple[Token, ...]:
    data = yaml.safe_load(path.read_text()) or {}
    items = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected {{tokens: [{{name, scope, secret, tenants}}]}}")
    tokens = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict) or set(item) - {"name", "scope", "secret", "tenants"}:
            raise ValueError(f"{path}, token {i}: keys are name, scope, secret, tenants")
        tenants = item.get("tenants")
        if tenants is not None and not isinstance(tenants, list):
            raise ValueError(f"{path}, token {i}: tenants must be a list of names")
        tokens.append(_token(str(item.get("name", "")), str(item.get("scope", "")),
                             str(item.get("secret", "")),
                             None if tenants is None else [str(t) for t in tenants],
                             f"{path}, token {i}"))
    return _unique(tokens, str(path))


def _unique(tokens: list[Token], where: str) -> tuple[Token, ...]:
    names = [t.name for t in tokens]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: token names must be unique")
    return tuple(tokens)


def _env_entries(value: str) -> list[str]:
    """Comma-separated entries; a piece with no ':' is one more tenant of the entry before."""
    entries: list[str] = []
    for piece in (p.strip() for p in value.split(",")):
        if not piece:
            continue
        if ":" not in piece and entries and len(entries[-1].split(":")) == 4:
            entries[-1] += f",{piece}"
        else:
            entries.append(piece)
    return entries


def load_tokens(path: str | None) -> tuple[Token, ...]:
    """Tokens from --control-tokens FILE and the environment variable (both may be set)."""
    tokens: list[Token] = []
    if path:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"control tokens file {path!r} does not exist")
        if file.suffix in (".yaml", ".yml"):
            tokens += _yaml_tokens(file)
        else:
            lines = [ln.strip() for ln in file.read_text().splitlines()]
            tokens += parse_tokens([ln for ln in lines if ln and not ln.startswith("#")], path)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        tokens += parse_tokens(_env_entries(env), ENV_VAR)
    return _unique(tokens, "control tokens")


def check_exposure(host: str, tokens: tuple[Token, ...], loopback: tuple[str, ...], *,
                   control_api: bool = True, trace: bool = False) -> None:
    """Without tokens, the control API and the trace API (every tenant's requests) may only
    listen on loopback."""
    if tokens or host in loopback:
        return
    if control_api:
        raise ValueError(f"the control API has no tokens, so it may only listen on 127.0.0.1;"
                         f" --host {host} needs --control-tokens FILE or {ENV_VAR}, or"
                         " --no-control-api")
    if trace:
        raise ValueError(f"the trace API (every tenant's requests) has no tokens, so it may"
                         f" only listen on 127.0.0.1; --host {host} with --trace-db needs"
                         f" --control-tokens FILE or {ENV_VAR}")


def caller(request: Request, tokens: tuple[Token, ...], scope: str) -> Caller:
    """Who sent `request`, if it may use `scope`; else 401 (no or unknown token) / 403."""
    if not tokens:
        return LOCAL_CALLER
    return token_caller(request.headers.get("authorization", ""), tokens, scope)


def token_caller(header: str, tokens: tuple[Token, ...], scope: str) -> Caller:
    """Who an Authorization header names, if it may use `scope`; else 401 / 403."""
    token = known_token(header, tokens)
    if scope == "admin" and token.scope != "admin":
        raise APIError(403, f"token {token.name!r} is read-only; this needs an admin"
                       " token", code="forbidden")
    return Caller(token.name, token.scope, token.tenants)


def known_token(header: str, tokens: tuple[Token, ...]) -> Token:
    """The token an Authorization header's bearer secret names; else 401."""
    kind, _, secret = header.partition(" ")
    if kind.lower() != "bearer" or not secret:
        raise APIError(401, "this route needs 'Authorization: Bearer <token>'",
                       code="unauthorized", headers={"WWW-Authenticate": "Bearer"})
    for token in tokens:
        if hmac.compare_digest(token.secret.encode(), secret.strip().encode()):
            return token
    raise APIError(401, "unknown token", code="unauthorized",
                   headers={"WWW-Authenticate": "Bearer"})


def authorize(request: Request, tokens: tuple[Token, ...], scope: str) -> str:
    """The caller's name if it may use `scope` (see `caller`)."""
    return caller(request, tokens, scope).name


def require_unbound(who: Caller, what: str) -> None:
    """403 for a tenant-bound token on a route that shows every tenant's data or config."""
    if who.bound:
        raise APIError(403, f"token {who.name!r} is bound to tenants"
                       f" ({', '.join(who.tenants or ())}): {what} mixes every tenant's"
                       " requests or the server's config; it needs an unbound read token",
                       code="forbidden")
