"""Engine records -> row tuples, in the column order of control/trace/schema.py."""

from __future__ import annotations

from collections.abc import Callable

from control.api.routed import routing_of
from control.trace.waits import WaitRow
from engine.config import LiveConfig
from engine.kv.block_manager import KVSnapshot
from engine.records import AdmissionDecision, RequestRecord, StepRecord


def step_row(run_id: str, r: StepRecord, seq: Callable[[str], int]) -> tuple:
    """`seq(request_id)`: the request's number in the request_ids table."""
    decode_seqs = list(map(seq, r.decode_ids))
    prefill_seqs = [seq(rid) for rid, _ in r.prefill_chunks]
    prefill_tokens = [n for _, n in r.prefill_chunks]
    s = r.decisions
    return (
        run_id, r.step_id, r.start_time, r.end_time, r.duration_s, r.schedule_s, r.execute_s,
        r.update_s, r.num_prefill_seqs, r.num_decode_seqs, r.num_prefill_tokens,
        r.num_decode_tokens, r.token_budget, r.tokens_used, r.max_num_seqs, r.kv_blocks_used,
        r.kv_blocks_free, r.kv_blocks_cached, r.kv_usage, r.running_by_lane,
        r.waiting_by_lane, s.waiting_by_reason, s.waiting_reason_by_lane, s.tokens_by_lane,
        decode_seqs, prefill_seqs, prefill_tokens, s.admitted, s.preempted,
        [rid for rid, _ in r.finished], [why for _, why in r.finished], r.config_version,
        r.prefix_query_tokens, r.prefix_hit_tokens, r.fleet_version, r.predicted_step_s,
        r.target_step_s, r.step_reason,
    )


def request_row(run_id: str, model: str, r: RequestRecord, preempted_s: float,
                wait_reasons: dict[str, float]) -> tuple:
    return (
        run_id, r.request_id, model, r.lane, r.tenant, r.priority, r.outcome, r.finish_reason,
        r.finish_detail, r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens,
        r.num_preemptions, r.arrival_time, r.admitted_time, r.first_scheduled_time,
        r.first_token_time, r.finished_time, r.deadline, r.queue_delay_s, r.ttft_s, r.tpot_s,
        r.e2e_s, r.prefill_time_s, r.decode_time_s, preempted_s, wait_reasons,
        r.trace.trace_id if r.trace is not None else None,
        *(routing_of(r.trace.attributes) if r.trace is not None else (None, None)),
        r.resent,
    )


def admission_row(run_id: str, d: AdmissionDecision) -> tuple:
    return (
        run_id, d.time, d.request_id, d.lane, d.tenant, d.priority, d.num_prompt_tokens,
        "admitted" if d.accepted else "rejected", d.reason or "", d.message, d.retry_after_s,
        d.estimated_wait_s, None, None,
    )


def wait_row(run_id: str, w: WaitRow) -> tuple:
    return (
        run_id, w.end, w.request_id, w.lane, w.tenant, w.priority, None, w.kind, w.main_reason,
        "", None, None, w.wait_s, w.reasons,
    )


def kv_row(run_id: str, step_id: int, time: float, trigger: str, s: KVSnapshot,
           live: LiveConfig) -> tuple:
    return (
        run_id, step_id, time, trigger, s.total, s.used, s.free, s.cached, s.usage,
        live.kv_cache_high_watermark, live.kv_cache_reject_watermark, s.by_lane, s.by_tenant,
    )
