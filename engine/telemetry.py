"""The engine's plain telemetry records: one StepRecord per step, and the gauges between
steps. Built from the scheduler's state; nothing here imports metrics or database code."""

from __future__ import annotations

from operator import attrgetter

from engine.block_manager import BlockManager
from engine.records import EngineGauges, SchedulerOutput, SchedulerStats, StepRecord
from engine.request import Request
from engine.scheduler import Scheduler

_request_id = attrgetter("request_id")


def step_record(out: SchedulerOutput, stats: SchedulerStats, scheduler: Scheduler,
                start: float, end: float, t: tuple[float, float, float, float],
                finished: list[Request]) -> StepRecord:
    """The StepRecord of a step that ran `out`. `t`: perf_counter before expire, after
    schedule, after execute, after update (s); start/end: engine clock."""
    bm = scheduler.block_manager
    lanes = scheduler.lanes
    return StepRecord(
        step_id=out.step_id, start_time=start, end_time=end, duration_s=t[3] - t[0],
        schedule_s=t[1] - t[0], execute_s=t[2] - t[1], update_s=t[3] - t[2],
        num_prefill_seqs=len(out.prefills), num_decode_seqs=len(out.decodes),
        num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
        token_budget=out.token_budget, tokens_used=out.num_tokens,
        max_num_seqs=scheduler.live.max_num_seqs,
        kv_blocks_used=bm.num_used, kv_blocks_free=bm.num_free,
        kv_blocks_cached=bm.num_cached_free, kv_usage=bm.usage,
        running_by_lane={q.name: q.num_running for q in lanes},
        waiting_by_lane={q.name: q.num_waiting for q in lanes},
        finished=[(r.request_id, r.finish_reason or "") for r in finished],
        config_version=out.config_version,
        decode_ids=list(map(_request_id, out.decodes)),
        prefill_chunks=[(c.request.request_id, c.num_tokens) for c in out.prefills],
        stats=stats, predicted_step_s=out.predicted_s,
    )


def engine_gauges(scheduler: Scheduler, bm: BlockManager, last_wait_reasons: dict[str, str],
                  now: float) -> EngineGauges:
    """Queues, KV pool and live config between steps. Waiting requests are counted under
    the reason their lane started none in the last step (`last_wait_reasons`)."""
    lanes = scheduler.lanes
    waiting_by_lane = {q.name: q.num_waiting for q in lanes}
    by_reason: dict[str, int] = {}
    for name, num in waiting_by_lane.items():
        if num:  # queued since the last step: no scheduling decision about it yet
            reason = last_wait_reasons.get(name, "not_yet_scheduled")
            by_reason[reason] = by_reason.get(reason, 0) + num
    return EngineGauges(
        time=now, running_by_lane={q.name: q.num_running for q in lanes},
        waiting_by_lane=waiting_by_lane, waiting_by_reason=by_reason,
        kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used,
        kv_blocks_free=bm.num_free, kv_blocks_cached=bm.num_cached_free,
        kv_usage=bm.usage, live=scheduler.live)
