"""`--metrics-compat otel`'s GenAI server histograms (control/metrics/genai.py), fed records
directly: a failed request's duration carries error_type (timeout | error), while time to
first token and per output token count successful responses only, as the conventions
define them; a request turned away before the engine has no server duration."""

from __future__ import annotations

import dataclasses

from control.metrics.genai import GenAIServerMetrics
from engine.records import RequestRecord
from engine.request import TraceLink

LINK = TraceLink("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7",
                 attributes=(("gen_ai.operation.name", "chat"),))


def ended(finish_reason: str, e2e_s: float | None, ttft_s: float | None = 0.2,
          tpot_s: float | None = 0.05) -> RequestRecord:
    filled = {f.name: 0 for f in dataclasses.fields(RequestRecord)
              if f.default is dataclasses.MISSING}
    filled.update(request_id="r", lane="interactive", tenant="default", status="FINISHED",
                  finish_reason=finish_reason, finish_detail="", finished_time=10.0,
                  e2e_s=e2e_s, ttft_s=ttft_s, tpot_s=tpot_s)
    return RequestRecord(**filled, trace=LINK)


def counts(metrics: GenAIServerMetrics) -> dict[str, dict[str, float]]:
    """family -> error_type -> observations."""
    out: dict[str, dict[str, float]] = {}
    for family in metrics.families():
        for s in family.samples:
            if s.name.endswith("_count"):
                assert s.labels["gen_ai_operation_name"] == "chat"
                out.setdefault(family.name, {})[s.labels["error_type"]] = s.value
    return out


def test_failures_are_labelled_and_only_successes_time_their_tokens():
    metrics = GenAIServerMetrics("tiny")
    metrics.observe(ended("length", 1.0), None)
    metrics.observe(ended("stop", 0.5), None)
    metrics.observe(ended("timeout", 30.0, ttft_s=12.0, tpot_s=0.5), None)
    metrics.observe(ended("error", 2.0, ttft_s=0.3, tpot_s=0.1), None)
    metrics.observe(ended("rejected", 0.0, ttft_s=None, tpot_s=None), None)
    assert counts(metrics) == {
        "gen_ai_server_request_duration_seconds": {"": 2, "timeout": 1, "error": 1},
        "gen_ai_server_time_to_first_token_seconds": {"": 2},
        "gen_ai_server_time_per_output_token_seconds": {"": 2},
    }
