"""What `Engine.step()` reports: one `StepOutput`, the ends since the last step first.

A step's output carries, in this order, what ended between steps (aborts, timeouts,
rejections, refusals: their final deltas, records and the admission decisions), then the
step's own work (`StepRun`: sample rows and tokens, the requests it finished, a contained
failure) and its `StepRecord` (engine/telemetry.py), whose `finished` list names both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.records import (
    AdmissionDecision,
    RequestDelta,
    RequestRecord,
    StepOutput,
    StepRecord,
    StepRun,
)
from engine.request import Request
from engine.telemetry import step_record

if TYPE_CHECKING:
    from engine.scheduler import Scheduler


def run_record(run: StepRun, sched: Scheduler, start: float, t0: float,
               prefix0: tuple[int, int]) -> StepRecord:
    """The StepRecord of `run`. `start`: engine clock; `t0`: perf_counter, both taken
    before expiry; `prefix0`: the block manager's prefix (query, hit) token counts then."""
    bm = sched.block_manager
    record = step_record(run.out, run.stats, sched, start, run.end, (t0, *run.marks),
                         run.finished)
    record.prefix_query_tokens = bm.prefix_query_tokens - prefix0[0]
    record.prefix_hit_tokens = bm.prefix_hit_tokens - prefix0[1]
    return record


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
