"""Goodput-aware step sizing: each step's time target, chosen for the requests that can still
meet their lane's SLO (engine/config/slo.py), from the start-up step law.

A step of target T (real seconds) runs about HEADROOM * T; of its law time
HEADROOM * T / slowdown, the fixed cost and the running set's decodes (F, law seconds) come
first and the rest computes prompts. So the queue's prompts advance at

    rate(T) = (HEADROOM * T / slowdown - F) / (HEADROOM * T)     law seconds per second

which grows with T (the fixed cost and the decodes are paid once per step, whatever its
size): bigger steps clear a queue faster, smaller ones give each stream its next token
sooner. The queue's work is its prompts' law cost (`StepLaw.chunk_s` from 0: the same
however a prompt is chunked), in arrival order (the lanes serve first come first), after
the running set's unfinished prompts. The k-th queued request with a TTFT target meets it
when the work up to it is done by its deadline (arrival + ttft_s): it needs rate
work_k / (deadline_k - now). Each step:

- `target`: every queued request meets its TTFT at the base target (or none waits): keep
  steps at target_step_ms (small steps: the streams' TPOT and new arrivals' TTFT);
- `grow_for_slo`: some need a faster rate than the base step gives, and a bigger one gives
  it: the smallest T whose rate is GROWTH_MARGIN x the fastest any of them needs;
- `grow_for_throughput`: some would miss their TTFT even at the largest step allowed: the
  queue is past what the device clears in time, so the step grows to that largest step
  (the most work per second) rather than paying the fixed cost many times for small steps.

The largest step allowed is the tightest TPOT target of the running streams (a step is a
token of every stream), and at most MAX_GROWTH x the base target. A grown step's token
budgets (those fitted at start-up, never the operator's) grow by the same factor, up to
the built-in defaults. Admission sheds (or, with slo_unreachable: defer, defers) a request
the queue ahead of it already keeps from its TTFT at the largest step (`slo_estimates.py`;
engine/lanes/admission.py), and a prompt whose prefill alone misses the default lane's TTFT
goes to the long-context lane where that lane's target allows it (`slo_lane`): in the
default lane it would miss anyway and hold up every request behind it that can still make
theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.calibration.step_law import StepLaw
from engine.config import LiveConfig
from engine.lanes.queues import LaneSet
from engine.request import Request
from engine.scheduling.state import SchedulerState
from engine.scheduling.step_time import HEADROOM

MAX_GROWTH = 8.0  # a step's target grows to at most this many times target_step_ms
GROWTH_MARGIN = 1.2  # the rate asked of a grown step, over the fastest one a request needs


@dataclass(frozen=True)
class StepTarget:
    """One step's time target (real seconds, before HEADROOM and the slowdown) and why."""

    seconds: float
    growth: float  # seconds / the base target (>= 1)
    reason: str  # target | grow_for_slo | grow_for_throughput | fixed


