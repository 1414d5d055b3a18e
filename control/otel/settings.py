"""What the OpenTelemetry export is told (`--otlp-*` flags, ServeSettings), and which
requests it keeps; light to import: the SDK loads only when a server exports
(control/otel/feed.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.records import RequestRecord

PROTOCOLS = ("http/protobuf", "grpc")
ERROR_OUTCOMES = ("error", "timeout")  # always exported; span status ERROR
_RATIO_BITS = 2**64


@dataclass(frozen=True)
class OtelSettings:
    endpoint: str  # e.g. http://127.0.0.1:4318/v1/traces (HTTP) or 127.0.0.1:4317 (gRPC)
    protocol: str = "http/protobuf"  # or grpc
    sample_ratio: float = 1.0  # share of ordinary requests kept (0..1)
    slow_ttft_s: float | None = None  # requests slower than this to a first token: kept
    service_name: str = "batchpilot"
    replica: str = ""  # a fleet replica's name (batchpilot.replica, service.instance.id)

    def validate(self) -> OtelSettings:
        for name, value in (("otlp_sample_ratio", self.sample_ratio),
                            ("otlp_slow_ttft_s", self.slow_ttft_s)):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float)):
                raise ValueError(f"{name}={value!r} must be a number")
        if not isinstance(self.endpoint, str) or not self.endpoint \
                or len(self.endpoint) > 2048:
            raise ValueError(f"otlp_traces_endpoint={self.endpoint!r} must be a URL"
                             " (at most 2048 characters)")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"otlp_protocol={self.protocol!r} must be one of {PROTOCOLS}")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"otlp_sample_ratio={self.sample_ratio!r} must be in [0, 1]")
        if self.slow_ttft_s is not None and not self.slow_ttft_s > 0:
            raise ValueError(f"otlp_slow_ttft_s={self.slow_ttft_s!r} must be > 0 or unset")
        return self

    def describe(self) -> str:
        """One line for the ready banner."""
        slow = f", and any slower than {self.slow_ttft_s:g} s to a first token" \
            if self.slow_ttft_s is not None else ""
        return (f"otlp: spans to {self.endpoint} ({self.protocol}); kept: as the caller's"
                f" traceparent says, else {self.sample_ratio:g} of traces; always errors and"
                f" timeouts{slow}")


def sampled_at_the_door(trace_id: str, parent_span_id: str, caller_sampled: bool,
                        settings: OtelSettings) -> bool:
    """The head decision of a hop that cannot see how the request ends (a fleet ingress):
    the caller's flag when it sent one, else the ratio by trace id (the rule `keep` applies
    to ordinary requests, so the replica keeps the same ones)."""
    if parent_span_id:
        return caller_sampled
    return int(trace_id[16:], 16) < settings.sample_ratio * _RATIO_BITS


def keep(rec: RequestRecord, settings: OtelSettings) -> bool:
    """Whether a finished request's spans are exported. Sampling happens when a request
    ends, so the rule can see how it went: always kept are errors, timeouts and requests
    whose TTFT passed `slow_ttft_s`; the rest follow the caller's sampled flag when its
    traceparent had one, else `sample_ratio` by trace id (OpenTelemetry's TraceIdRatioBased
    rule on the id's low 64 bits, so every service keeps the same traces)."""
    link = rec.trace
    if link is None:
        return False
    if rec.outcome in ERROR_OUTCOMES:
        return True
    slow = settings.slow_ttft_s
    if slow is not None and rec.ttft_s is not None and rec.ttft_s > slow:
        return True
    return sampled_at_the_door(link.trace_id, link.parent_span_id, link.sampled, settings)
