"""Plain records that cross layer boundaries: what to run, what happened, who waited.

The engine emits these; `control/` turns them into HTTP chunks, metrics and trace rows.
Nothing here imports web, metrics or database code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.calibration.drift import StepCostDrift
from engine.calibration.thread_governor import ThreadSwitch
from engine.config import LiveConfig
from engine.request import Request, TraceLink

STEP_FAILED = "step failed"  # the start of a failed request's finish detail (its reason)


@dataclass(slots=True)
class PrefillChunk:
    request: Request
    num_tokens: int  # tokens computed this step, from request.num_computed_tokens on
    sample: bool  # the chunk reaches the request's last token: sample its logits


@dataclass
class SchedulerOutput:
    """One step's work (what the scheduler decided besides: `SchedulingDecisions`). Decodes
    run one token each and are always sampled.

    Sample rows, in order: every decode, then every prefill chunk with `sample`.
    """

    step_id: int
    decodes: list[Request]
    prefills: list[PrefillChunk]
    config_version: int
    token_budget: int
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    # the step law's time of this work (engine/scheduling/step_time.py), and its features
    # (tokens, decodes among them, prefill pairs, decode context: StepFeatures of
    # engine/calibration/step_law.py)
    predicted_s: float | None = None
    law_features: tuple[int, int, int, int] | None = None
    # the step's time target and why it was chosen (engine/scheduling/goodput.py); None
    # without a step law
    target_s: float | None = None
    step_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.decodes) + len(self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    def sample_requests(self) -> list[Request]:
        return self.decodes + [c.request for c in self.prefills if c.sample]


@dataclass
class SchedulingDecisions:
    """What one step's scheduling decided besides the work: who started, who was
    preempted, why the queued requests that did not start waited, tokens by lane.
    The engine attaches it to the step's StepRecord as `decisions`."""

    admitted: list[str] = field(default_factory=list)  # first scheduled in this step
    preempted: list[str] = field(default_factory=list)  # queued again (recompute)
    waiting_by_reason: dict[str, int] = field(default_factory=dict)  # queued requests
    # why each lane with queued requests started none (only those lanes)
    waiting_reason_by_lane: dict[str, str] = field(default_factory=dict)
    tokens_by_lane: dict[str, int] = field(default_factory=dict)  # charged to each lane


@dataclass(slots=True)
class RequestDelta:
    """What one request gained in a step: new tokens, and whether it ended."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # stop | length | cancelled | timeout | rejected | error
    finish_detail: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepRecord:
    """One iteration, as the trace and the metrics see it. Times in seconds."""

    step_id: int
    start_time: float  # engine clock at the start of schedule()
    end_time: float  # engine clock after execute (the time its tokens carry)
    duration_s: float  # schedule + execute + update
    schedule_s: float
    execute_s: float
    update_s: float
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    token_budget: int
    tokens_used: int
    max_num_seqs: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_blocks_cached: int
    kv_usage: float
    running_by_lane: dict[str, int]
    waiting_by_lane: dict[str, int]
    finished: list[tuple[str, str]]  # (request id, finish reason)
    config_version: int
    decode_ids: list[str]  # requests that decoded one token
    prefill_chunks: list[tuple[str, int]]  # (request id, prompt tokens computed)
    decisions: SchedulingDecisions  # admitted, preempted, waiting reasons, tokens by lane
    prefix_query_tokens: int = 0  # this step
    prefix_hit_tokens: int = 0
    # The fleet config version the step ran under (stamped by a fleet replica, see
    # control/fleet/replica_window.py); None on a single server.
    fleet_version: int | None = None
    # The start-up step law's prediction of this step's time (s), when the steps are held
    # to target_step_ms by it (engine/scheduling/step_time.py); None otherwise.
    predicted_step_s: float | None = None
    # The step's time target (s) and why (target | grow_for_slo | grow_for_throughput |
    # fixed: engine/scheduling/goodput.py); None without a step law.
    target_step_s: float | None = None
    step_reason: str | None = None
    # The step law this step's measurement replaced, and the refit that replaced it
    # (StepLaw.to_dict each: engine/calibration/online_law.py); None at most steps.
    law_refit: tuple[dict, dict] | None = None
    # The steps' threads changed after this one (engine/calibration/thread_governor.py)
    thread_switch: ThreadSwitch | None = None

    @property
    def scheduled(self) -> list[tuple[str, str, int]]:
        """(request id, "prefill" | "decode", tokens) for every request that ran."""
        return [(rid, "decode", 1) for rid in self.decode_ids] + [
            (rid, "prefill", n) for rid, n in self.prefill_chunks]


@dataclass(frozen=True)
class AdmissionDecision:
    accepted: bool
    request_id: str
    # rejected: queue_full | deadline | kv_reject_watermark | too_long | ...; admitted: None,
    # or slo_deferred (queued behind the requests that can meet their SLO; the message: why)
    reason: str | None = None
    message: str = ""
    retry_after_s: float | None = None
    lane: str = ""
    estimated_wait_s: float | None = None
    tenant: str = ""
    priority: int = 0
    num_prompt_tokens: int = 0
    time: float = 0.0  # engine clock when decided (set by the engine)
    # Set by the engine from add_request: when the request reached the server (engine
    # clock; == time when the caller gave none), and the seconds of that gap the front end
    # spent tokenizing and templating it (0 when it sent token ids or is not a server).
    arrival_time: float | None = None
    tokenize_s: float = 0.0


@dataclass(frozen=True)
class RequestRecord:
    """A request at its end: all timestamps, derived latencies (s), outcome."""

    request_id: str
    lane: str
    tenant: str
    priority: int
    status: str
    finish_reason: str
    finish_detail: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    arrival_time: float
    admitted_time: float | None
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    deadline: float | None
    queue_delay_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prefill_time_s: float | None
    decode_time_s: float | None
    token_times: tuple[float, ...] = ()  # when each output token was sampled
    trace: TraceLink | None = None  # the caller's distributed trace (engine/request.py)
    resent: bool = False  # its client's resend after a refusal (Request.resent)

    @property
    def outcome(self) -> str:
        """finished (stop or length) | cancelled | timeout | rejected | error."""
        if self.finish_reason in ("stop", "length"):
            return "finished"
        return self.finish_reason or "error"

    @classmethod
    def from_request(cls, req: Request) -> RequestRecord:
        return cls(
            request_id=req.request_id, lane=req.lane, tenant=req.tenant,
            priority=req.priority, status=req.status.name,
            finish_reason=req.finish_reason or "", finish_detail=req.finish_detail,
            num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=req.num_output_tokens,
            num_cached_tokens=req.num_cached_tokens, num_preemptions=req.num_preemptions,
            arrival_time=req.arrival_time, admitted_time=req.admitted_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time, finished_time=req.finished_time,
            deadline=req.deadline, queue_delay_s=req.queue_delay_s, ttft_s=req.ttft_s,
            tpot_s=req.tpot_s, e2e_s=req.e2e_s, prefill_time_s=req.prefill_time_s,
            decode_time_s=req.decode_time_s, token_times=tuple(req.token_times),
            trace=req.trace, resent=req.resent,
        )


@dataclass(frozen=True)
class EngineGauges:
    """The engine's state at one moment, between steps: queues, KV pool, live config."""

    time: float  # engine clock
    running_by_lane: dict[str, int]
    waiting_by_lane: dict[str, int]
    waiting_by_reason: dict[str, int]  # as of the last step's decisions
    kv_blocks_total: int
    kv_blocks_used: int  # held by requests
    kv_blocks_free: int  # empty + cached
    kv_blocks_cached: int  # free, but holding a reusable prefix
    kv_usage: float  # used / total
    live: LiveConfig
    step_cost: StepCostDrift | None = None  # None: no step law (engine/calibration/drift.py)


