"""W3C trace context at the edge: read the caller's `traceparent`, give each request its own
span id, and write the header a replica or the caller reads back.

    traceparent: 00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>

A malformed header is the caller's tracing problem, not a bad request: the W3C spec says to
ignore it and start a new trace, so that is what happens (never a 4xx, never an exception).
Only version 00's layout is parsed; a later version is read by its first four fields, as
the spec asks. All-zero ids are invalid. `tracestate` is not kept (the server adds no
vendor entries, and an unbounded header must not ride along into every record).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Mapping
from typing import Any

from engine.request import TraceLink

HEADER = "traceparent"
PROVIDER = "batchpilot"  # gen_ai.provider.name: no well-known value fits a self-hosted server
MAX_HEADER_LEN = 512  # a valid one is 55 characters; more is junk or an attack
_HEX = re.compile(r"[0-9a-f]+")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


# NOTE: ids from a PRNG seeded once from the OS, not from `secrets` (os.urandom, a syscall
# under the GIL, every call): the span thread makes one per phase span, and half its time
# went there, taken from the engine thread (bench.trace_overhead). W3C ids must be unique
# and random, not secret; the OpenTelemetry SDK's own generator uses random.getrandbits.
_IDS = random.Random(int.from_bytes(os.urandom(16), "big"))
# a forked child must not repeat its parent's ids
os.register_at_fork(after_in_child=lambda: _IDS.seed(int.from_bytes(os.urandom(16), "big")))


def new_trace_id() -> str:
    while True:
        value = f"{_IDS.getrandbits(128):032x}"
        if value != _ZERO_TRACE:
            return value


def new_span_id() -> str:
    while True:
        value = f"{_IDS.getrandbits(64):016x}"
        if value != _ZERO_SPAN:
            return value


def parse_traceparent(value: str | None) -> tuple[str, str, bool] | None:
    """(trace id, parent span id, sampled) from a header value; None when absent or
    malformed (the caller then starts a new trace)."""
    if not value or len(value) > MAX_HEADER_LEN:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4:
        return None
    version, trace_id, span_id, flags = parts[:4]
    if (len(version) != 2 or not _HEX.fullmatch(version) or version == "ff"
            or (version == "00" and len(parts) != 4)):
        return None
    if (len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2
            or not all(_HEX.fullmatch(p) for p in (trace_id, span_id, flags))
            or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN):
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def link_from_headers(headers: Mapping[str, str],
                      attributes: tuple[tuple[str, object], ...] = ()) -> TraceLink:
    """The request's trace: the caller's, continued, or a new one; its own span id."""
    parsed = parse_traceparent(headers.get(HEADER))
    if parsed is None:
        return TraceLink(new_trace_id(), new_span_id(), attributes=attributes)
    trace_id, parent, sampled = parsed
    return TraceLink(trace_id, new_span_id(), parent, sampled, attributes)


def child_link(link: TraceLink) -> TraceLink:
    """A sibling request of the same call (n > 1's later choices): the same trace and
    parent, a span of its own."""
    return dataclasses.replace(link, span_id=new_span_id())


def traceparent(link: TraceLink, sampled: bool | None = None) -> str:
    """The header naming `link`'s own span as the parent (what a replica or a caller reads
    to continue the trace below this request)."""
    flag = link.sampled if sampled is None else sampled
    return f"00-{link.trace_id}-{link.span_id}-{'01' if flag else '00'}"


def span_attributes(operation: str, settings: Any, max_tokens: int,
                    ) -> tuple[tuple[str, object], ...]:
    """What the front end knows of a request for its span: `operation` is the GenAI
    operation name (chat | text_completion); `settings`: the ServeSettings."""
    return (("gen_ai.operation.name", operation), ("gen_ai.provider.name", PROVIDER),
            ("gen_ai.request.model", settings.model_name),
            ("gen_ai.request.max_tokens", int(max_tokens)),
            ("server.address", settings.host), ("server.port", int(settings.port)))
