"""What admission's SLO rule (engine/lanes/admission.py, check_slo) asks of the goodput
model (goodput.py): a new request's TTFT at the largest step, behind the queued requests
that can still meet their target, and, deferred, when it would start.
"""

from __future__ import annotations

import math

from engine.calibration.step_law import StepLaw
from engine.lanes.queues import LaneSet
from engine.request import Request
from engine.scheduling.goodput import QueueModel
from engine.scheduling.state import SchedulerState


def predicted_ttft_s(state: SchedulerState, req: Request, now: float) -> float | None:
    """req's TTFT by the goodput model at the largest step (for admission's SLO rule);
    None when there is no model (no law, step_policy fixed), req's lane has no TTFT, or
    req would miss it even alone (then the queue is not what keeps it from its target: a
    long prompt is served, late; `slo_lane` has already sent it to the long-context lane
    where that lane's target allows it)."""
    model = _admission_model(state, req)
    if model is None:
        return None
    weights = {lane.name: lane.config.weight for lane in state.lanes}
    return model.predicted_ttft_s(req, queue_work(state.step_law, state.lanes), weights, now)


def deferred_start_s(state: SchedulerState, req: Request, now: float) -> float | None:
    """When req, deferred (engine/lanes/admission.py), would have its first token, counted
    from its arrival: behind the queued requests that are not deferred and its lane's
    deferred ones with prompts no longer than its own (their order: engine/lanes/queues.py),
    and no sooner than the device time deferred requests have lately got allows
    (`spare_rate`: the queue as it stands cannot show the requests that arrive later and
    go ahead of it); None as for `predicted_ttft_s`."""
    model = _admission_model(state, req)
    if model is None:
        return None
    law, lane = state.step_law, state.lanes[req.lane]
    deferred = sum(law.chunk_s(0, r.num_tokens) for r in lane.waiting_requests()
                   if r.slo_deferred and r.num_prompt_tokens <= req.num_prompt_tokens)
    weights = {q.name: q.config.weight for q in state.lanes}
    start = model.predicted_ttft_s(req, queue_work(law, state.lanes), weights, now, deferred)
    spare = state.spare_rate.per_s()
    if spare is None:
        return start
    waited = max(0.0, now - req.arrival_time)
    own = law.chunk_s(0, req.num_tokens)
    measured = waited + (deferred + own) / spare if spare > 0 else math.inf
    return max(start, measured)


def _admission_model(state: SchedulerState, req: Request) -> QueueModel | None:
    """The goodput model for admitting req, or None (see `predicted_ttft_s`)."""
    law, live = state.step_law, state.live
    base_s = state.static.target_step_ms / 1000
    if (law is None or base_s <= 0 or live.step_policy != "goodput"
            or not live.chunked_prefill or req.lane not in state.lanes.lanes):
        return None
    ttft = live.lane_slo(state.lanes[req.lane].config).ttft_s
    if ttft is None:
        return None
    model = QueueModel.of(law, state.law_slowdown.value, base_s, state.running, live,
                          state.lanes)
    return None if model.alone_ttft_s(req) > ttft else model


def queue_work(law: StepLaw, lanes: LaneSet) -> dict[str, float]:
    """Each lane's queued prompts that are not deferred (those a request that can still
    meet its target waits behind), law seconds."""
    return {lane.name: sum(law.chunk_s(0, r.num_tokens) for r in lane.waiting_requests()
                           if not r.slo_deferred)
            for lane in lanes if lane.num_waiting}
