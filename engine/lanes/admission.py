"""Admission control: accept a request at arrival, or reject it now with a reason.

Each rule is a small function returning a rejection or None; they run in order and the
first rejection wins. Rejections are returned to the caller and recorded, never silent.

Deadline rule: a request's deadline is the time by which it must be done (its last token).
It is refused (`deadline`) when even an optimistic estimate of its time to finish passes
the deadline: the wait for its first token (queued tokens ahead of it in its lane, plus its
own prompt, at the lane's share of the measured throughput), then its other max_tokens - 1
tokens at the whole measured throughput (a lower bound: a request decodes at most one
token a step, and a step serves others too). Optimistic on purpose, so only what cannot
make it is refused; one admitted that falls behind ends at its deadline with the tokens it
has (TIMEOUT, "deadline passed while running": `engine/scheduling/deadlines.py`). Before the first
step has measured a throughput, nothing is estimated: only a deadline already past is
refused.

SLO rule, with a step law and step_policy goodput: a request whose lane's TTFT target the
goodput model rules out (its TTFT at the largest step and its lane's fair share, behind the
queued requests that can still meet theirs: engine/scheduling/goodput.py) is handled as
`slo_unreachable` says. `shed` (the default) refuses it (`slo_unreachable`): served, it
would miss its SLO and take the time of requests that can still meet theirs. `defer`
admits it deferred (reason `slo_deferred`): behind every request of its lane that is not,
shorter prompts first, its prompt computed with what their steps leave; it is refused only
when, so queued, it would not start within its queue timeout, by the queue as it stands or
by the device time deferred requests have lately got (engine/scheduling/spare_rate.py).
Deferral finishes more requests, late; at twice the Azure replay's rate on this CPU it met
as many SLOs as shedding (bench/RESULTS.md, "Clients that send again"). `serve` admits it
in its place. Retry-After is the estimated excess. A request its client sends again after
a refusal (`Request.resent`, the SDKs' X-Stainless-Retry-Count) is past its target
already, by its user's clock: under `shed` and `defer` it is deferred, whatever the queue
(bench/RESULTS.md, "Clients that send again").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.config import LiveConfig, StaticConfig
from engine.lanes.queues import LaneSet
from engine.records import AdmissionDecision
from engine.request import Request


class ThroughputEstimator:
    """Tokens per second while busy: exponentially decayed tokens / decayed step time."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, num_tokens: int, duration_s: float) -> None:
        if num_tokens <= 0 or duration_s <= 0:
            return
        self._tokens = self._tokens * self.decay + num_tokens
        self._seconds = self._seconds * self.decay + duration_s

    @property
    def tokens_per_s(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None


@dataclass(frozen=True)
class AdmissionContext:
    live: LiveConfig
    static: StaticConfig
    lanes: LaneSet
    kv_usage: float
    tokens_per_s: float | None
    now: float
    running: Sequence[Request] = ()  # the scheduler's running set (read only)
    # req, now -> its TTFT by the goodput model (engine/scheduling/goodput.py), None: none
    predicted_ttft_s: Callable[[Request, float], float | None] | None = None
    # req, now -> when it would start, deferred (slo_estimates.deferred_start_s), None: unknown
    deferred_start_s: Callable[[Request, float], float | None] | None = None


def estimated_wait_s(req: Request, ctx: AdmissionContext) -> float | None:
    """Seconds until req's prompt is computed, at its lane's fair share; None if unknown."""
    if not ctx.tokens_per_s:
        return None
    lane = ctx.lanes[req.lane]
    weights = sum(q.config.weight for q in ctx.lanes if q.has_work or q is lane)
    share = lane.config.weight / weights
    return (lane.waiting_tokens + req.num_prompt_tokens) / (ctx.tokens_per_s * share)


Rule = Callable[[Request, AdmissionContext], AdmissionDecision | None]


def _reject(req: Request, reason: str, message: str, retry_after_s: float | None = None,
            wait: float | None = None) -> AdmissionDecision:
    return AdmissionDecision(False, req.request_id, reason, message, retry_after_s, req.lane,
                             wait, req.tenant, req.priority, req.num_prompt_tokens)


def check_empty(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    if req.num_prompt_tokens == 0:
        return _reject(req, "empty_prompt", "the prompt is empty: send at least one token")
    return None


def check_length(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    limit = ctx.static.max_model_len
    want = req.num_prompt_tokens + req.sampling_params.max_tokens
    if want > limit:
        return _reject(req, "too_long",
                       f"this model's maximum context length is {limit} tokens, but the request"
                       f" asks for {want} ({req.num_prompt_tokens} in the prompt,"
                       f" {req.sampling_params.max_tokens} in max_tokens)")
    return None


def check_kv_capacity(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    """A request the whole KV pool cannot hold would be preempted and restarted forever."""
    capacity = ctx.static.num_kv_blocks * ctx.static.block_size
    want = req.num_prompt_tokens + req.sampling_params.max_tokens
    if want > capacity:
        return _reject(req, "too_long",
                       f"the KV cache holds {capacity} tokens in all, but the request asks for"
                       f" {want} ({req.num_prompt_tokens} in the prompt,"
                       f" {req.sampling_params.max_tokens} in max_tokens)")
    return None


def check_kv(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    usage, limit = ctx.kv_usage, ctx.live.kv_cache_reject_watermark
    if usage > limit and ctx.lanes[req.lane].config.preempt_to_start:
        # NOTE: a preempt_to_start lane can take back what preempt_first lanes hold (the
        # scheduler preempts them for it), so that part does not count against it. Their
        # blocks are an upper bound (shared prefix blocks may stay): O(running), and only
        # above the reject watermark.
        usage -= reclaimable_blocks(ctx) / ctx.static.num_kv_blocks
    if usage > limit:
        return _reject(req, "kv_reject_watermark",
                       f"KV cache usage {ctx.kv_usage:.0%} is above the reject watermark"
                       f" {limit:.0%}; retry shortly", 1.0)
    return None


def reclaimable_blocks(ctx: AdmissionContext) -> int:
    """Blocks held by running requests of preempt_first lanes."""
    lanes = ctx.lanes.lanes
    return sum(len(r.block_ids) for r in ctx.running
               if r.lane in lanes and lanes[r.lane].config.preempt_first)


def check_queue(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    lane = ctx.lanes[req.lane]
    retry = _retry_after(req, ctx)
    if ctx.lanes.num_waiting >= ctx.live.max_waiting_requests:
        return _reject(req, "queue_full",
                       f"{ctx.lanes.num_waiting} requests are queued, the limit"
                       f" (max_waiting_requests) is {ctx.live.max_waiting_requests}", retry)
    limit = lane.config.max_waiting
    if limit is not None and lane.num_waiting >= limit:
        return _reject(req, "queue_full",
                       f"lane {lane.name!r} has {lane.num_waiting} requests queued, its limit"
                       f" (max_waiting) is {limit}", retry)
    return None


def check_deadline(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    """Refuse a request that cannot be done by its deadline (see the module docstring)."""
    if req.deadline is None:
        return None
    wait = estimated_wait_s(req, ctx) or 0.0  # unknown throughput: nothing estimated
    more = req.sampling_params.max_tokens - 1  # tokens after the first
    decode = more / ctx.tokens_per_s if ctx.tokens_per_s else 0.0
    if ctx.now + wait + decode > req.deadline:
        return _reject(req, "deadline",
                       f"the deadline is {max(0.0, req.deadline - ctx.now):.3f}s away but the"
                       f" estimated time to finish is {wait + decode:.3f}s ({wait:.3f}s to the"
                       f" first token, then {more} more tokens (max_tokens) in at least"
                       f" {decode:.3f}s); lower max_tokens or allow more time",
                       _retry_after(req, ctx), wait)
    return None


def check_slo(req: Request, ctx: AdmissionContext) -> AdmissionDecision | None:
    """A request whose lane's TTFT target the queue ahead of it already rules out, even at
    the largest step (engine/scheduling/goodput.py), by `slo_unreachable`: `shed` refuses
    it; `defer` admits it behind every request that can still meet its target while it
    would start before its queue timeout, and refuses it otherwise; `serve` admits it in
    its place. Served in its place it would miss its SLO and take the time of requests
    that can still meet theirs. A resent request (Request.resent) counts as past its
    target whatever the queue, under `shed` and `defer` alike: it is deferred (or refused
    as above). Its user has waited since a first send this server refused (the SDK waited
    out the Retry-After), so served in its place it takes the time of requests that can
    still meet their target; refused again, its client waits once more or gives up."""
    if ctx.live.slo_unreachable == "serve" or ctx.predicted_ttft_s is None:
        return None
    ttft = ctx.live.lane_slo(ctx.lanes[req.lane].config).ttft_s
    predicted = ctx.predicted_ttft_s(req, ctx.now) if ttft is not None else None
    if predicted is None:  # no target, or no model to predict by (no law, steps fixed)
        return None
    if req.resent and ctx.deferred_start_s is not None:
        return _defer(req, ctx, ttft, RESENT_WHY)  # its user's wait began before it came
    if predicted <= ttft:
        return None
    if ctx.live.slo_unreachable == "defer" and ctx.deferred_start_s is not None:
        return _defer(req, ctx, ttft)
    retry = max(1.0, round(predicted - ttft, 1)) if math.isfinite(predicted) else 1.0
    return _reject(req, "slo_unreachable",
                   f"lane {req.lane!r} aims at a first token within {ttft:g}s (slo.ttft_s)"
                   f" but the work queued ahead of this request takes an estimated"
                   f" {predicted:.1f}s at the fastest this server runs; retry later or"
                   " elsewhere", retry, predicted)


QUEUE_RULES_IT_OUT = "which the work queued ahead of this request rules out"
# Why a resent request is deferred whatever the queue (check_slo)
RESENT_WHY = ("which this request, sent again after a refusal (X-Stainless-Retry-Count),"
              " has been waiting for since its first send")


def _defer(req: Request, ctx: AdmissionContext, ttft: float,
           why: str = QUEUE_RULES_IT_OUT) -> AdmissionDecision:
    """Admit `req` deferred when it would start within its lane's queue timeout behind the
    requests that can still meet their target; else refuse it (slo_unreachable). `why`:
    how its target is out of reach, after "a first token within T s (slo.ttft_s), "."""
    timeout_s = ctx.lanes[req.lane].queue_timeout_s(ctx.live)
    start = ctx.deferred_start_s(req, ctx.now) if ctx.deferred_start_s else None
    aim = f"lane {req.lane!r} aims at a first token within {ttft:g}s (slo.ttft_s), {why}"
    if start is not None and start <= timeout_s:
        return _accept(req, ctx, deferred_why=(
            f"{aim}: it is served after the requests that can still meet it, shorter"
            f" prompts first, and starts in an estimated {start:.1f}s (queue timeout"
            f" {timeout_s:g}s)"))
    start = start if start is not None else math.inf
    retry = max(1.0, round(start - timeout_s, 1)) if math.isfinite(start) else 1.0
    return _reject(req, "slo_unreachable",
                   f"{aim}; queued behind the requests that can still meet it, it would start"
                   f" in an estimated {start:.1f}s, past the queue timeout ({timeout_s:g}s);"
                   " retry later or elsewhere", retry, start)


SLO_DEFERRED = "slo_deferred"  # an admission's reason: admitted behind those on time


def _accept(req: Request, ctx: AdmissionContext, deferred_why: str = "") -> AdmissionDecision:
    """Admitted; with `deferred_why`, deferred: behind the requests that can meet their
    target (the decision's reason SLO_DEFERRED, its message that text)."""
    return AdmissionDecision(True, req.request_id, SLO_DEFERRED if deferred_why else None,
                             deferred_why, lane=req.lane,
                             estimated_wait_s=estimated_wait_s(req, ctx), tenant=req.tenant,
                             priority=req.priority, num_prompt_tokens=req.num_prompt_tokens)


def _retry_after(req: Request, ctx: AdmissionContext) -> float:
    wait = estimated_wait_s(req, ctx)
    return max(1.0, round(wait, 1)) if wait is not None else 1.0


RULES: tuple[Rule, ...] = (check_empty, check_length, check_kv_capacity, check_kv, check_queue,
                           check_deadline, check_slo)


def admit(req: Request, ctx: AdmissionContext) -> AdmissionDecision:
    """The first rule that rejects decides; otherwise accept with the estimated wait."""
    if req.lane not in ctx.lanes.lanes:
        return _reject(req, "unknown_lane",
                       f"unknown lane {req.lane!r}; the lanes are: "
                       f"{', '.join(ctx.live.lane_names)}")
    for rule in RULES:
        decision = rule(req, ctx)
        if decision is not None:
            return decision
    return _accept(req, ctx)
