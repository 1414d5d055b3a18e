"""A fleet ingress's part of a request's trace: it continues the caller's traceparent,
records its routing decision as a span, and hands the replica a traceparent naming that
span, so the replica's request span (control/otel/spans.py) hangs below it.

    hop = door.enter(headers, body)     # at arrival: the trace link, the sampling decision
    hop.reason = decision.reason        # once routed
    headers = hop.headers(headers, replica_id)   # what the replica receives
    hop.end(status)                     # the relayed response ended: span exported if kept

The ingress cannot see how the request will end, so it decides at the door: the caller's
sampled flag, else the ratio by trace id (settings.sampled_at_the_door: the replica keeps
the same ordinary requests). A request the replica keeps only for failing or being slow
has its replica spans without this routing span above them; a 5xx at the ingress itself
(no replica, replica down) is always exported.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from control.otel.context import HEADER, link_from_headers, traceparent
from control.otel.settings import OtelSettings, sampled_at_the_door
from engine.request import TraceLink


class TraceDoor:
    def __init__(self, settings: OtelSettings):
        from control.otel.export import SpanExport, resource_of  # the SDK: only when on

        self.settings = dataclasses.replace(settings, replica="ingress").validate()
        self.export = SpanExport(self.settings)
        self.resource = resource_of(self.settings)

    def enter(self, headers: Mapping[str, str], body: dict[str, Any]) -> Hop:
        model = body.get("model")
        attrs = (("gen_ai.request.model", model),) if isinstance(model, str) and \
            len(model) <= 256 else ()
        link = link_from_headers(headers, attrs)
        sampled = sampled_at_the_door(link.trace_id, link.parent_span_id, link.sampled,
                                      self.settings)
        return Hop(self, link, sampled, time.time())


@dataclasses.dataclass
class Hop:
    door: TraceDoor
    link: TraceLink
    sampled: bool
    arrived: float
    reason: str = ""
    replica: int = -1
    matched_blocks: int | None = None  # set under precise routing
    ended: bool = False

    def headers(self, headers: list[tuple[bytes, bytes]], replica: int,
                ) -> list[tuple[bytes, bytes]]:
        """The replica's headers: the caller's traceparent replaced by this span's."""
        self.replica = replica
        value = traceparent(self.link, self.sampled).encode()
        return [(k, v) for k, v in headers if k.lower() != HEADER.encode()] + [
            (HEADER.encode(), value)]

    def end(self, status: int) -> None:
        if self.ended:
            return
        self.ended = True
        if self.sampled or status >= 500:
            from control.otel.spans import routing_span

            self.door.export.put(routing_span(
                self.door.resource, self.link, self.arrived, time.time(), self.replica,
                self.reason or "none", status, self.matched_blocks))
