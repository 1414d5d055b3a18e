"""The iteration-level scheduler: each step, which requests run how many tokens.

Token-budget model: a request's `num_computed_tokens` catches up with its `num_tokens`.
A step reads the installed `LiveConfig` once and makes one `StepBudget` of it (tokens and
sequences left, `engine/step_budget.py`); every limit below is read from that budget.
  1. One pass over the running set: one token for each request that decodes, a chunk of
     at most prefill_chunk_size for each part-way through a prompt. The schedule policy
     gives only the order: decode_first serves every decode, then the partial prefills;
     mixed serves admission order. When more run than the budget's `room`, the pass
     starts where the last one stopped, so every running request advances in turn.
  2. New prefills from the lanes by weighted fair share (`engine/step_starts.py`), within
     the budget, max_num_seqs, the lanes' own limits and the KV high watermark.
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
from engine.fair_share import charge, tally_running
from engine.lanes import LaneSet
from engine.preemption import pick_victim
from engine.records import SchedulerOutput, SchedulerStats
from engine.request import Request, RequestStatus
from engine.step_budget import SchedulerInvariantError, StepPlan
from engine.step_law import StepLaw
from engine.step_starts import schedule_new
from engine.step_time import LawScale
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
        schedule_new(self, step, charges, now)  # engine/step_starts.py
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
        num_new = min(req.num_tokens - req.num_computed_tokens, self.chunk_size(step.live),
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

    def chunk_size(self, live: LiveConfig) -> int:
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
