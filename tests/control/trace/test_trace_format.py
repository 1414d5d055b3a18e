"""`batchpilot trace`'s text (control/trace/format.py, format_request.py): what the tables
and a request's timeline say, from hand-made answers of the read API (no trace file)."""

from __future__ import annotations

import re

from control.trace.format import slow, step_sizes, steps, summary
from control.trace.format_request import request, routing_sentence

T0 = 1_700_000_000.0


def step_row(step_id: int, start: float, **extra) -> dict:
    return {"start_time": start, "step_id": step_id, "duration_s": 0.01, "target_step_s": None,
            "step_reason": None, "num_prefill_seqs": 0, "num_prefill_tokens": 0,
            "num_decode_seqs": 1, "tokens_used": 1, "token_budget": 64, "kv_usage": 0.5,
            "waiting_by_reason": {}, "admitted": [], "preempted": [], "finished": [],
            "finish_reasons": [], "decode_ids": ["r1"], **extra}


def test_steps_at_a_moment_draws_the_line_after_the_step_that_started_then():
    """--at T shows the steps up to T, then the line: a step that started exactly at T is
    one of them, above the line."""
    rows = [step_row(1, T0), step_row(2, T0 + 0.01), step_row(3, T0 + 0.02)]
    lines = steps(rows, at=T0 + 0.01).splitlines()
    ids = [line.split()[1] if not line.startswith("  ----") else "----" for line in lines[1:4]]
    assert ids == ["1", "2", "----"], lines


def test_steps_with_batch_name_the_requests_preempted_in_each_step():
    rows = [step_row(7, T0, preempted=["r9", None])]
    text = steps(rows, batch=True)
    assert "      preempted r9 (other)" in text, text


def test_steps_until_first_token_says_the_commonest_reason_out_of_all_steps():
    assert step_sizes({"grow_for_throughput": 12, "target": 18}) == "target 18/30"


def test_summary_says_the_window_asked_for_when_only_since_is_given():
    data = {"since": T0, "until": None, "steps": {"steps": 0}, "runs": [], "outcomes": [],
            "latency": [], "waits": [], "config_changes": []}
    first = summary(data).splitlines()[0]
    assert first.startswith("window       no steps recorded") and "(asked: " in first, first


def test_slow_shows_a_finish_reason_that_differs_from_the_outcome():
    row = {"request_id": "r1", "e2e_s": 1.0, "queue_s": 0.5, "prefill_s": 0.1,
           "decode_s": 0.4, "preempted_s": 0.0, "wait_reasons": {"max_num_seqs": 0.5},
           "step_reasons": None, "outcome": "finished", "finish_reason": "length",
           "lane": "interactive", "tenant": "acme"}
    text = slow([row, {**row, "request_id": "r2", "outcome": "timeout",
                       "finish_reason": "timeout"}])
    assert re.search(r"\bfinished/length\s+interactive", text), text
    assert re.search(r"\btimeout\s+interactive", text) and "timeout/" not in text, text


def timeline(**rec_extra) -> dict:
    rec = {"request_id": "cmpl-1", "run_id": "run1", "model": "m", "lane": "interactive",
           "tenant": "acme", "priority": 0, "outcome": "finished", "finish_reason": "length",
           "finish_detail": "", "num_prompt_tokens": 12, "num_output_tokens": 4,
           "num_cached_tokens": 0, "num_preemptions": 0, "ttft_s": 0.5, "tpot_s": 0.1,
           "e2e_s": 0.8, "arrival_time": T0, **rec_extra}
    return {"request": rec, "events": [], "admissions": [], "breakdown": None, "steps": []}


def test_a_request_of_a_distributed_trace_names_the_others_not_itself():
    tl = timeline(trace_id="ab" * 16)
    tl["trace_requests"] = ["cmpl-0", "cmpl-1", "cmpl-2"]
    assert f"  trace {'ab' * 16} (also: cmpl-0, cmpl-2)" in request(tl).splitlines()


def test_a_precise_route_says_how_many_leading_blocks_the_replica_held_zero_too():
    rec = {"routing_reason": "precise", "routing_matched_blocks": 0}
    assert routing_sentence(rec, "1").endswith("; it held 0 leading blocks of the prompt")
    rec["routing_matched_blocks"] = 1
    assert routing_sentence(rec, "1").endswith("; it held 1 leading block of the prompt")
    assert routing_sentence({"routing_reason": None}, "1") is None


def test_a_rejection_event_carries_the_admission_message():
    """A rejected request's event says its reason and the message its client got."""
    tl = timeline(outcome="rejected", finish_reason="too_long")
    tl["events"] = [{"time": T0, "event": "rejected", "detail": "too_long"}]
    tl["admissions"] = [{"time": T0, "kind": "rejected", "wait_s": None, "wait_reasons": None,
                         "message": "the prompt has 5000 tokens: at most 4096"}]
    assert "too_long: the prompt has 5000 tokens: at most 4096" in request(tl)


def test_step_ids_print_as_ranges_of_consecutive_steps():
    from control.trace.format import spans

    assert spans([9, 3, 4, 5]) == "3-5, 9"
    assert spans([7]) == "7"
    # past `most` ranges: the first most-1, how many are hidden, the last
    assert spans(list(range(0, 20, 2)), most=8) == "0, 2, 4, 6, 8, 10, 12, ... 2 more ranges, 18"
    assert spans(list(range(0, 18, 2)), most=8) == "0, 2, 4, 6, 8, 10, 12, ... 1 more range, 16"


def test_durations_print_in_us_ms_or_s_by_size():
    from control.trace.format import dur

    assert [dur(s) for s in (0.0005, 0.25, 2.5, -0.002, 0, None)] == [
        "500 us", "250.0 ms", "2.50 s", "-2.0 ms", "0", "-"]