@dataclass(frozen=True)
class QueueModel:
    """The step-size arithmetic of the module docstring for one moment's running set."""

    law: StepLaw
    slowdown: float  # measured / predicted step time, >= 1 (LawSlowdown)
    base_s: float  # target_step_ms / 1000
    cap_s: float  # the largest step allowed (>= base_s)
    overhead_s: float  # F: the fixed cost and the running set's decodes, law seconds
    ahead_s: float  # the running set's unfinished prompts, deferred ones not, law seconds

    @classmethod
    def of(cls, law: StepLaw, slowdown: float, base_s: float, running: list[Request],
           live: LiveConfig, lanes: LaneSet) -> QueueModel:
        context = 0
        ahead = 0.0
        tpot_cap = math.inf
        for req in running:
            context += len(req.token_ids)
            if req.num_computed_tokens < req.num_prompt_tokens and not req.slo_deferred:
                # (a deferred prompt under way runs after the queue: Scheduler.schedule)
                ahead += law.chunk_s(req.num_computed_tokens,
                                     req.num_tokens - req.num_computed_tokens)
            tpot = live.lane_slo(lanes[req.lane].config).tpot_s if req.lane in lanes.lanes \
                else None
            if tpot is not None:
                tpot_cap = min(tpot_cap, tpot)
        overhead = law.fixed_s + law.token_s * len(running) + law.decode_kv_s * context
        cap = min(MAX_GROWTH * base_s, max(base_s, tpot_cap))
        return cls(law, slowdown, base_s, cap, overhead, ahead)

    def rate(self, step_s: float) -> float:
        """Law seconds of prompts computed per real second at steps of `step_s`."""
        run_s = HEADROOM * step_s
        return max(0.0, run_s / self.slowdown - self.overhead_s) / run_s

    def step_for_rate(self, rate: float) -> float:
        """The smallest step whose `rate` is at least `rate` (inf if none is)."""
        room = 1.0 / self.slowdown - rate
        return self.overhead_s / (HEADROOM * room) if room > 0 else math.inf

    def choose(self, queue: list[tuple[float, float]], now: float) -> StepTarget:
        """`queue`: (TTFT deadline, prompt work in law seconds) of the queued requests with
        a TTFT target, in the order they will start."""
        base_rate, best_rate = self.rate(self.base_s), self.rate(self.cap_s)
        work, needed, missed = self.ahead_s, 0.0, False
        for deadline, cost in queue:
            work += cost
            slack = deadline - now
            rate = work / slack if slack > 0 else math.inf
            if rate > best_rate:
                missed = True
            elif rate > needed:
                needed = rate
        if missed:
            return self._target(self.cap_s, "grow_for_throughput")
        if needed <= base_rate:
            return self._target(self.base_s, "target")
        step = self.step_for_rate(min(GROWTH_MARGIN * needed, best_rate))
        return self._target(min(max(step, self.base_s), self.cap_s), "grow_for_slo")

    def alone_ttft_s(self, req: Request) -> float:
        """req's TTFT on an idle device at the largest step: its prompt alone."""
        return alone_ttft_s(self.law, self.slowdown, self.base_s, req.num_tokens)


    def predicted_ttft_s(self, req: Request, lane_work: dict[str, float],
                         weights: dict[str, float], now: float,
                         ahead_in_lane: float = 0.0) -> float:
        """req's TTFT at the largest step: its wait so far, then the running prompts, its
        lane's queue and its own prompt, and what the other lanes run meanwhile by fair
        share (each its queue, at most its weight's share of req's lane's work).
        `lane_work`: queued work by lane (law seconds; `queue_work`), `weights`: by lane;
        `ahead_in_lane`: more work of its lane ahead of it (law seconds)."""
        own = (lane_work.get(req.lane, 0.0) + ahead_in_lane
               + self.law.chunk_s(0, req.num_tokens))
        weight = weights[req.lane]
        others = sum(min(work, own * weights[name] / weight)
                     for name, work in lane_work.items() if name != req.lane)
        rate = self.rate(self.cap_s)
        work = self.ahead_s + own + others
        waited = max(0.0, now - req.arrival_time)
        return waited + (work / rate if rate > 0 else math.inf)

    def _target(self, seconds: float, reason: str) -> StepTarget:
        return StepTarget(seconds, seconds / self.base_s, reason)


def alone_ttft_s(law: StepLaw, slowdown: float, base_s: float, num_tokens: int) -> float:
    """A prompt's TTFT on an idle device at the largest step (MAX_GROWTH x base_s)."""
    idle = QueueModel(law, slowdown, base_s, MAX_GROWTH * base_s, law.fixed_s, 0.0)
    rate = idle.rate(idle.cap_s)
    return law.chunk_s(0, num_tokens) / rate if rate > 0 else math.inf


def ttft_queue(law: StepLaw, live: LiveConfig, lanes: LaneSet) -> list[tuple[float, float]]:
    """The queued requests with a TTFT target as (deadline, prompt work in law seconds), in
    the order they start: those that can still meet the target by arrival (deadline:
    arrival + ttft_s), then the deferred ones (deadline: their queue timeout, past which
    they are never served)."""
    entries: list[tuple[bool, float, float, float]] = []  # (deferred, arrival, deadline, work)
    for lane in lanes:
        ttft = live.lane_slo(lane.config).ttft_s
        if ttft is None or not lane.num_waiting:
            continue
        timeout_s = lane.queue_timeout_s(live)
        for req in lane.waiting_requests():
            if req.first_token_time is None:  # (a preempted one has had its first token)
                wait = timeout_s if req.slo_deferred else ttft
                entries.append((req.slo_deferred, req.arrival_time, req.arrival_time + wait,
                                law.chunk_s(0, req.num_tokens)))
    entries.sort()
    return [(deadline, cost) for _, _, deadline, cost in entries]


