"""New prefills, the second part of `Scheduler.schedule()`: which queued requests start.

After the running set has been served, queued requests start from the lanes by weighted
fair share (`LaneSet.pick`, the lane with the smallest virtual time), each taking its
longest cached prefix and the blocks for its first chunk, until a limit stops the step:
the token budget, `max_num_seqs` (it bounds the running set, not only the batch), the
KV high watermark, free KV blocks, a lane's `max_running` or static batch, or the step
time. The first request that cannot start ends the starts, even if a smaller one in
another lane would fit (skipping it could starve it for good); only `preempt_to_start`
lanes go on past the watermark, preempting running requests of `preempt_first` lanes
(`engine/scheduling/preemption.py`). Why each lane started none is left in the step's decisions.
"""

from __future__ import annotations

from engine.request import Request
from engine.scheduling.budget import StepPlan
from engine.scheduling.fair_share import StepCharges, tally_running
from engine.scheduling.preemption import block_for_kv, victims_to_start
from engine.scheduling.state import SchedulerState
from engine.scheduling.step_time import MIN_PROGRESS


def schedule_new_prefills(state: SchedulerState, step: StepPlan, charges: StepCharges,
                          now: float) -> None:
    """Start new prefills from the lanes by fair share until a limit stops us."""
    live, budget = step.live, step.budget
    bm = state.block_manager
    blocked = state.lanes.blocked(live)
    stop_reason = None
    started: list[Request] = []  # started by this call: no victims of _preempt_to_start
    while True:
        if budget.tokens_left <= 0:
            stop_reason = "token_budget"
            break
        # NOTE: max_num_seqs bounds the running set, not only this step's batch: a
        # request started now needs a sequence in every step until it ends.
        if len(state.running) >= live.max_num_seqs or budget.seqs_left <= 0:
            stop_reason = "max_num_seqs"
            break
        # NOTE: with nothing running, a request starts whatever the KV usage (here and in
        # _try_start): else one needing more than the watermark's share never could.
        if state.running and bm.usage > live.kv_cache_high_watermark:
            stop_reason = "kv_high_watermark"
            if not block_for_kv(state.lanes, blocked):  # only preempt_to_start lanes go on
                break
        lane = state.lanes.pick(blocked, charges.vtimes)
        if lane is None:
            break
        req = lane.peek(charges.by_tenant.get(lane.name))
        if req.waits_for_sibling:  # n > 1: its prompt's blocks come from the first choice
            blocked[lane.name] = "sibling_prefill"
            continue
        if req.slo_deferred and _computes_on_time_prompt(state, lane.name):
            blocked[lane.name] = "slo_deferred"
            continue
        # NOTE: the first request that cannot start ends this step's starts, even if a
        # smaller one in another lane would fit: skipping it could starve it for good.
        # Only lanes that may preempt to start go on past one the watermark holds back.
        may_preempt = lane.config.preempt_to_start
        stop_reason, num_new = _try_start(state, req, step, charges, may_preempt, started)
        if stop_reason == "kv_high_watermark" and not may_preempt and (
                block_for_kv(state.lanes, blocked)):
            continue
        if stop_reason is not None:
            break
        state.start(req, now, step.decisions)
        started.append(req)
        if step.time is not None:
            step.time.started(req)
        step.add_chunk(req, num_new)
        charges.add(lane, req.tenant, num_new)
        max_running = lane.config.max_running
        if max_running is not None and lane.num_running >= max_running:
            blocked[lane.name] = "lane_max_running"
    step.decisions.waiting_by_reason, step.decisions.waiting_reason_by_lane = (
        state.lanes.waiting_reasons(blocked, stop_reason))


def _computes_on_time_prompt(state: SchedulerState, lane: str) -> bool:
    """Whether a running request of `lane` that is not deferred is still computing its
    prompt: a deferred request (engine/lanes/admission.py) starts only once none is, so
    its chunks never share a step with, and lengthen, one that can still meet its TTFT."""
    return any(r.lane == lane and not r.slo_deferred
               and r.num_computed_tokens < r.num_prompt_tokens for r in state.running)


def _try_start(state: SchedulerState, req: Request, step: StepPlan, charges: StepCharges,
               may_preempt: bool, started: list[Request]) -> tuple[str | None, int]:
    """Take prefix-cache hits and blocks for req's first chunk: (None, the chunk's
    tokens), or (why it can't start, 0). `may_preempt` (its lane's preempt_to_start):
    when the watermark is what stops it, running requests of preempt_first lanes are
    preempted first if that frees enough (none of `started`, this step's starts)."""
    bm, live, budget = state.block_manager, step.live, step.budget.tokens_left
    hit = None
    if req.num_computed_tokens == 0 and not req.block_ids:
        hit = bm.allocate_prefix(req, count=False)
        req.num_computed_tokens = hit
        if req.first_scheduled_time is None:
            req.num_cached_tokens = hit
    remaining = req.num_tokens - req.num_computed_tokens
    num_new = min(remaining, step.chunk_tokens, budget)
    reason = None
    if not live.chunked_prefill and remaining > budget:
        reason = "token_budget"
    elif step.time is not None:  # a step law: no tiny first chunk, no decodes past share
        num_new = min(num_new, step.chunk_room(req))
        if num_new < min(remaining, MIN_PROGRESS) or not step.time.admits(req, state.running):
            reason = "step_time"
    if reason is None:
        need = bm.blocks_needed(req, num_new)
        if state.running and (bm.num_used + need) > (
                live.kv_cache_high_watermark * bm.num_blocks):
            reason = "kv_high_watermark"
            if may_preempt and _preempt_to_start(state, req, need, step, charges, started):
                reason = None
        if reason is None and not bm.allocate(req, num_new):
            reason = "kv_blocks"
    if reason is not None:
        bm.free(req)
        req.num_computed_tokens = 0
        return reason, 0
    if hit is not None:
        # NOTE: a hit counts when the request starts with it, not at each try: one held
        # back by the watermark looks its prefix up again every step.
        bm.count_prefix_use(req, hit)
    return None, num_new  # (victims' give-back may have raised the budget since: no matter)


def _preempt_to_start(state: SchedulerState, req: Request, need: int, step: StepPlan,
                      charges: StepCharges, started: list[Request]) -> bool:
    """Preempt the fewest preempt_first requests that let req take `need` more blocks;
    False, preempting none, when even all of them would not be enough."""
    bm = state.block_manager
    # NOTE: requests started earlier in this step are no victims: their lane just had
    # its turn, and undoing a start in the step that made it is pure waste.
    victims = victims_to_start(req, need, state.running, state.lanes, bm.num_used,
                               bm.num_blocks, step.live.kv_cache_high_watermark, started)
    if not victims:
        return False
    for victim in victims:
        step.unschedule(victim)
        state.preempt(victim, step.decisions)
    # The running set's work changed after it was tallied: tally it again, in place
    # (schedule() charges this object). The new prefills so far are in step.out too.
    fresh = tally_running(state.lanes, step.out)
    charges.by_lane, charges.by_tenant, charges.vtimes = (
        fresh.by_lane, fresh.by_tenant, fresh.vtimes)
    return True
