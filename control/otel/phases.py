"""Each traced request's phases, rebuilt from the step records the DuckDB trace is made of:
no second clock, every time is a step's or the request's own (engine clock, seconds).

    arrival -tokenize- -queued- -prefill- -decode- (preempted) -queued- -prefill- ... finished
                       reasons   chunks,             requeued     recompute
                                 one a step

A run starts at the start of the first step that scheduled the request (its queued wait
ends there, control/trace/waits.py) and ends at the start of the step that preempted it, or
at its finish. Within a run, prefill lasts until the end of its last prefill chunk's step
(the step that sampled the first token of the run) and decode is the rest. So the phases
tile [arrival, finished]: their durations add up to the request's E2E.

Runs on the OpenTelemetry feed's thread (control/otel/feed.py), fed in step order. Cost per
step: O(prefill chunks + preemptions + admissions), not O(running requests): decodes are
counted at the finish from the record's token times. A run starts at a prefill chunk (a
(re)started request computes at least its last prompt token). Memory: O(prefill chunks)
per live request, at most MAX_CHUNKS each; forgotten after STALE_AFTER_S without a finish
(its record was dropped).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from control.trace.waits import STALE_AFTER_S, WaitRow, WaitTracker
from engine.records import AdmissionDecision, RequestRecord, StepRecord

MAX_CHUNKS = 256  # prefill chunk spans kept per request; more are counted, not kept


@dataclass(slots=True)
class Chunk:
    step_id: int
    start: float
    end: float
    tokens: int


@dataclass(slots=True)
class Run:
    """One stretch of running, from the step that (re)started it."""

    start: float
    config_version: int
    chunks: list[Chunk] = field(default_factory=list)
    prefill_end: float | None = None  # end of its last prefill chunk's step
    decode_steps: int = 0  # tokens sampled after its prefill (set at the finish)
    end: float | None = None  # the preempting step's start, or the finish
    preempted_at_step: int | None = None


@dataclass(slots=True)
class RequestPhases:
    arrival: float
    tokenize_s: float
    seen_at: float  # engine clock of the admission (staleness)
    runs: list[Run] = field(default_factory=list)
    waits: list[WaitRow] = field(default_factory=list)
    chunks_dropped: int = 0
    running: bool = False

    @property
    def current(self) -> Run | None:
        return self.runs[-1] if self.running else None


def count_decodes(runs: list[Run], token_times: tuple[float, ...]) -> None:
    """Each run's decode steps: its tokens sampled after its prefill's step. A token carries
    its step's end time and the prefill's token its own step's, so none is counted twice;
    counted at the finish from the record instead of a pass over every step's decodes."""
    for run in runs:  # token_times ascend: two bisections, not a pass over the tokens
        after = run.prefill_end if run.prefill_end is not None else run.start
        end = run.end if run.end is not None else float("inf")
        run.decode_steps = bisect_right(token_times, end) - bisect_right(token_times, after)


@dataclass
class PhaseTracker:
    live: dict[str, RequestPhases] = field(default_factory=dict)
    waits: WaitTracker = field(default_factory=WaitTracker)

    def on_admission(self, decision: AdmissionDecision) -> None:
        self.waits.on_admission(decision)
        arrival = decision.time if decision.arrival_time is None else min(
            decision.arrival_time, decision.time)
        self.live[decision.request_id] = RequestPhases(arrival, decision.tokenize_s,
                                                       decision.time)

    def on_step(self, record: StepRecord) -> None:
        for row in self.waits.on_step(record):
            phases = self.live.get(row.request_id)
            if phases is not None:
                phases.waits.append(row)
        for rid in record.decisions.preempted:
            phases = self.live.get(rid)
            if phases is not None and phases.running:
                run = phases.runs[-1]
                run.end, run.preempted_at_step = record.start_time, record.step_id
                phases.running = False
        for rid, tokens in record.prefill_chunks:
            run = self._run(rid, record)
            if run is None:
                continue
            run.prefill_end = record.end_time
            if len(run.chunks) < MAX_CHUNKS:
                run.chunks.append(Chunk(record.step_id, record.start_time, record.end_time,
                                        tokens))
            else:
                self.live[rid].chunks_dropped += 1

    def on_finished(self, rec: RequestRecord) -> RequestPhases | None:
        """The request's phases, closed at its finish; None if its admission was never
        seen (the feed started after it, or dropped it)."""
        row, _, _ = self.waits.on_finished(rec)
        phases = self.live.pop(rec.request_id, None)
        if phases is None:
            return None
        if row is not None:
            phases.waits.append(row)
        if phases.running:
            phases.runs[-1].end = rec.finished_time
            phases.running = False
        count_decodes(phases.runs, rec.token_times)
        return phases

    def purge(self, now: float) -> int:
        """Forget requests admitted more than STALE_AFTER_S ago that never finished."""
        self.waits.purge(now)
        stale = [rid for rid, p in self.live.items() if now - p.seen_at > STALE_AFTER_S]
        for rid in stale:
            del self.live[rid]
        return len(stale)

    def _run(self, rid: str, record: StepRecord) -> Run | None:
        phases = self.live.get(rid)
        if phases is None:
            return None
        if not phases.running:
            phases.runs.append(Run(record.start_time, record.config_version))
            phases.running = True
        return phases.runs[-1]