@dataclass(frozen=True)
class StepFailure:
    """What failed in one step, and whom it ended (engine/fault_isolation.py)."""

    step_id: int
    phase: str  # where the first failing part failed: execute | update
    error: Exception  # that part's exception
    request_ids: tuple[str, ...]  # ended with ERROR, in batch order (none: every part
    # ran when retried, a transient fault)
    num_succeeded: int  # requests of the step whose part ran and was applied

    @property
    def whole_step(self) -> bool:
        """Nothing in the step ran: what makes a run of failures a sick engine."""
        return self.num_succeeded == 0

    @property
    def detail(self) -> str:
        return failure_detail(self.phase, self.error)


def failure_detail(phase: str, error: Exception) -> str:
    """A failed request's finish detail: what failed, never the exception's text (it can
    carry internals); the server log has the traceback."""
    return f"{STEP_FAILED}: {phase} raised {type(error).__name__}"


@dataclass(slots=True)
class StepRun:
    """What schedule -> execute -> update did in one step (Engine.run_step), before any
    telemetry is made of it. marks: time.perf_counter() after schedule, execute, update."""

    out: SchedulerOutput
    decisions: SchedulingDecisions
    rows: list[Request]  # requests that got a token
    sampled: list[int]  # their tokens, row order
    finished: list[Request]  # ended in this step (already out of the engine's requests)
    failure: StepFailure | None
    end: float  # engine clock when the step's work was done
    marks: tuple[float, float, float]


@dataclass
class StepOutput:
    """What one step changed.

    `deltas` (per request: new tokens, finish reason) are built on first access from the
    sample rows, so the step itself creates no per-token objects.
    """

    record: StepRecord | None  # None when there was nothing to do
    ended: list[RequestDelta] = field(default_factory=list)  # aborts, timeouts before it
    finished: list[RequestRecord] = field(default_factory=list)
    admissions: list[AdmissionDecision] = field(default_factory=list)  # since the last step
    rows: list[Request] = field(default_factory=list)  # requests that got a token
    sampled: list[int] = field(default_factory=list)  # their tokens, row order
    stop_reasons: dict[str, str] = field(default_factory=dict)  # rows that ended with it
    failure: StepFailure | None = None  # part of the batch failed; its requests ended
    _deltas: list[RequestDelta] | None = None

    @property
    def deltas(self) -> list[RequestDelta]:
        if self._deltas is None:
            reasons = self.stop_reasons
            self._deltas = self.ended + [
                RequestDelta(req.request_id, [token], reasons.get(req.request_id))
                for req, token in zip(self.rows, self.sampled, strict=True)]
        return self._deltas
