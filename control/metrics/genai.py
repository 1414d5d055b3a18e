"""`--metrics-compat otel`: the OpenTelemetry GenAI server histograms, beside ours.

    gen_ai_server_time_to_first_token_seconds     finished requests, arrival -> first token
    gen_ai_server_time_per_output_token_seconds   finished requests, mean after the first
    gen_ai_server_request_duration_seconds        every admitted request, arrival -> end

Names as an OpenTelemetry Collector's Prometheus exporter writes `gen_ai.server.*` with unit
`s`; labels the conventions' attributes (dots as underscores): gen_ai_operation_name,
gen_ai_provider_name ("batchpilot"), gen_ai_request_model, error_type (failed requests
only: timeout | error). Buckets: the conventions' ExplicitBucketBoundaries, so a
dashboard built for them reads these as it reads any conforming server. Off by default:
a board summing over both names would count every request twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from control.metrics.core import Histogram
from control.otel.context import PROVIDER
from control.otel.settings import ERROR_OUTCOMES
from engine.records import RequestRecord

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
          "error_type")
DEFAULT_OPERATION = "text_completion"  # a request that came in through no OpenAI route


class GenAIServerMetrics:
    """Observed on the metrics thread, one RequestRecord at a time (ServingMetrics)."""

    def __init__(self, model: str, exemplar_shown: Callable[[str], bool] | None = None):
        """`exemplar_shown`: as ServingMetrics'."""
        self.model = model
        p = "gen_ai_server_"
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to generate the first"
                              " token for successful responses.", LABELS, TTFT_BUCKETS)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Time per output token"
                              " after the first, for successful responses.", LABELS,
                              TPOT_BUCKETS)
        self.duration = Histogram(p + "request_duration_seconds", "Generative AI server"
                                  " request duration: arrival to the last output token.",
                                  LABELS, DURATION_BUCKETS)
        for hist in (self.ttft, self.tpot, self.duration):
            hist.shows = exemplar_shown

    def observe(self, rec: RequestRecord, trace_id: str | None) -> None:
        if rec.outcome == "rejected" or rec.e2e_s is None:
            return  # turned away before the engine: no server request duration
        attrs = dict(rec.trace.attributes) if rec.trace is not None else {}
        error = rec.outcome if rec.outcome in ERROR_OUTCOMES else ""
        key = (str(attrs.get("gen_ai.operation.name", DEFAULT_OPERATION)), PROVIDER,
               self.model, error)
        at = rec.finished_time or 0.0
        self.duration.labels(*key).observe(rec.e2e_s, trace_id, at)
        if rec.outcome == "finished":
            if rec.ttft_s is not None:
                self.ttft.labels(*key).observe(rec.ttft_s, trace_id, at)
            if rec.tpot_s is not None:
                self.tpot.labels(*key).observe(rec.tpot_s, trace_id, at)

    def families(self) -> Iterator[object]:
        for hist in (self.ttft, self.tpot, self.duration):
            yield hist.family()
