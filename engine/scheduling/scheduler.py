"""The iteration-level scheduler: each step, which requests run how many tokens.

Token-budget model: a request's `num_computed_tokens` catches up with its `num_tokens`.
A step reads the installed `LiveConfig` once and makes one `StepBudget` of it (tokens and
sequences left, `budget.py`); every limit below is read from that budget.
  1. One pass over the running set: one token for each request that decodes, a chunk of
     at most prefill_chunk_size for each part-way through a prompt. The schedule policy
     gives only the order: decode_first serves every decode, then the partial prefills;
     mixed serves admission order. When more run than the budget's `room`, the pass
     starts where the last one stopped, so every running request advances in turn.
  2. New prefills from the lanes by weighted fair share (`new_prefills.py`), within the
     budget, max_num_seqs, the lanes' own limits and the KV high watermark.
  3. The step's tokens are charged to lanes and tenants once (`fair_share.py`), and the
     work is checked against the limits (SchedulerInvariantError if over).
A running request that cannot get a block preempts a victim (recompute), and a new one of
a `preempt_to_start` lane that the KV keeps from starting preempts running requests of
`preempt_first` lanes: see `preemption.py`. Requests move only through the verbs of
`SchedulerState` (state.py): start, preempt, finish. `update()` applies the executor's
sampled tokens (`apply_sampled.py`); what the scheduling decided besides the work goes to
`SchedulingDecisions`.

The engine asks the scheduler to end requests too, and does its own bookkeeping (final
delta, record) of the ones it returns: `end_timeouts()` at the start of a step,
`end_with_error()` after a failed step (engine/fault_isolation.py).
"""

from __future__ import annotations

from collections.abc import Collection

from engine.calibration.step_law import StepLaw
from engine.config import LiveConfig, StaticConfig
from engine.kv.block_manager import BlockManager
from engine.records import SchedulerOutput, SchedulingDecisions
from engine.request import Request, RequestStatus
from engine.scheduling.apply_sampled import apply_sampled
from engine.scheduling.budget import StepPlan
from engine.scheduling.fair_share import charge, tally_running
from engine.scheduling.goodput import choose_step_target, grown_budgets
from engine.scheduling.new_prefills import schedule_new_prefills
from engine.scheduling.preemption import pick_victim
from engine.scheduling.state import GROWABLE_BUDGETS, SchedulerState


class Scheduler(SchedulerState):
    def __init__(self, static: StaticConfig, live: LiveConfig, block_manager: BlockManager,
                 step_law: StepLaw | None = None,
                 growable_budgets: Collection[str] = GROWABLE_BUDGETS):
        super().__init__(static, live, block_manager, step_law, growable_budgets)
        self._turn = 0  # where _in_turn starts next when more run than a step may serve

    # ---- schedule --------------------------------------------------------------------
    def schedule(self, now: float) -> tuple[SchedulerOutput, SchedulingDecisions]:
        """This step's work, and what the scheduling decided besides it."""
        self.step_id += 1
        self.observe_deferred(now)
        target = choose_step_target(self, now)  # None: no step law, the budgets rule
        tokens, chunk = grown_budgets(self, target.growth if target else 1.0)
        step = StepPlan.new(self.step_id, self.live, self.step_law,  # one config snapshot
                            target, self.law_slowdown, tokens=tokens, chunk=chunk)
        late = self._schedule_running(step, now)
        charges = tally_running(self.lanes, step.out)  # the running set's work is final now
        schedule_new_prefills(self, step, charges, now)
        for req in late:  # deferred prompts: what the rest left of the step
            if req.status is RequestStatus.RUNNING and (  # else preempted as a victim
                    num_new := self._schedule_chunk(req, step)):
                charges.add(self.lanes[req.lane], req.tenant, num_new)
        charge(self.lanes, charges)
        step.decisions.tokens_by_lane = charges.by_lane
        return step.output(), step.decisions

    def _schedule_running(self, step: StepPlan, now: float) -> list[Request]:
        """The one pass over the running set, in the policy's order, within the budget.
        Returns the deferred requests (engine/lanes/admission.py) still computing their
        prompt, unscheduled: their chunks take what the step has left once the queued
        requests have started, so a long deferred prompt under way never holds back a
        request that can still meet its TTFT. Once one has waited its lane's queue
        timeout since arrival it runs in its place: started in time, it is served."""
        budget, decodes = step.budget, step.out.decodes
        # NOTE: decode_first holds prompt chunks back until every decode has its token, so
        # a long prompt never delays the token of every running stream.
        defer_chunks = step.live.schedule_policy == "decode_first"
        deferred: list[Request] = []
        late: list[Request] = []
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
                if req.slo_deferred and computed < req.num_prompt_tokens and (
                        now - req.arrival_time < self.lanes[req.lane].queue_timeout_s(
                            step.live)):
                    late.append(req)
                    continue
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
        return late

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

    def _schedule_chunk(self, req: Request, step: StepPlan) -> int:
        """A running request's next prompt chunk, if the budget allows: its tokens (0:
        none)."""
        budget = step.budget
        if budget.room <= 0:
            return 0
        num_new = min(req.num_tokens - req.num_computed_tokens, step.chunk_tokens,
                      budget.tokens_left, step.chunk_room(req))
        if num_new <= 0 or not self._allocate_or_preempt(req, num_new, step):
            return 0
        step.add_chunk(req, num_new)
        return num_new

    def _allocate_or_preempt(self, req: Request, num_new: int, step: StepPlan) -> bool:
        """Allocate blocks for req, preempting victims as needed; False if req was the one."""
        bm = self.block_manager
        while not bm.allocate(req, num_new):
            victim = pick_victim(self.running, req, self.lanes)
            if victim is None or victim is req:
                self.preempt(req, step.decisions)
                return False
            step.unschedule(victim)
            self.preempt(victim, step.decisions)
        return True

    # ---- update ----------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled_token_ids: list[int],
               now: float) -> tuple[list[Request], list[Request]]:
        """Apply the executor's sampled tokens (engine/scheduling/apply_sampled.py): returns the
        requests of the sample rows, in row order, and those that finished."""
        return apply_sampled(self, out, sampled_token_ids, now)

    # ---- ends the engine asks for --------------------------------------------------
    def end_timeouts(self, now: float) -> list[Request]:
        """End as TIMEOUT what is due at `now`, the start of a step: queued requests never
        scheduled by their queue timeout (the lane's, else the global one) or their
        deadline, then started ones past their deadline (with the tokens they have).
        Returns them, each with its finish detail, in that order."""
        ended: list[Request] = []
        timeout = RequestStatus.TIMEOUT
        for lane in self.lanes:
            for req in lane.expired(now, lane.queue_timeout_s(self.live)):
                passed = req.deadline is not None and req.deadline < now
                self.finish(req, timeout, now,
                            "deadline passed while queued" if passed else "queue timeout")
                ended.append(req)
        # NOTE: read after every queue is swept: due() skips a request ended above
        for req in self.deadlines.due(now):
            where = "running" if req.status is RequestStatus.RUNNING else "queued"
            self.finish(req, timeout, now, f"deadline passed while {where}")
            ended.append(req)
        return ended

    def end_with_error(self, requests: list[Request], now: float, detail: str,
                       ) -> list[Request]:
        """End `requests` with ERROR (a failed part of a step, or every request after a
        step failed outside execute and update); returns them. One that update() had
        finished before it raised is re-marked: its blocks are already free."""
        for req in requests:
            if req.is_finished:
                req.set_finished(RequestStatus.ERROR, now, detail)
            else:
                self.finish(req, RequestStatus.ERROR, now, detail)
        return requests
