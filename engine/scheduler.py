"""The iteration-level scheduler: each step, which requests run how many tokens.

Token-budget model: a request's `num_computed_tokens` catches up with its `num_tokens`.
A step reads the installed `LiveConfig` once and makes one `StepBudget` of it (tokens and
sequences left, `engine/step_budget.py`); every limit below is read from that budget.
  1. One pass over the running set: one token for each request that decodes, a chunk of
     at most prefill_chunk_size for each part-way through a prompt. The schedule policy
     gives only the order: decode_first serves every decode, then the partial prefills;
     mixed serves admission order. When more run than the budget's `room`, the pass
     starts where the last one stopped, so every running request advances in turn.
  2. New prefills from the lanes by weighted fair share (`engine/lanes.py`), within the
     budget, max_num_seqs, the lanes' own limits and the KV high watermark.
  3. The step's tokens are charged to lanes and tenants once (`engine/fair_share.py`),
     and the work is checked against the limits (SchedulerInvariantError if over).
A running request that cannot get a block preempts a victim (recompute), and a new one of
a `preempt_to_start` lane that the KV keeps from starting preempts running requests of
`preempt_first` lanes: see `engine/preemption.py`. Three verbs move a request: `start`
(queued -> running), `preempt` (running -> queued, KV dropped) and `finish` (either -> a
finished status); a started request with a deadline is tracked in `deadlines`.
`update()` applies the executor's sampled tokens (`engine/step_update.py`); telemetry goes to
`SchedulerStats`.
"""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.config import LiveConfig, StaticConfig
from engine.deadlines import DeadlineHeap
from engine.fair_share import StepCharges, charge, tally_running
from engine.lanes import LaneSet
from engine.preemption import block_for_kv, pick_victim, victims_to_start
from engine.records import SchedulerOutput, SchedulerStats
from engine.request import Request, RequestStatus
from engine.step_budget import SchedulerInvariantError, StepPlan
from engine.step_law import StepLaw
from engine.step_time import MIN_PROGRESS, LawScale
from engine.step_update import apply_sampled


