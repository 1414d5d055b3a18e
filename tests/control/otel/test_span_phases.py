"""A request's phases (control/otel/phases.py) and the spans built from them
(control/otel/spans.py), fed plain step records: a preempted request's runs end where the
preempting step starts, the phase spans tile arrival -> finish, the restarted prefill is
marked as a recompute, the preemption is an event on the request's span, and only requests
whose finish never came are forgotten."""

from __future__ import annotations

import dataclasses

from opentelemetry.sdk.resources import Resource

from control.otel.phases import PhaseTracker
from control.otel.spans import SpanBuilder, ns
from control.trace.waits import STALE_AFTER_S
from engine.records import AdmissionDecision, RequestRecord, SchedulingDecisions, StepRecord
from engine.request import TraceLink

T0 = 1000.0  # engine clock of the request's arrival
LINK = TraceLink("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def _required(cls) -> dict:
    return {f.name: 0 for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def step(step_id: int, start: float, *, prefill=(), decode=(), admitted=(),
         preempted=()) -> StepRecord:
    """One step of T0 + start .. T0 + start + 0.5."""
    filled = _required(StepRecord)
    filled.update(step_id=step_id, start_time=T0 + start, end_time=T0 + start + 0.5,
                  duration_s=0.5, running_by_lane={}, waiting_by_lane={}, finished=[],
                  config_version=1, decode_ids=list(decode), prefill_chunks=list(prefill),
                  decisions=SchedulingDecisions(admitted=list(admitted),
                                                preempted=list(preempted)))
    return StepRecord(**filled)


def admission(rid: str, at: float) -> AdmissionDecision:
    return AdmissionDecision(True, rid, lane="interactive", time=T0 + at, arrival_time=T0 + at)


def finished(rid: str, at: float, token_times: tuple[float, ...]) -> RequestRecord:
    filled = _required(RequestRecord)
    filled.update(request_id=rid, lane="interactive", tenant="default", status="FINISHED",
                  finish_reason="length", finish_detail="", arrival_time=T0,
                  finished_time=T0 + at, e2e_s=at, num_output_tokens=len(token_times),
                  token_times=tuple(T0 + t for t in token_times))
    return RequestRecord(**filled, trace=LINK)


def preempted_once() -> tuple[RequestRecord, object]:
    """Arrives at 0; prefill at step 1, a decode at step 2, preempted by step 3, recomputed
    at step 4, a last decode at step 5; finished at 5.5."""
    tracker = PhaseTracker()
    tracker.on_admission(admission("r", 0.0))
    for record in (step(1, 1.0, prefill=[("r", 8)], admitted=["r"]),
                   step(2, 2.0, decode=["r"]),
                   step(3, 3.0, preempted=["r"]),
                   step(4, 4.0, prefill=[("r", 10)]),
                   step(5, 5.0, decode=["r"])):
        tracker.on_step(record)
    rec = finished("r", 5.5, (1.5, 2.5, 4.5, 5.5))
    return rec, tracker.on_finished(rec)


def test_a_preempted_run_ends_where_the_preempting_step_starts():
    rec, phases = preempted_once()
    first, second = phases.runs
    assert (first.start, first.end, first.preempted_at_step) == (T0 + 1.0, T0 + 3.0, 3)
    assert (second.start, second.end, second.preempted_at_step) == (T0 + 4.0, T0 + 5.5, None)
    assert [(w.kind, w.start, w.end) for w in phases.waits] == [
        ("queued", T0, T0 + 1.0), ("requeued", T0 + 3.0, T0 + 4.0)]
    assert [run.decode_steps for run in phases.runs] == [1, 1]


def test_the_phase_spans_of_a_preempted_request_tile_it_and_mark_the_recompute():
    rec, phases = preempted_once()
    root, *children = SpanBuilder(Resource.create({})).build(rec, phases)
    own = root.context.span_id
    tiles = sorted((s for s in children if s.parent.span_id == own), key=lambda s: s.start_time)
    assert [s.name for s in tiles] == ["queued", "prefill", "decode", "queued", "prefill",
                                       "decode"]
    assert tiles[0].start_time == root.start_time and tiles[-1].end_time == root.end_time
    for before, after in zip(tiles, tiles[1:], strict=False):
        assert after.start_time == before.end_time, (before.name, after.name)
    assert tiles[2].end_time == ns(T0 + 3.0)  # the first run's decode ends at step 3's start
    prefills = [s for s in tiles if s.name == "prefill"]
    assert [s.attributes["batchpilot.recompute"] for s in prefills] == [False, True]
    assert [s.attributes["batchpilot.wait.kind"] for s in tiles if s.name == "queued"] == [
        "queued", "requeued"]
    (event,) = root.events
    assert event.name == "batchpilot.preempted" and event.timestamp == ns(T0 + 3.0)
    assert event.attributes["batchpilot.step_id"] == 3


def test_only_requests_admitted_longer_ago_than_the_stale_limit_are_forgotten():
    tracker = PhaseTracker()
    tracker.on_admission(admission("old", 0.0))
    tracker.on_admission(admission("live", 10.0))
    assert tracker.purge(T0 + 5.0 + STALE_AFTER_S) == 1
    assert tracker.on_finished(finished("old", 1.0, ())) is None  # forgotten: no phases
    assert tracker.on_finished(finished("live", 11.0, ())) is not None
