"""The iteration-level scheduler: each step, which requests run how many tokens.

Token-budget model: a request's `num_computed_tokens` catches up with its `num_tokens`.
Order of work within a step (decode-first policy):
  1. running requests that decode (one token each),
  2. running requests part-way through a prompt (chunks of prefill_chunk_size),
  3. new prefills from the lanes by weighted fair share,
all within max_num_seqs and max_num_batched_tokens. No new prefill starts while KV usage
is above the high watermark. A running request that cannot get a block preempts a victim
(recompute): see `engine/preemption.py`. The "mixed" policy runs steps 1 and 2 in
admission order instead.

Budgets are read once per step from the `LiveConfig` snapshot passed to `schedule()`.
"""

from __future__ import annotations

from engine.block_manager import BlockManager
from engine.config import LiveConfig, StaticConfig
from engine.fair_share import charge_running
from engine.lanes import LaneSet
from engine.preemption import pick_victim
from engine.records import PrefillChunk, SchedulerOutput
from engine.request import FINISH_REASONS, Request, RequestStatus


class Scheduler:
    def __init__(self, static: StaticConfig, live: LiveConfig, block_manager: BlockManager):
        self.static = static
        self.live = live
        self.block_manager = block_manager
        self.lanes = LaneSet(live.lanes)
        self.running: list[Request] = []  # admission order
        self.step_id = 0
        self._turn = 0  # where _in_turn starts next when more run than a step may serve

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
    def schedule(self, now: float) -> SchedulerOutput:
        live = self.live  # one snapshot for the whole step
        self.step_id += 1
        out = SchedulerOutput(self.step_id, [], [], live.version, live.max_num_batched_tokens)
        budget = self._schedule_running(out, live)
        charge_running(self.lanes, out)
        self._schedule_new(out, budget, live, now)
        out.num_decode_tokens = len(out.decodes)
        out.num_prefill_tokens = sum(c.num_tokens for c in out.prefills)
        assert out.num_tokens <= live.max_num_batched_tokens, "token budget exceeded"
        assert out.num_seqs <= live.max_num_seqs, "max_num_seqs exceeded"
        return out

    def _schedule_running(self, out: SchedulerOutput, live: LiveConfig) -> int:
        """Schedule running requests; returns the token budget left for new prefills.

        decode_first: every decode, then partial prefills. mixed: admission order.
        """
        if live.schedule_policy == "decode_first":
            for req in self._schedule_decodes(out, live):
                if req.status is RequestStatus.RUNNING:  # else preempted as a victim
                    self._schedule_chunk(req, out, live)
        else:
            for req in self._in_turn(live.max_num_seqs):
                if req.status is not RequestStatus.RUNNING:
                    continue
                if req.is_prefill:
                    self._schedule_chunk(req, out, live)
                elif (self._budget_left(out, live) > 0 and out.num_seqs < live.max_num_seqs
                      and self._allocate_or_preempt(req, 1, out)):
                    out.decodes.append(req)
        return self._budget_left(out, live)

    def _in_turn(self, cap: int) -> list[Request]:
        """The running requests in the order this step serves them (a copy: preemption
        edits the running list). Admission order; but when more run than `cap` may be
        served (a limit lowered live under load), start after the last one served, so
        every stream advances in turn instead of the newest stalling until others finish
        (and being cut by the stream idle timeout)."""
        running = self.running
        if len(running) <= cap:
            return list(running)
        k = self._turn % len(running)
        self._turn = k + cap
        return running[k:] + running[:k]

    def _schedule_decodes(self, out: SchedulerOutput, live: LiveConfig) -> list[Request]:
        """The per-step hot path: one token for each decoding request, in admission order.

        Returns the running requests part-way through a prompt, for after the decodes.
        """
        block_size = self.block_manager.block_size
        running_status = RequestStatus.RUNNING
        cap = min(live.max_num_batched_tokens, live.max_num_seqs)  # decodes are 1 token
        decodes = out.decodes
        partial: list[Request] = []
        for req in self._in_turn(cap):
            if req.status is not running_status:
                continue  # preempted as a victim earlier in this loop
            computed = req.num_computed_tokens
            if len(req.token_ids) - computed > 1 or computed < req.num_prompt_tokens:
                partial.append(req)
                continue
            if len(decodes) >= cap:
                break  # no budget or sequence slot left for anyone
            if computed >= len(req.block_ids) * block_size and not self._allocate_or_preempt(
                    req, 1, out):
                continue  # req itself was preempted
            decodes.append(req)
        return partial

    def _schedule_chunk(self, req: Request, out: SchedulerOutput, live: LiveConfig) -> None:
        """A running request's next prompt chunk, if budget and max_num_seqs allow."""
        budget = self._budget_left(out, live)
        if budget <= 0 or out.num_seqs >= live.max_num_seqs:
            return
        num_new = min(req.num_tokens - req.num_computed_tokens, self._chunk_size(live), budget)
        if self._allocate_or_preempt(req, num_new, out):
            sample = req.num_computed_tokens + num_new == req.num_tokens
            out.prefills.append(PrefillChunk(req, num_new, sample))

    @staticmethod
    def _budget_left(out: SchedulerOutput, live: LiveConfig) -> int:
        return live.max_num_batched_tokens - len(out.decodes) - sum(
            c.num_tokens for c in out.prefills)

    def _allocate_or_preempt(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Allocate blocks for req, preempting victims as needed; False if req was the one."""
        bm = self.block_manager
        while not bm.allocate(req, num_new):
            victim = pick_victim(self.running, req, self.lanes)
            if victim is None or victim is req:
                self.preempt(req, out)
                return False
            self._unschedule(out, victim)
            self.preempt(victim, out)
        return True

    def _unschedule(self, out: SchedulerOutput, victim: Request) -> None:
        if victim in out.decodes:
            out.decodes.remove(victim)
        out.prefills = [c for c in out.prefills if c.request is not victim]

    def preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Recompute preemption: drop the request's KV and queue it again in its lane."""
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self._leave_running(req)
        self.lanes.push(req)
        out.preempted.append(req.request_id)

    def _schedule_new(self, out: SchedulerOutput, budget: int, live: LiveConfig,
                      now: float) -> None:
        """Start new prefills from the lanes by fair share until a limit stops us."""
        bm = self.block_manager
        blocked = self.lanes.blocked(live)
        stop_reason = None
        while True:
            if budget <= 0:
                stop_reason = "token_budget"
                break
            if len(self.running) >= live.max_num_seqs or out.num_seqs >= live.max_num_seqs:
                stop_reason = "max_num_seqs"
                break
            if self.running and bm.usage > live.kv_cache_high_watermark:
                stop_reason = "kv_high_watermark"
                break
            lane = self.lanes.pick(blocked)
            if lane is None:
                break
            req = lane.peek()
            stop_reason = self._try_start(req, budget, live)
            if stop_reason is not None:
                break
            lane.pop(req)
            num_new = min(req.num_tokens - req.num_computed_tokens, self._chunk_size(live),
                          budget)
            self._start(req, now, out)
            sample = req.num_computed_tokens + num_new == req.num_tokens
            out.prefills.append(PrefillChunk(req, num_new, sample))
            budget -= num_new
            lane.charge(req, num_new)
            out.tokens_by_lane[lane.name] = out.tokens_by_lane.get(lane.name, 0) + num_new
            max_running = lane.config.max_running
            if max_running is not None and lane.num_running >= max_running:
                blocked[lane.name] = "lane_max_running"
        out.waiting_by_reason, out.waiting_reason_by_lane = self.lanes.waiting_reasons(
            blocked, stop_reason)

    def _try_start(self, req: Request, budget: int, live: LiveConfig) -> str | None:
        """Take prefix-cache hits and blocks for req's first chunk; a reason if it can't."""
        bm = self.block_manager
        if req.num_computed_tokens == 0 and not req.block_ids:
            hit = bm.allocate_prefix(req)
            req.num_computed_tokens = hit
            if req.first_scheduled_time is None:
                req.num_cached_tokens = hit
        remaining = req.num_tokens - req.num_computed_tokens
        num_new = min(remaining, self._chunk_size(live), budget)
        reason = None
        if not live.chunked_prefill and remaining > budget:
            reason = "token_budget"
        elif self.running and (bm.num_used + bm.blocks_needed(req, num_new)) > (
                live.kv_cache_high_watermark * bm.num_blocks):
            reason = "kv_high_watermark"
        elif not bm.allocate(req, num_new):
            reason = "kv_blocks"
        if reason is not None:
            bm.free(req)
            req.num_computed_tokens = 0
        return reason

    def _chunk_size(self, live: LiveConfig) -> int:
        """Most prompt tokens a request runs in one step; without chunking, all of them."""
        return live.prefill_chunk_size if live.chunked_prefill else self.static.max_model_len

    def _start(self, req: Request, now: float, out: SchedulerOutput) -> None:
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.lanes[req.lane].num_running += 1
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
            out.admitted.append(req.request_id)

    # ---- finishing -------------------------------------------------------------------
    def finish(self, req: Request, status: RequestStatus, now: float, detail: str = "") -> None:
        """End a request in any state: free its blocks, leave its queue or the running set."""
        assert status.is_finished and not req.is_finished
        was = req.status
        req.status = status
        req.finished_time = now
        req.finish_reason = FINISH_REASONS[status]
        req.finish_detail = detail
        if was is RequestStatus.RUNNING:
            self._leave_running(req)
        elif req.lane in self.lanes.lanes:
            self.lanes[req.lane].discard(req)
        self.block_manager.free(req)


    # ---- update ----------------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled_token_ids: list[int],
               now: float) -> tuple[list[Request], list[Request]]:
        """Advance each scheduled request; append sampled tokens; end those that stop.

        `sampled_token_ids` has one id per sample row (decodes, then sampled prefills).
        Returns the requests of the sample rows, in row order, and those that finished.
        """
        bm = self.block_manager
        block_size = bm.block_size
        finished: list[Request] = []
        rows = list(out.decodes)
        for chunk in out.prefills:
            req = chunk.request
            req.num_computed_tokens += chunk.num_tokens
            if req.num_computed_tokens // block_size > len(req.block_hashes):
                bm.cache_full_blocks(req)
            if chunk.sample:
                rows.append(req)
                req.prefill_done_time = now
                if req.first_token_time is None:
                    req.first_token_time = now
                    if self.is_static(req.lane):
                        self.lanes[req.lane].batch_closed = True
        assert len(sampled_token_ids) == len(rows), "one sampled token per sample row"
        for req, token_id in zip(out.decodes, sampled_token_ids, strict=False):  # hot path
            req.num_computed_tokens += 1
            if req.num_computed_tokens % block_size == 0:  # a block just became full
                bm.cache_full_blocks(req)
            tokens = req.token_ids
            tokens.append(token_id)
            req.token_times.append(now)
            if token_id in req.stop_token_ids or len(tokens) >= req.max_num_tokens:
                self._stop(req, token_id, now, finished)
        for req, token_id in zip(rows[len(out.decodes):], sampled_token_ids[len(out.decodes):],
                                 strict=True):
            req.token_ids.append(token_id)
            req.token_times.append(now)
            if token_id in req.stop_token_ids or len(req.token_ids) >= req.max_num_tokens:
                self._stop(req, token_id, now, finished)
            else:  # prompt (or recompute) done: from now on one token a step
                req.decoding = True
                self.lanes[req.lane].add_decoding(req.tenant, 1)
        return rows, finished

    def _stop(self, req: Request, token_id: int, now: float, finished: list[Request]) -> None:
        """End req after its last token: a stop token (EOS too) is STOPPED, else LENGTH."""
        stopped = token_id in req.stop_token_ids
        self.finish(req, RequestStatus.STOPPED if stopped else RequestStatus.LENGTH, now)
        finished.append(req)

    def _leave_running(self, req: Request) -> None:
        self.running.remove(req)
        lane = self.lanes[req.lane]
        lane.num_running -= 1
        if req.decoding:
            req.decoding = False
            lane.add_decoding(req.tenant, -1)
        if lane.num_running == 0:
            lane.batch_closed = False  # static batching: the next batch may form