# The built-in budgets: a grown step's fitted budgets grow up to these, never past.
_DEFAULTS = LiveConfig()
GROWN_TOKENS_CEILING = _DEFAULTS.max_num_batched_tokens
GROWN_CHUNK_CEILING = _DEFAULTS.prefill_chunk_size


def choose_step_target(state: SchedulerState, now: float) -> StepTarget | None:
    """This step's time target by the live step_policy; None without a step law (or with
    chunked prefill off): then the budgets alone bound the step."""
    law, live = state.step_law, state.live
    base_s = state.static.target_step_ms / 1000
    if law is None or base_s <= 0 or not live.chunked_prefill:
        return None
    if live.step_policy == "fixed":
        return StepTarget(base_s, 1.0, "fixed")
    model = QueueModel.of(law, state.law_slowdown.value, base_s, state.running, live,
                          state.lanes)
    return model.choose(ttft_queue(law, live, state.lanes), now)


def grown_budgets(state: SchedulerState, growth: float) -> tuple[int, int]:
    """(max_num_batched_tokens, prefill chunk) of a step grown `growth` times: the budgets
    the start-up fit chose grow with it, up to the built-in defaults; the operator's never."""
    live = state.live
    tokens, chunk = live.max_num_batched_tokens, state.chunk_size(live)
    if growth <= 1.0:
        return tokens, chunk
    if "max_num_batched_tokens" in state.growable_budgets:
        tokens = max(tokens, min(GROWN_TOKENS_CEILING, math.ceil(tokens * growth)))
    if "prefill_chunk_size" in state.growable_budgets and live.chunked_prefill:
        grown = min(GROWN_CHUNK_CEILING, state.static.max_model_len, math.ceil(chunk * growth))
        chunk = max(chunk, min(grown, tokens))
    return tokens, chunk


def slo_lane(state: SchedulerState, lane: str, num_prompt_tokens: int, tenant: str) -> str:
    """The lane routing chose (`lane`), or the long-context lane for a prompt that routing
    sent to the default lane by its length but whose prefill alone takes longer than the
    default lane's TTFT target, where the long-context lane's target allows it: such a
    request cannot meet the default lane's SLO anyway, and served there it would hold up
    every request behind it that can (on this CPU a 4,000-token prompt takes ~14 s alone
    against the interactive lane's 5 s). Only under the goodput policy with a step law; a
    tenant the config maps to a lane stays there."""
    live, law = state.live, state.step_law
    target = live.long_context_lane
    base_s = state.static.target_step_ms / 1000
    if (law is None or base_s <= 0 or live.step_policy != "goodput" or target is None
            or lane != live.default_lane or target not in state.lanes.lanes
            or any(name == tenant for name, _ in live.tenant_lanes)):
        return lane
    own = live.lane_slo(state.lanes[lane].config).ttft_s
    alone = alone_ttft_s(law, state.law_slowdown.value, base_s, num_prompt_tokens)
    if own is None or alone <= own:
        return lane
    theirs = live.lane_slo(state.lanes[target].config).ttft_s
    return target if theirs is None or alone <= theirs else lane


def describe_policy(live: LiveConfig, has_law: bool, target_step_ms: int) -> str:
    """One line for the ready banner: how this server sizes its steps, and for what SLOs."""
    if not has_law:
        return ("steps: sized by the token budgets alone (no start-up step law: budgets set"
                " in the config, chunked prefill off, or target_step_ms 0)")
    if live.step_policy == "fixed":
        return f"steps: held to target_step_ms {target_step_ms} ms (step_policy fixed)"
    slos = ", ".join(f"{lane.name} {live.lane_slo(lane).describe('/')}" for lane in live.lanes)
    return (f"steps: goodput policy from {target_step_ms} ms up to {MAX_GROWTH:g}x for the"
            f" lanes' SLOs ({slos}); slo_unreachable {live.slo_unreachable}")

