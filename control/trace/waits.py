"""Why each request waited: queue waits and re-queues after preemption, by reason.

The scheduler says, once per step, why each lane with queued requests started no more
(`StepRecord.decisions.waiting_reason_by_lane`: token_budget, max_num_seqs, kv_high_watermark, ...).
That reason holds from this step's start to the next step's start. Per lane we keep the
running sum of seconds under each reason; a wait's breakdown is the difference of that sum
between its end and the first step that saw it. Time before that first step (the step
cadence, not a limit) is `until_next_step`. A first wait starts when the request reached
the server (`AdmissionDecision.arrival_time`), not when the engine thread admitted it: the
time between is `tokenize` (the server tokenizing and templating it) and `engine_busy`
(the rest: mostly the engine thread finishing the step it was in before it took the
request), so the reasons add up to the queue delay. Cost: O(lanes) per step, O(1) per
request.

Runs on the trace writer's thread, fed the records in step order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.records import AdmissionDecision, RequestRecord, StepRecord

BEFORE_FIRST_STEP = "until_next_step"
TOKENIZE = "tokenize"  # arrival -> admission: tokenizing and templating the prompt
ENGINE_BUSY = "engine_busy"  # arrival -> admission, the rest: the engine thread was busy
STALE_AFTER_S = 3600.0  # forget a wait no record closed for this long (dropped records)


@dataclass(slots=True)
class _Wait:
    kind: str  # queued | requeued
    lane: str
    since: float
    snapshot: dict[str, float] | None = None  # lane sums at the first step that saw it
    before: dict[str, float] | None = None  # seconds from arrival to admission, by reason


@dataclass(slots=True)
class WaitRow:
    request_id: str
    kind: str
    lane: str
    tenant: str
    priority: int
    start: float
    end: float
    reasons: dict[str, float]

    @property
    def wait_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def main_reason(self) -> str:
        return max(self.reasons, key=self.reasons.__getitem__) if self.reasons else ""


@dataclass
class WaitTracker:
    sums: dict[str, dict[str, float]] = field(default_factory=dict)  # lane -> reason -> s
    open: dict[str, _Wait] = field(default_factory=dict)  # request id -> its open wait
    unseen: list[str] = field(default_factory=list)  # open waits no step has seen yet
    totals: dict[str, dict[str, float]] = field(default_factory=dict)  # closed, by request
    preempted_s: dict[str, float] = field(default_factory=dict)
    who: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # lane, tenant, prio
    requeued: set[str] = field(default_factory=set)  # open waits of kind requeued
    _last_start: float | None = None
    _last_reasons: dict[str, str] = field(default_factory=dict)

    def on_admission(self, decision: AdmissionDecision) -> None:
        if decision.accepted:
            self.who[decision.request_id] = (decision.lane, decision.tenant, decision.priority)
            arrival = decision.time if decision.arrival_time is None else min(
                decision.arrival_time, decision.time)
            self._open(decision.request_id, "queued", decision.lane, arrival,
                       before_admission(decision.time - arrival, decision.tokenize_s))

    def on_step(self, record: StepRecord) -> list[WaitRow]:
        """Advance the sums to this step's start, then close the waits it ended."""
        now = record.start_time
        if self._last_start is not None:
            dt = max(0.0, now - self._last_start)
            for lane, reason in self._last_reasons.items():
                sums = self.sums.setdefault(lane, {})
                sums[reason] = sums.get(reason, 0.0) + dt
        self._last_start, self._last_reasons = now, record.decisions.waiting_reason_by_lane
        for rid in self.unseen:
            wait = self.open.get(rid)
            if wait is not None:
                wait.snapshot = dict(self.sums.get(wait.lane, {}))
        self.unseen.clear()
        rows = [self._close(rid, now) for rid in record.decisions.admitted if rid in self.open]
        started = {rid for rid, _ in record.prefill_chunks} if (
            self.requeued or record.decisions.preempted) else set()
        rows += [self._close(rid, now) for rid in list(self.requeued) if rid in started]
        # re-queued from this step's start (unless restarted)
        for rid in record.decisions.preempted:
            if rid not in started:
                lane = self.who.get(rid, ("", "", 0))[0]
                self.open[rid] = _Wait("requeued", lane, now, dict(self.sums.get(lane, {})))
                self.requeued.add(rid)
        return rows

    def on_finished(self, rec: RequestRecord) -> tuple[WaitRow | None, float, dict[str, float]]:
        """Close a wait the request ended in (timeout, cancel); then its preempted seconds
        and its wait seconds by reason, over its whole life."""
        row = None
        if rec.request_id in self.open:
            row = self._close(rec.request_id, rec.finished_time or 0.0)
        self.who.pop(rec.request_id, None)
        return (row, self.preempted_s.pop(rec.request_id, 0.0),
                self.totals.pop(rec.request_id, {}))

    def purge(self, now: float) -> int:
        """Forget waits older than STALE_AFTER_S whose end never arrived; how many."""
        stale = [rid for rid, w in self.open.items() if now - w.since > STALE_AFTER_S]
        for rid in stale:
            del self.open[rid]
            self.requeued.discard(rid)
            self.who.pop(rid, None)
            self.totals.pop(rid, None)
            self.preempted_s.pop(rid, None)
        return len(stale)

    # ---- internals -----------------------------------------------------------------
    def _open(self, rid: str, kind: str, lane: str, since: float,
              before: dict[str, float] | None = None) -> None:
        self.open[rid] = _Wait(kind, lane, since, before=before)
        self.unseen.append(rid)

    def _close(self, rid: str, end: float) -> WaitRow:
        wait = self.open.pop(rid)
        self.requeued.discard(rid)
        reasons: dict[str, float] = dict(wait.before) if wait.before else {}
        if wait.snapshot is not None:
            for reason, total in self.sums.get(wait.lane, {}).items():
                spent = total - wait.snapshot.get(reason, 0.0)
                if spent > 1e-9:
                    reasons[reason] = spent
        else:
            self.unseen.remove(rid)
        rest = (end - wait.since) - sum(reasons.values())
        if rest > 1e-9:
            reasons[BEFORE_FIRST_STEP] = rest
        _, tenant, priority = self.who.get(rid, ("", "", 0))
        row = WaitRow(rid, wait.kind, wait.lane, tenant, priority, wait.since, end, reasons)
        totals = self.totals.setdefault(rid, {})
        for reason, seconds in reasons.items():
            totals[reason] = totals.get(reason, 0.0) + seconds
        if wait.kind == "requeued":
            self.preempted_s[rid] = self.preempted_s.get(rid, 0.0) + row.wait_s
        return row


def before_admission(gap_s: float, tokenize_s: float) -> dict[str, float] | None:
    """Arrival -> admission (`gap_s`) by reason: `tokenize`, then `engine_busy` for the
    rest; None when there was no gap (the request came in through the engine's API)."""
    tokenize_s = min(max(0.0, tokenize_s), gap_s)
    parts = {TOKENIZE: tokenize_s, ENGINE_BUSY: gap_s - tokenize_s}
    return {k: v for k, v in parts.items() if v > 1e-9} or None
