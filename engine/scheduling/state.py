"""The scheduler's state, and the three verbs that move a request through it.

`SchedulerState` holds what the scheduler owns between steps: the installed `LiveConfig`,
the running set (admission order), the lanes' queues (engine/lanes), started requests'
deadlines, the step law with its measured-over-predicted ratio, and the step counter; the
block manager is shared with the engine (it reads the KV pool, only the scheduler's verbs
and passes allocate and free).

Three verbs move a request, and nothing else changes its status or where it is held:

    start    queued -> running    out of its lane's queue, into the running set
    preempt  running -> queued    its KV dropped (to be recomputed), queued again
    finish   either -> finished   out of its queue or the running set, its blocks freed

The parts of a step (`new_prefills.py`, `apply_sampled.py`) take a `SchedulerState` and
move requests only through these verbs; `Scheduler` (scheduler.py) is a `SchedulerState`
with the step's passes on top, so no part of the scheduling imports the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from engine.calibration.online_law import OnlineLaw, Refit
from engine.calibration.step_law import StepFeatures, StepLaw
from engine.config import LiveConfig, StaticConfig
from engine.errors import SchedulerInvariantError
from engine.kv.block_manager import BlockManager
from engine.lanes.queues import LaneSet
from engine.records import SchedulingDecisions
from engine.request import Request, RequestStatus
from engine.scheduling.deadlines import DeadlineHeap
from engine.scheduling.spare_rate import SpareRate
from engine.scheduling.step_time import LawSlowdown

log = logging.getLogger("batchpilot.engine")

GROWABLE_BUDGETS = ("prefill_chunk_size", "max_num_batched_tokens")  # budget_fit's fields


class SchedulerState:
    def __init__(self, static: StaticConfig, live: LiveConfig, block_manager: BlockManager,
                 step_law: StepLaw | None = None,
                 growable_budgets: Collection[str] = GROWABLE_BUDGETS):
        """`step_law`: what a step costs on the device (engine/calibration/step_law.py);
        with it every step is held to a time target (engine/scheduling/goodput.py,
        step_time.py). `growable_budgets`: the budgets the start-up fit chose (not the
        operator), which a step grown past target_step_ms may grow with it."""
        self.static = static
        self.step_law = step_law
        self.growable_budgets = frozenset(growable_budgets)
        self.law_slowdown = LawSlowdown()  # measured / predicted: Engine.step feeds it
        # the law refitted from served steps (engine/calibration/online_law.py)
        self.online_law = OnlineLaw(step_law) if step_law is not None else None
        self.live = live
        self.block_manager = block_manager
        self.lanes = LaneSet(live.lanes)
        self.running: list[Request] = []  # admission order
        self.step_id = 0
        self.deadlines = DeadlineHeap()  # started requests with a deadline (deadlines.py)
        # device time deferred requests get (spare_rate.py): their work started since the
        # last step, and whether one waited then
        self.spare_rate = SpareRate()
        self._deferred_work = 0.0
        self._deferred_waited = False

    def observe_step(self, predicted_s: float | None,
                     features: StepFeatures | None, measured_s: float) -> Refit | None:
        """The step just served, measured (Engine.step): the slowdown's moving average and
        the online refit; a refit adopted replaces the law, and the slowdown starts over
        (the new law was fitted to served steps, their overheads included)."""
        self.law_slowdown.observe(predicted_s, measured_s)
        if self.online_law is None:
            return None
        refit = self.online_law.observe(features, measured_s, self.step_law)
        if refit is not None and refit.adopted:
            log.info("step law refitted from %d served steps: %s (mean error %.1f%%, the"
                     " old law rescaled x%.2f: %.1f%%)", len(self.online_law.window),
                     refit.law.to_dict(), refit.error_pct, refit.ratio,
                     refit.rescaled_error_pct)
            self.step_law = refit.law
            self.law_slowdown = LawSlowdown()
        return refit

    # ---- queue side ------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """A request just admitted (Engine.add_request) joins its lane's queue."""
        self.lanes.push(req)

    def observe_deferred(self, now: float) -> None:
        """At a step's start: what deferred requests got since the last one (spare_rate)."""
        self.spare_rate.observe(now, self._deferred_waited, self._deferred_work)
        self._deferred_work = 0.0
        self._deferred_waited = any(lane.num_deferred for lane in self.lanes)

    def set_live(self, live: LiveConfig, moves: dict[str, str],
                 requests: list[Request]) -> None:
        self.lanes.reconfigure(live.lanes, moves, requests)
        self.live = live

    def is_static(self, lane_name: str) -> bool:
        return self.live.lane_batching(self.lanes[lane_name].config) == "static"

    def chunk_size(self, live: LiveConfig) -> int:
        """Most prompt tokens a request runs in one step; without chunking, all of them."""
        return live.prefill_chunk_size if live.chunked_prefill else self.static.max_model_len

    # ---- a request's life: start, preempt, finish ------------------------------------
    def start(self, req: Request, now: float, decisions: SchedulingDecisions) -> None:
        """Queued -> running. `req` is what its lane's peek() returned, with the blocks for
        its first chunk."""
        lane = self.lanes[req.lane]
        lane.pop(req)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        lane.add_running(req)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
            if req.slo_deferred and self.step_law is not None:
                self._deferred_work += self.step_law.chunk_s(0, req.num_tokens)
            decisions.admitted.append(req.request_id)
            if req.deadline is not None:
                self.deadlines.push(req, len(self.running) + self.lanes.num_waiting)

    def preempt(self, req: Request, decisions: SchedulingDecisions) -> None:
        """Running -> queued again in its lane; its KV is dropped, to be recomputed."""
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.running.remove(req)
        self.lanes[req.lane].remove_running(req)
        self.lanes.push(req)
        decisions.preempted.append(req.request_id)

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
