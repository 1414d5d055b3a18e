"""The engine: admission, then each step schedule -> execute -> update.

Not thread-safe by design: one thread (the engine loop) calls every method. Other threads
hand it work through the loop's command queue (see control/).

Calls go one way, down: the engine asks admission (engine/lanes), the scheduler
(engine/scheduling), the executor and, for a failed step, engine/fault_isolation.py, and
builds its reports (engine/reports.py) from what they return. Requests that end outside a
step's update (aborts, timeouts, a failed step) are ended by the scheduler's own methods,
which return them; the engine then does its bookkeeping of them (`_ended`: out of its
unfinished requests, a final delta and a record with the next step's output).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any, Protocol

from engine.calibration.drift import StepCostWatch
from engine.calibration.step_law import StepLaw
from engine.calibration.thread_governor import ThreadGovernor
from engine.config import EngineConfig, LiveConfig
from engine.fault_isolation import DEFAULT_MAX_EXTRA_RUNS, contain
from engine.kv.block_manager import BlockManager, KVSnapshot
from engine.lanes.admission import SLO_DEFERRED, AdmissionContext, ThroughputEstimator, admit
from engine.lanes.integrity import check_lanes
from engine.lanes.routing import check_lane_moves, route
from engine.records import (
    AdmissionDecision,
    EngineGauges,
    RequestDelta,
    SchedulerOutput,
    StepOutput,
    StepRecord,
    StepRun,
)
from engine.reports import engine_gauges, step_output, step_record
from engine.request import Request, RequestStatus, SamplingParams, TraceLink
from engine.scheduling.goodput import slo_lane
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.slo_estimates import deferred_start_s, predicted_ttft_s
from engine.scheduling.state import GROWABLE_BUDGETS

__all__ = ["Engine", "Executor"]


class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> list[int]:
        """Run one step; return one sampled token id per sample row of `out` (a plain
        list, or `engine.logprobs.SampledTokens` carrying the rows' logprobs)."""


class Engine:
    def __init__(self, config: EngineConfig, executor: Executor, *,
                 clock: Callable[[], float] = time.time,
                 eos_token_id: int | tuple[int, ...] | None = None,
                 fault_isolation_runs: int = DEFAULT_MAX_EXTRA_RUNS,
                 step_law: StepLaw | None = None,
                 growable_budgets: Collection[str] = GROWABLE_BUDGETS):
        """`fault_isolation_runs`: executor calls a failed step may add to find the
        requests that fail it (engine/fault_isolation.py); 0 ends the whole batch.
        `step_law`: the device's step cost (engine/calibration/budget_fit.py), to size steps
        (engine/scheduling/goodput.py); `growable_budgets`: the budgets its fit chose."""
        config.validate()
        self.fault_isolation_runs = fault_isolation_runs
        self.static = config.static
        self.executor = executor
        self.clock = clock
        self.eos_token_id = eos_token_id
        self.block_manager = BlockManager(self.static.num_kv_blocks, self.static.block_size,
                                          self.static.enable_prefix_caching,
                                          self.static.prefix_cache_sharing)
        bind_kv_pool = getattr(executor, "bind_kv_pool", None)
        if bind_kv_pool is not None:  # the simulated executor mirrors the pool (shadow KV)
            bind_kv_pool(self.static.num_kv_blocks, self.static.block_size)
        live = config.live.replace(version=1)
        self.scheduler = Scheduler(self.static, live, self.block_manager, step_law,
                                   growable_budgets)
        self.requests: dict[str, Request] = {}  # unfinished only
        self.throughput = ThroughputEstimator()
        self.step_cost = StepCostWatch()  # served steps against the law: device drift
        self.startup_law = step_law  # what drift is measured against (the law may refit)
        self.thread_governor: ThreadGovernor | None = None  # set by engine/llm.py on a CPU
        self._pending_deltas: list[RequestDelta] = []  # ends between steps (abort, timeout)
        self._pending_finished: list[Request] = []
        self._pending_admissions: list[AdmissionDecision] = []
        self._last_wait_reasons: dict[str, str] = {}  # lane -> why it started none, last step

    # ---- config ------------------------------------------------------------------------
    @property
    def live_config(self) -> LiveConfig:
        return self.scheduler.live

    def update_config(self, live: LiveConfig, lane_moves: dict[str, str] | None = None,
                      ) -> LiveConfig:
        """Validate and install a new snapshot; it applies from the next step.

        Requests of a removed lane move to `lane_moves[lane]`; removing a lane that still
        has requests without naming a target is refused, so nothing is dropped.
        """
        self.check_lane_moves(live, lane_moves)
        moves = dict(lane_moves or {})
        installed = live.replace(version=self.live_config.version + 1)
        self.scheduler.set_live(installed, moves, list(self.requests.values()))
        return installed

    def check_lane_moves(self, live: LiveConfig, lane_moves: dict[str, str] | None) -> None:
        """Raise ValueError (`engine.lanes.routing.LaneNotEmptyError`) unless `live` may
        be installed now."""
        check_lane_moves(live, self.static, self.live_config, self.requests.values(), lane_moves)

    # ---- requests ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: SamplingParams | None = None, *, tenant: str = "default",
                    lane: str | None = None, priority: int = 0, deadline: float | None = None,
                    arrival_time: float | None = None, tokenize_s: float = 0.0,
                    cache_salt: str | None = None, wait_for: str | None = None,
                    trace: TraceLink | None = None, resent: bool = False,
                    ) -> AdmissionDecision:
        """Admit or reject at once. `deadline` is absolute, on the engine clock;
        `cache_salt` puts the request's prefix-cache blocks in the salt's domain instead of
        its tenant's (engine/kv/prefix_hash.py). `arrival_time` (engine clock; default now):
        when the request reached the server, from which its queue delay, TTFT, E2E and
        queue timeout count; `tokenize_s`: the part of the time since then the server
        spent tokenizing it (recorded in the decision, for the trace's wait reasons).
        `wait_for`: the id of a request with the same prompt (n > 1's first choice); this
        one starts once that one's prompt is computed, from its prefix-cache blocks.
        `trace`: the caller's distributed trace, carried into the request's records.
        `resent`: its client was refused before and sends it again (Request.resent)."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = self.clock()
        req = Request(request_id, list(prompt_token_ids), params or SamplingParams(),
                      arrival_time if arrival_time is not None else now, tenant=tenant,
                      lane=lane or self.route(len(prompt_token_ids), tenant), priority=priority,
                      deadline=deadline, eos_token_id=self.eos_token_id,
                      cache_salt=cache_salt, trace=trace, resent=resent,
                      wait_for=self.requests.get(wait_for) if wait_for else None)
        ctx = AdmissionContext(self.live_config, self.static, self.scheduler.lanes,
                               self.block_manager.usage, self.throughput.tokens_per_s, now,
                               self.scheduler.running,
                               functools.partial(predicted_ttft_s, self.scheduler),
                               functools.partial(deferred_start_s, self.scheduler))
        decision = replace(admit(req, ctx), time=now, arrival_time=req.arrival_time,
                           tokenize_s=tokenize_s)
        self._pending_admissions.append(decision)
        if not decision.accepted:
            self._finish(req, RequestStatus.REJECTED, now, decision.reason or "")
            return decision
        req.admitted_time = now
        req.slo_deferred = decision.reason == SLO_DEFERRED
        self.requests[request_id] = req
        self.scheduler.add(req)
        return decision

    def refuse(self, request_id: str, prompt_token_ids: list[int], reason: str, message: str,
               retry_after_s: float | None = None, *, tenant: str = "default",
               lane: str | None = None, priority: int = 0,
               arrival_time: float | None = None,
               trace: TraceLink | None = None) -> AdmissionDecision:
        """Record a request turned away before admission (e.g. the server is draining):
        it is reported like any rejection, with a RequestRecord in the next step, its
        latency counted from `arrival_time` (engine clock; default now) like an admitted one."""
        now = self.clock()
        arrived = arrival_time if arrival_time is not None else now
        req = Request(request_id, list(prompt_token_ids), SamplingParams(), arrived, tenant=tenant,
                      lane=lane or self.route(len(prompt_token_ids), tenant), priority=priority,
                      trace=trace)
        decision = AdmissionDecision(False, request_id, reason, message, retry_after_s,
                                     req.lane, None, tenant, priority, req.num_prompt_tokens, now,
                                     arrival_time=arrived)
        self._pending_admissions.append(decision)
        self._finish(req, RequestStatus.REJECTED, now, reason)
        return decision

    def route(self, num_prompt_tokens: int, tenant: str = "") -> str:
        """The lane for a request that names none (engine/lanes/routing.py), moved to the
        long-context lane when its prefill alone misses the default lane's TTFT
        (engine/scheduling/goodput.py, slo_lane)."""
        lane = route(self.live_config, num_prompt_tokens, tenant)
        return slo_lane(self.scheduler, lane, num_prompt_tokens, tenant)

    def abort(self, request_id: str, status: RequestStatus = RequestStatus.CANCELLED,
              detail: str = "") -> bool:
        """End a waiting or running request now; its blocks are free before the next step."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._finish(req, status, self.clock(), detail)
        return True

    def _finish(self, req: Request, status: RequestStatus, now: float, detail: str) -> None:
        """End a request between steps; its RequestRecord goes out with the next step.

        An accepted one is freed at once and its final delta goes out with that step; one
        turned away before admission (REJECTED) holds nothing and has no stream to end.
        """
        if self.requests.get(req.request_id) is req:
            self.scheduler.finish(req, status, now, detail)
            self._ended([req])  # ended now: a second abort finds nothing
        else:
            req.set_finished(status, now, detail)
            self._pending_finished.append(req)

    def _ended(self, ended: list[Request]) -> None:
        """Bookkeeping of requests the scheduler has just ended outside update() (abort,
        timeout, a failed step): out of the unfinished ones; their final deltas and
        records go out with this step's output."""
        for req in ended:
            del self.requests[req.request_id]
            self._pending_deltas.append(
                RequestDelta(req.request_id, [], req.finish_reason, req.finish_detail))
            self._pending_finished.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._pending_deltas or self._pending_finished)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def kv_snapshot(self) -> KVSnapshot:
        return self.block_manager.snapshot(list(self.requests.values()))

    def check_integrity(self) -> None:
        """Blocks, lane counters and the running set, recounted from the requests."""
        requests = list(self.requests.values())
        self.block_manager.check_integrity(requests)
        check_lanes(self.scheduler.lanes, requests, self.scheduler.running)

    # ---- the step ----------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One iteration: expire, schedule, execute, update; returns what changed."""
        start = self.clock()
        t0 = time.perf_counter()
        self._expire(start)
        if not self.requests:
            return self._drain_pending(None)
        bm = self.block_manager
        prefix0 = bm.prefix_query_tokens, bm.prefix_hit_tokens
        run = self.run_step(start)
        if bm.events is not None:  # this step's stored and evicted blocks, as one batch
            bm.events.seal(run.out.step_id)
        record = step_record(run, self.scheduler, start, t0, prefix0)  # engine/reports.py
        out, took = run.out, run.end - start
        refit = self.scheduler.observe_step(out.predicted_s, out.law_features, took)
        if refit is not None and refit.adopted:
            record.law_refit = (refit.replaced.to_dict(), refit.law.to_dict())
        # drift is against the start-up law: how far the device is from where it began,
        # whatever the online refit has since made of the law
        law0 = self.startup_law
        relative = self.step_cost.observe(run.end, law0.step_s(*out.law_features)
                                          if law0 is not None and out.law_features else None,
                                          took)
        if self.thread_governor is not None:  # a CPU model's threads (thread_governor.py)
            record.thread_switch = self.thread_governor.observe(relative, run.end)
        return self._drain_pending(record, run)

    def run_step(self, start: float) -> StepRun:
        """Schedule, execute and update one step that has requests (expiry done, `start`
        on the engine clock): what every step does; `step` makes its telemetry of it, a
        what-if replay (control/whatif/lean.py) only reads it."""
        sched = self.scheduler
        out, decisions = sched.schedule(start)
        t1 = time.perf_counter()
        failure, phase = None, "execute"
        try:
            sampled = self.executor.execute(out) if not out.is_empty else []
            t2 = time.perf_counter()
            end = self.clock()
            phase = "update"
            rows, finished = sched.update(out, sampled, end)
        except Exception as exc:  # contained: only the failing part's requests end
            # the ended requests' blocks are freed; this step's preemption victims stay queued
            contained = contain(self.executor.execute, sched, out, phase, exc,
                                self.fault_isolation_runs, self.clock())
            rows, finished, sampled = contained.rows, contained.finished, contained.sampled
            failure = contained.failure
            self._ended(contained.ended)
            t2, end = time.perf_counter(), self.clock()
        for req in finished:
            del self.requests[req.request_id]
        if failure is None:  # a failed step's time says nothing of the throughput
            # Measured on the engine clock, the one deadlines are on (simulated in
            # simulations).
            self.throughput.observe(out.num_tokens, end - start)
        self._last_wait_reasons = decisions.waiting_reason_by_lane
        return StepRun(out, decisions, rows, sampled, finished, failure, end,
                       (t1, t2, time.perf_counter()))

    # ---- ends outside update(): a failed step, timeouts ------------------------------
    def fail_all(self, detail: str) -> StepOutput:
        """End every unfinished request with ERROR, after step() raised outside execute
        and update (a scheduler bug: which requests it touched is unknown). Returns what
        the next step would report: their final deltas and records."""
        requests = list(self.requests.values())
        self._ended(self.scheduler.end_with_error(requests, self.clock(), detail))
        return self._drain_pending(None)

    def _expire(self, now: float) -> None:
        """End as TIMEOUT what is due at `now` (`Scheduler.end_timeouts`)."""
        self._ended(self.scheduler.end_timeouts(now))

    def _drain_pending(self, record: StepRecord | None, run: StepRun | None = None,
                       ) -> StepOutput:
        """The step's output (engine/reports.py); the ends it carries are cleared."""
        result = step_output(record, run, self._pending_deltas, self._pending_finished,
                             self._pending_admissions)
        self._pending_deltas, self._pending_finished, self._pending_admissions = [], [], []
        return result

    def run_until_done(self, max_steps: int = 1_000_000) -> list[StepOutput]:
        """Step until no request is left (tests, the offline API, the demo)."""
        outputs = []
        for _ in range(max_steps):
            if not self.has_unfinished_requests():
                return outputs
            outputs.append(self.step())
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")

    def gauges(self) -> EngineGauges:
        """The engine's state now (between steps): what the metrics' gauges show."""
        return engine_gauges(self.scheduler, self.block_manager, self._last_wait_reasons,
                             self.clock(), self.step_cost, self.thread_governor)

    def stats(self) -> dict[str, Any]:
        lanes = self.scheduler.lanes
        now, live = self.clock(), self.live_config
        return {"running": len(self.scheduler.running), "waiting": lanes.num_waiting,
                "kv_usage": self.block_manager.usage, "config_version": self.live_config.version,
                "queue_slo_share": max((q.queue_slo_share(now, live.lane_slo(q.config).ttft_s)
                                        for q in lanes), default=0.0)}
