"""What the engine reports: each step's `StepRecord` and `StepOutput`, and the gauges
between steps. Plain records built from the scheduler's and the block manager's state;
nothing here imports metrics or database code (control/ adapts them).

A step's output carries, in this order, what ended between steps (aborts, timeouts,
rejections, refusals: their final deltas, records and the admission decisions), then the
step's own work (`StepRun`: sample rows and tokens, the requests it finished, a contained
failure) and its `StepRecord`, whose `finished` list names both.
"""

from __future__ import annotations

from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING

from engine.calibration.drift import StepCostDrift, StepCostWatch
from engine.calibration.thread_governor import ThreadGovernor
from engine.kv.block_manager import BlockManager
from engine.records import (
    AdmissionDecision,
    EngineGauges,
    RequestDelta,
    RequestRecord,
    StepOutput,
    StepRecord,
    StepRun,
)
from engine.request import Request

if TYPE_CHECKING:
    from engine.scheduling.scheduler import Scheduler

_request_id = attrgetter("request_id")


def step_record(run: StepRun, scheduler: Scheduler, start: float, t0: float,
                prefix0: tuple[int, int]) -> StepRecord:
    """The StepRecord of `run`. `start`: engine clock; `t0`: perf_counter, both taken
    before expiry; `prefix0`: the block manager's prefix (query, hit) token counts then.
    Times: t0, then run.marks (after schedule, execute, update)."""
    out, bm, lanes = run.out, scheduler.block_manager, scheduler.lanes
    t = (t0, *run.marks)
    return StepRecord(
        step_id=out.step_id, start_time=start, end_time=run.end, duration_s=t[3] - t[0],
        schedule_s=t[1] - t[0], execute_s=t[2] - t[1], update_s=t[3] - t[2],
        num_prefill_seqs=len(out.prefills), num_decode_seqs=len(out.decodes),
        num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
        token_budget=out.token_budget, tokens_used=out.num_tokens,
        max_num_seqs=scheduler.live.max_num_seqs,
        kv_blocks_used=bm.num_used, kv_blocks_free=bm.num_free,
        kv_blocks_cached=bm.num_cached_free, kv_usage=bm.usage,
        running_by_lane={q.name: q.num_running for q in lanes},
        waiting_by_lane={q.name: q.num_waiting for q in lanes},
        finished=[(r.request_id, r.finish_reason or "") for r in run.finished],
        config_version=out.config_version,
        decode_ids=list(map(_request_id, out.decodes)),
        prefill_chunks=[(c.request.request_id, c.num_tokens) for c in out.prefills],
        decisions=run.decisions, predicted_step_s=out.predicted_s,
        target_step_s=out.target_s, step_reason=out.step_reason,
        prefix_query_tokens=bm.prefix_query_tokens - prefix0[0],
        prefix_hit_tokens=bm.prefix_hit_tokens - prefix0[1],
    )


def step_output(record: StepRecord | None, run: StepRun | None, deltas: list[RequestDelta],
                ended: list[Request], admissions: list[AdmissionDecision]) -> StepOutput:
    """The StepOutput of the ends since the last step (`deltas`, `ended`, `admissions`:
    the lists themselves, not copies) and, when a step ran, of `run` and its `record`."""
    result = StepOutput(record, deltas, [RequestRecord.from_request(r) for r in ended],
                        admissions)
    if record is not None:
        record.finished += [(r.request_id, r.finish_reason or "") for r in ended]
    if run is not None:
        result.rows, result.sampled = run.rows, run.sampled
        result.stop_reasons = {r.request_id: r.finish_reason or "" for r in run.finished}
        result.finished.extend(RequestRecord.from_request(r) for r in run.finished)
        result.failure = run.failure
    return result


def engine_gauges(scheduler: Scheduler, bm: BlockManager, last_wait_reasons: dict[str, str],
                  now: float, step_cost: StepCostWatch | None = None,
                  threads: ThreadGovernor | None = None) -> EngineGauges:
    """Queues, KV pool and live config between steps. Waiting requests are counted under
    the reason their lane started none in the last step (`last_wait_reasons`). The step
    cost's drift only where the scheduler has a step law."""
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
        kv_usage=bm.usage, live=scheduler.live,
        step_cost=_step_cost(scheduler, now, step_cost, threads))


def _step_cost(scheduler: Scheduler, now: float, watch: StepCostWatch | None,
               threads: ThreadGovernor | None) -> StepCostDrift | None:
    if watch is None or scheduler.step_law is None:
        return None
    reading = watch.reading(now, scheduler.law_slowdown.value, _refits(scheduler))
    if threads is None:
        return reading
    return replace(reading, threads=threads.threads, thread_switches=threads.switches)


def _refits(scheduler: Scheduler) -> tuple[int, int]:
    online = scheduler.online_law
    return (online.refits, online.adopted) if online is not None else (0, 0)
