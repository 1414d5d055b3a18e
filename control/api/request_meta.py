"""Routing metadata of one request, from its headers and body.

    tenant    X-Tenant, else the body's `user`, else "default"
    lane      X-Lane, else None: the engine routes by prompt length
              (long_context_threshold -> long_context_lane, else default_lane)
    priority  X-Priority, else the body's `priority`, else 0 (smaller runs first): the
              header wins, as X-Tenant wins over `user`, so that a gateway that sets it
              decides every request's priority whatever the client's body says
    deadline  X-Deadline-Ms: milliseconds from the request's arrival at the server by
              which it must finish, turned into an absolute time on the engine clock
              (time.time(), seconds)
    timeout   X-Request-Timeout-Ms, capped at the server's max_request_timeout_s (also
              the default): past it the request is aborted as a timeout
    resent    X-Stainless-Retry-Count > 0: the OpenAI SDK (and the other Stainless SDKs)
              sends this count on every request; above 0 the client was refused (or cut
              off) before and sends it again, so its user has been waiting since a send
              this server never timed (engine Request.resent)

Each of these headers sent twice is a 400 naming it: a gateway that appends its X-Tenant
after the client's, instead of replacing it, must not leave the client's in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from control.api.errors import APIError, shown
from engine.config.schema import MAX_NAME_CHARS, printable_name  # tenant and lane names

PRIORITY_LIMIT = 2**31  # |priority| below this
MAX_MS = 7 * 24 * 3600 * 1000  # a week: more is certainly a unit mistake
MAX_RETRY_COUNT = 1000  # X-Stainless-Retry-Count: an SDK resends a few times, never more


@dataclass(frozen=True)
class RequestMeta:
    tenant: str
    lane: str | None
    priority: int
    deadline: float | None  # absolute, engine clock (s)
    timeout_s: float  # from arrival
    arrival_time: float | None = None  # reached the server (engine clock, s): `now`
    tokenize_s: float = 0.0  # spent tokenizing and templating it (set by the route)
    resent: bool = False  # X-Stainless-Retry-Count > 0


def read_meta(headers: Mapping[str, str], user: str | None, priority: int | None, *,
              now: float, max_timeout_s: float) -> RequestMeta:
    """`now`: the request's arrival (engine clock). Raises APIError(400) naming the
    header that is malformed."""
    tenant = tenant_of(headers, user)
    lane = _name(_utf8(_one(headers, "X-Lane")), "X-Lane")
    sent = _int(_one(headers, "X-Priority"), "X-Priority", -PRIORITY_LIMIT, PRIORITY_LIMIT - 1)
    if sent is not None:
        priority = sent
    elif priority is not None and not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:
        raise APIError(400, f"priority={priority} must be in [-2**31, 2**31)",
                       code="invalid_value", param="priority")
    deadline_ms = _int(_one(headers, "X-Deadline-Ms"), "X-Deadline-Ms", 1, MAX_MS)
    deadline = now + deadline_ms / 1000.0 if deadline_ms is not None else None
    timeout_ms = _int(_one(headers, "X-Request-Timeout-Ms"), "X-Request-Timeout-Ms", 1, MAX_MS)
    timeout_s = max_timeout_s if timeout_ms is None else min(timeout_ms / 1000.0,
                                                              max_timeout_s)
    retries = _int(_one(headers, "X-Stainless-Retry-Count"), "X-Stainless-Retry-Count", 0,
                   MAX_RETRY_COUNT)
    return RequestMeta(tenant, lane, priority or 0, deadline, timeout_s, arrival_time=now,
                       resent=bool(retries))


def tenant_of(headers: Mapping[str, str], user: str | None) -> str:
    """X-Tenant, else the body's `user`, else "default"; APIError(400) when malformed. (A
    fleet's ingress asks it too: the tenant roots a request's prefix-cache domain.)"""
    return (_name(_utf8(_one(headers, "X-Tenant")), "X-Tenant") or _name(user, "user")
            or "default")


def _one(headers: Mapping[str, str], name: str) -> str | None:
    """The header's one value (None when absent); 400 when it was sent more than once."""
    values = headers.getlist(name) if hasattr(headers, "getlist") else \
        [v for v in (headers.get(name.lower()),) if v is not None]
    if len(values) > 1:
        raise APIError(400, f"{name} was sent {len(values)} times; send it once (a gateway"
                       " must replace a client's value, not add its own after it)",
                       code="invalid_value", param=name)
    return values[0] if values else None


def _utf8(value: str | None) -> str | None:
    """A header's text as its sender meant it: ASGI servers decode header bytes as Latin-1,
    so a gateway's UTF-8 "用户" arrives as mojibake; bytes that are not UTF-8 stay Latin-1
    (and the printable check below refuses their control characters)."""
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _name(value: str | None, where: str) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if not printable_name(value):
        raise APIError(400, f"{where} must be printable and at most {MAX_NAME_CHARS} characters",
                       code="invalid_value", param=where)
    return value


def _int(value: str | None, where: str, low: int, high: int) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise APIError(400, f"{where}={shown(value)} must be an integer", code="invalid_value",
                       param=where) from None
    if not low <= number <= high:
        raise APIError(400, f"{where}={number} must be in {low}..{high}",
                       code="invalid_value", param=where)
    return number
