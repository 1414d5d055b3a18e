"""`batchpilot trace request` says when a request was its client's resend (requests.resent,
schema 6): why it waited behind the requests on time."""

from __future__ import annotations

from control.trace.format_request import request


def timeline(resent: bool | None) -> dict:
    rec = {"request_id": "cmpl-1", "run_id": "run1", "model": "m", "lane": "interactive",
           "tenant": "acme", "priority": 0, "outcome": "finished", "finish_reason": "length",
           "finish_detail": "", "num_prompt_tokens": 12, "num_output_tokens": 4,
           "num_cached_tokens": 0, "num_preemptions": 0, "ttft_s": 0.5, "tpot_s": 0.1,
           "e2e_s": 0.8, "arrival_time": 1_700_000_000.0, "resent": resent}
    return {"request": rec, "events": [], "admissions": [], "breakdown": None, "steps": []}


def test_a_resend_says_so_and_a_first_send_or_an_older_trace_does_not():
    assert "resent: its client sent it again after a refusal" in request(timeline(True))
    for flag in (False, None):  # None: a trace written before schema 6
        assert "resent" not in request(timeline(flag))
