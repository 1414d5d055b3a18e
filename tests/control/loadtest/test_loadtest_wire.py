"""How the load tester reads a reply (control/loadtest/wire.py, shared by both transports):
a refusal's outcome, the TTFT of a stream, a resent request's TTFT and a stream the server
ended on its own timeout, as the report and goodput count them."""

from __future__ import annotations

from control.loadtest.records import PlannedRequest, RequestResult
from control.loadtest.wire import refused, stream_ended, take_event


def _result() -> RequestResult:
    plan = PlannedRequest(0, 0.0, 3, 4, "acme", None, True, None)
    return RequestResult(plan, outcome="")


def _text(text: str, reason: str | None = None) -> dict:
    return {"choices": [{"text": text, "finish_reason": reason}]}


def test_a_503_is_a_rejection_like_a_429_and_a_500_an_error():
    """A server shedding load answers 503 (or 429): the report counts it as rejected, not
    as a server error."""
    for status, outcome in ((503, "rejected"), (429, "rejected"), (500, "error")):
        result = _result()
        refused(result, status, {}, {"error": {"code": "busy"}})
        assert (result.outcome, result.error) == (outcome, "busy"), status


def test_ttft_is_the_first_chunk_with_text_not_the_last():
    result, reason = _result(), None
    for now, event in ((0.2, _text("")), (0.5, _text("a")), (0.9, _text("b")),
                       (1.4, _text("c", "length"))):
        reason = take_event(result, event, now, reason)
    stream_ended(result, 1.5, reason)
    assert result.ttft_s == 0.5 and result.chunk_times_s == [0.5, 0.9, 1.4]
    assert (result.outcome, result.e2e_s, result.output_tokens) == ("ok", 1.5, 3)


def test_a_resent_stream_without_text_counts_its_ttft_from_the_first_send():
    """No chunk carried text (tokens that decode to nothing): TTFT is the server's, plus
    the time from the first send to the send it answered (--client-retries)."""
    result = _result()
    result.last_send_s, result.sends = 2.0, 2
    reason = take_event(result, {**_text("", "stop"),
                                 "batchpilot": {"timing": {"ttft_s": 0.5, "e2e_s": 0.8}}},
                        2.9, None)
    stream_ended(result, 3.0, reason)
    assert result.ttft_s == 2.5 and result.server_ttft_s == 0.5


def test_a_stream_the_server_ended_on_its_timeout_is_a_timeout_not_ok():
    result = _result()
    reason = take_event(result, _text("a"), 0.3, None)
    reason = take_event(result, _text("", "timeout"), 5.0, reason)
    stream_ended(result, 5.1, reason)
    assert result.outcome == "timeout"
