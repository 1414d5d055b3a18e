"""What the load tester sends and how a reply becomes its RequestResult: the request body
and headers, a refusal's fields, and each SSE event folded in as it arrived (the same for
the httpx transport and sse_transport's, control/loadtest/runner.py and local_streams.py).
"""

from __future__ import annotations

import json

from control.loadtest.records import PlannedRequest, RequestResult

REJECTED_STATUSES = (429, 503)


def body_for(p: PlannedRequest, prompt: str, model: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": p.output_tokens,
            "ignore_eos": p.ignore_eos, "stream": p.stream}
    if p.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def headers_for(p: PlannedRequest, resends: int = 0) -> dict[str, str]:
    """`resends`: sends of this request before this one, in the header the OpenAI SDK
    sends them in (X-Stainless-Retry-Count; the server counts a resend as late)."""
    headers = {"X-Tenant": p.tenant, "X-Stainless-Retry-Count": str(resends)}
    if p.lane:
        headers["X-Lane"] = p.lane
    return headers


def take_event(result: RequestResult, event: dict, now: float, reason: str | None,
                ) -> str | None:
    """Fold one SSE event, received `now` s after the first send, into `result`; the
    finish reason so far."""
    for choice in event.get("choices") or ():
        if choice.get("text"):
            result.chunk_times_s.append(now)
            if result.ttft_s is None:
                result.ttft_s = now
        reason = choice.get("finish_reason") or reason
    if event.get("usage"):
        result.prompt_tokens = event["usage"].get("prompt_tokens", 0)
        result.output_tokens = event["usage"].get("completion_tokens", 0)
    info = event.get("batchpilot") or {}
    lane_slo(result, info)
    timing = info.get("timing") or {}
    result.server_ttft_s = timing.get("ttft_s", result.server_ttft_s)
    result.server_e2e_s = timing.get("e2e_s", result.server_e2e_s)
    return reason


def stream_ended(result: RequestResult, e2e_s: float, reason: str | None) -> None:
    result.e2e_s = e2e_s
    if result.ttft_s is None:  # no chunk had text (tokens that decode to nothing)
        result.ttft_s = result.last_send_s + result.server_ttft_s \
            if result.server_ttft_s is not None else result.e2e_s
    if not result.output_tokens:
        result.output_tokens = len(result.chunk_times_s)
    result.outcome = "timeout" if reason == "timeout" else "ok"


def refused(result: RequestResult, status: int, headers, data: dict) -> None:
    error = data.get("error") or {}
    result.error = error.get("code") or error.get("message") or f"HTTP {status}"
    result.retry_after = headers.get("retry-after")
    rejected = status in REJECTED_STATUSES or "x-batchpilot-reject-reason" in headers
    result.outcome = "rejected" if rejected else "error"


def json_object(raw: bytes) -> dict:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def lane_slo(result: RequestResult, info: dict) -> None:
    """The lane and its SLO from a `batchpilot` object (the last stream chunk has them)."""
    if isinstance(info.get("lane"), str):
        result.server_lane = info["lane"]
    if isinstance(info.get("slo"), dict):
        result.server_slo = info["slo"]