class Scheduler:
    def __init__(self, static: StaticConfig, live: LiveConfig, block_manager: BlockManager,
                 step_law: StepLaw | None = None):
        """`step_law`: what a step costs on the device (engine/step_law.py); with it every
        step is held to static.target_step_ms (engine/step_time.py)."""
        self.static = static
        self.step_law = step_law
        self.law_scale = LawScale()  # measured / predicted: Engine.step feeds it
        self.live = live
        self.block_manager = block_manager
        self.lanes = LaneSet(live.lanes)
        self.running: list[Request] = []  # admission order
        self.step_id = 0
        self._turn = 0  # where _in_turn starts next when more run than a step may serve
        self.deadlines = DeadlineHeap()  # started requests with a deadline (engine/deadlines)
        self._started: list[Request] = []  # started by this step's _schedule_new: no victims

    # ---- queue side ------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.lanes.push(req)

    def set_live(self, live: LiveConfig, moves: dict[str, str],
                 requests: list[Request]) -> None:
        self.lanes.reconfigure(live.lanes, moves, requests)
        self.live = live

    def is_static(self, lane_name: str) -> bool:
        return self.live.lane_batching(self.lanes[lane_name].config) == "static"

    # ---- schedule --------------------------------------------------------------------
    def schedule(self, now: float) -> tuple[SchedulerOutput, SchedulerStats]:
        """This step's work, and what the scheduling decided besides it."""
        self.step_id += 1
        step = StepPlan.new(self.step_id, self.live, self.step_law,  # one config snapshot
                            self.law_scale.step_target_s(self.static.target_step_ms / 1000))
        self._schedule_running(step)
        charges = tally_running(self.lanes, step.out)  # the running set's work is final now
        self._schedule_new(step, charges, now)
        charge(self.lanes, charges)
        step.stats.tokens_by_lane = charges.by_lane
        return step.output(), step.stats

    def _schedule_running(self, step: StepPlan) -> None:
        """The one pass over the running set, in the policy's order, within the budget."""
        budget, decodes = step.budget, step.out.decodes
        # NOTE: decode_first holds prompt chunks back until every decode has its token, so
        # a long prompt never delays the token of every running stream.
        defer_chunks = step.live.schedule_policy == "decode_first"
        deferred: list[Request] = []
        bm = self.block_manager
        block_size = bm.block_size
        running_status = RequestStatus.RUNNING
        # The hot path: decodes take their token and sequence from the budget in bulk.
        # `served` decodes are not taken yet: the budget really has `room - served` left
        # (a preemption victim's give-back keeps that true); settled before it is read.
        served, context, room = 0, 0, budget.room  # context: KV the `served` attend
        order = self._in_turn(room)
        in_turn = len(order) > room
        for req in order:
            if req.status is not running_status:
                continue  # preempted as a victim earlier in this pass
            computed = req.num_computed_tokens
            if len(req.token_ids) - computed > 1 or computed < req.num_prompt_tokens:
                if defer_chunks:
                    deferred.append(req)
                    continue
                step.take_decodes(served, context)
                served = context = 0
                self._schedule_chunk(req, step)
                room = budget.room
                continue
            if served >= room:
                break  # no token or sequence left for anyone
            if computed >= len(req.block_ids) * block_size and not bm.allocate(req, 1):
                allocated = self._allocate_or_preempt(req, 1, step)  # no free block
                room = budget.room  # victims gave their budget back
                if not allocated:
                    continue  # req itself was preempted
            decodes.append(req)
            served += 1
            context += computed + 1
        step.take_decodes(served, context)
        for req in deferred:
            if req.status is running_status:  # else preempted as a victim
                self._schedule_chunk(req, step)
        if in_turn:
            self._advance_turn(order, step)

    # NOTE: when more run than a step can serve even at one token each (a limit lowered
    # live under load), a pass starts just after the last request the previous one served:
    # in admission order the newest would stall until others finish, and be cut by the
    # stream idle timeout.
    def _in_turn(self, cap: int) -> list[Request]:
        """The running requests in the order this step considers them (a copy: preemption
        edits the running list): admission order, or in turn when more than `cap` run."""
        running = self.running
        if len(running) <= cap:
            return list(running)
        k = self._turn % len(running)
        return running[k:] + running[:k]

    def _advance_turn(self, order: list[Request], step: StepPlan) -> None:
        """Start the next pass in turn just after the last request this one served."""
        served = {c.request for c in step.out.prefills}.union(step.out.decodes)
        for req in reversed(order):
            if req in served:
                self._turn = self.running.index(req) + 1
                return

    def _schedule_chunk(self, req: Request, step: StepPlan) -> None:
        """A running request's next prompt chunk, if the budget allows."""
        budget = step.budget
        if budget.room <= 0:
            return
        num_new = min(req.num_tokens - req.num_computed_tokens, self._chunk_size(step.live),
                      budget.tokens_left, step.chunk_room(req))
        if num_new <= 0:
            return
        if self._allocate_or_preempt(req, num_new, step):
            step.add_chunk(req, num_new)

    def _allocate_or_preempt(self, req: Request, num_new: int, step: StepPlan) -> bool:
        """Allocate blocks for req, preempting victims as needed; False if req was the one."""
        bm = self.block_manager
        while not bm.allocate(req, num_new):
            victim = pick_victim(self.running, req, self.lanes)
            if victim is None or victim is req:
                self.preempt(req, step.stats)
                return False
            step.unschedule(victim)
            self.preempt(victim, step.stats)
        return True

    def _schedule_new(self, step: StepPlan, charges: StepCharges, now: float) -> None:
        """Start new prefills from the lanes by fair share until a limit stops us."""
        live, budget = step.live, step.budget
        bm = self.block_manager
        blocked = self.lanes.blocked(live)
        stop_reason = None
        started = self._started = []
        while True:
            if budget.tokens_left <= 0:
                stop_reason = "token_budget"
                break
            # NOTE: max_num_seqs bounds the running set, not only this step's batch: a
            # request started now needs a sequence in every step until it ends.
            if len(self.running) >= live.max_num_seqs or budget.seqs_left <= 0:
                stop_reason = "max_num_seqs"
                break
            # NOTE: with nothing running, a request starts whatever the KV usage (here and in
            # _try_start): else one needing more than the watermark's share never could.
            if self.running and bm.usage > live.kv_cache_high_watermark:
                stop_reason = "kv_high_watermark"
                if not block_for_kv(self.lanes, blocked):  # only preempt_to_start lanes go on
                    break
            lane = self.lanes.pick(blocked, charges.vtimes)
            if lane is None:
                break
            req = lane.peek(charges.by_tenant.get(lane.name))
            if req.waits_for_sibling:  # n > 1: its prompt's blocks come from the first choice
                blocked[lane.name] = "sibling_prefill"
                continue
            # NOTE: the first request that cannot start ends this step's starts, even if a
            # smaller one in another lane would fit: skipping it could starve it for good.
            # Only lanes that may preempt to start go on past one the watermark holds back.
            may_preempt = lane.config.preempt_to_start
            stop_reason, num_new = self._try_start(req, step, charges, may_preempt)
            if stop_reason == "kv_high_watermark" and not may_preempt and (
                    block_for_kv(self.lanes, blocked)):
                continue
            if stop_reason is not None:
                break
            self.start(req, now, step.stats)
            started.append(req)
            if step.time is not None:
                step.time.started(req)
            step.add_chunk(req, num_new)
            charges.add(lane, req.tenant, num_new)
            max_running = lane.config.max_running
            if max_running is not None and lane.num_running >= max_running:
                blocked[lane.name] = "lane_max_running"
        step.stats.waiting_by_reason, step.stats.waiting_reason_by_lane = (
            self.lanes.waiting_reasons(blocked, stop_reason))

    def _try_start(self, req: Request, step: StepPlan, charges: StepCharges,
                   may_preempt: bool) -> tuple[str | None, int]:
        """Take prefix-cache hits and blocks for req's first chunk: (None, the chunk's
        tokens), or (why it can't start, 0). `may_preempt` (its lane's preempt_to_start):
        when the watermark is what stops it, running requests of preempt_first lanes are
        preempted first if that frees enough."""
        bm, live, budget = self.block_manager, step.live, step.budget.tokens_left
        hit = None
        if req.num_computed_tokens == 0 and not req.block_ids:
            hit = bm.allocate_prefix(req, count=False)
            req.num_computed_tokens = hit
            if req.first_scheduled_time is None:
                req.num_cached_tokens = hit
        remaining = req.num_tokens - req.num_computed_tokens
        num_new = min(remaining, self._chunk_size(live), budget)
        reason = None
        if not live.chunked_prefill and remaining > budget:
            reason = "token_budget"
        elif step.time is not None:  # a step law: no tiny first chunk, no decodes past share
            num_new = min(num_new, step.chunk_room(req))
            if num_new < min(remaining, MIN_PROGRESS) or not step.time.admits(req, self.running):
                reason = "step_time"
        if reason is None:
            need = bm.blocks_needed(req, num_new)
            if self.running and (bm.num_used + need) > (
                    live.kv_cache_high_watermark * bm.num_blocks):
                reason = "kv_high_watermark"
                if may_preempt and self._preempt_to_start(req, need, step, charges):
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

    def _preempt_to_start(self, req: Request, need: int, step: StepPlan,
                          charges: StepCharges) -> bool:
        """Preempt the fewest preempt_first requests that let req take `need` more blocks;
        False, preempting none, when even all of them would not be enough."""
        bm = self.block_manager
        # NOTE: requests started earlier in this step are no victims: their lane just had
        # its turn, and undoing a start in the step that made it is pure waste.
        victims = victims_to_start(req, need, self.running, self.lanes, bm.num_used,
                                   bm.num_blocks, step.live.kv_cache_high_watermark,
                                   self._started)
        if not victims:
            return False
        for victim in victims:
            step.unschedule(victim)
            self.preempt(victim, step.stats)
        # The running set's work changed after it was tallied: tally it again, in place
        # (schedule() charges this object). The new prefills so far are in step.out too.
        fresh = tally_running(self.lanes, step.out)
        charges.by_lane, charges.by_tenant, charges.vtimes = (
            fresh.by_lane, fresh.by_tenant, fresh.vtimes)
        return True

    def _chunk_size(self, live: LiveConfig) -> int:
        """Most prompt tokens a request runs in one step; without chunking, all of them."""
        return live.prefill_chunk_size if live.chunked_prefill else self.static.max_model_len

    # ---- a request's life: start, preempt, finish ------------------------------------
    def start(self, req: Request, now: float, stats: SchedulerStats) -> None:
        """Queued -> running. `req` is what its lane's peek() returned, with the blocks for
        its first chunk."""
        lane = self.lanes[req.lane]
        lane.pop(req)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        lane.add_running(req)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
            stats.admitted.append(req.request_id)
            if req.deadline is not None:
                self.deadlines.push(req, len(self.running) + self.lanes.num_waiting)

    def preempt(self, req: Request, stats: SchedulerStats) -> None:
        """Running -> queued again in its lane; its KV is dropped, to be recomputed."""
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.running.remove(req)
        self.lanes[req.lane].remove_running(req)
        self.lanes.push(req)
        stats.preempted.append(req.request_id)

    def finish(self, req: Request, status: RequestStatus, now: float, detail: str = "") -> None:
        """Queued or running -> `status`, a finished one: out of its queue or the running
        set, its blocks freed."""
        if not status.is_finished or req.is_finished:
            raise SchedulerInvariantError(
                f"finish({req.request_id!r}, {status.name}) of a {req.status.name} request:"
                " only an unfinished request ends, and only with a finished status")
        was = req.status
        req.set_finished(status, now, detail)
        if was is RequestStatus.RUNNING:
            self.running.remove(req)
            self.lanes[req.lane].remove_running(req)
        elif req.lane in self.lanes.lanes:
            self.lanes[req.lane].discard(req)
        self.block_manager.free(req)

    # ---- update ----------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled_token_ids: list[int],
               now: float) -> tuple[list[Request], list[Request]]:
        """Apply the executor's sampled tokens (engine/step_update.py): returns the
        requests of the sample rows, in row order, and those that finished."""
        return apply_sampled(self, out, sampled_token_ids, now)
