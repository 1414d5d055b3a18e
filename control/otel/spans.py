"""One finished request -> its spans: the request's own (continuing the caller's trace) and
a child per phase (control/otel/phases.py), as OpenTelemetry SDK spans ready to export.

Names and attributes follow the OpenTelemetry GenAI semantic conventions where they have
one (`gen_ai.*`, `server.*`, `error.type`); batchpilot's scheduler story is `batchpilot.*`.

    {operation} {model}                    SERVER, the request (arrival -> finished)
      tokenize                             arrival -> + tokenize time
      queued            batchpilot.wait.<reason>_s, batchpilot.wait.kind (queued | requeued)
      prefill           batchpilot.recompute when it follows a preemption
        prefill_chunk   batchpilot.step_id, batchpilot.tokens (one per step)
      decode            gen_ai.usage.output_tokens of the run
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from control.otel.context import new_span_id
from control.otel.phases import RequestPhases, Run
from control.otel.settings import ERROR_OUTCOMES
from control.trace.waits import TOKENIZE
from engine.records import RequestRecord
from engine.request import TraceLink

SCOPE = InstrumentationScope("batchpilot", "0.1.0")
SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def ns(t: float) -> int:
    """Engine-clock seconds (time.time()) -> the nanoseconds OTLP carries."""
    return int(round(t * 1e9))


class SpanBuilder:
    def __init__(self, resource: Resource, replica: str = ""):
        self.resource = resource
        self.replica = replica

    def build(self, rec: RequestRecord, phases: RequestPhases | None) -> list[ReadableSpan]:
        link = rec.trace
        assert link is not None
        trace_id = int(link.trace_id, 16)
        own = _context(trace_id, link.span_id)
        end = rec.finished_time if rec.finished_time is not None else rec.arrival_time
        spans = [self._span(self._name(link), own, _parent(trace_id, link), rec.arrival_time,
                            end, self._request_attributes(rec, phases), SpanKind.SERVER,
                            _status(rec), _events(phases))]
        if phases is not None:
            spans += self._phase_spans(trace_id, own, rec, phases, end)
        return spans

    # ---- the request ---------------------------------------------------------------------
    def _name(self, link: TraceLink) -> str:
        attrs = dict(link.attributes)
        operation = attrs.get("gen_ai.operation.name", "generate")
        return f"{operation} {attrs.get('gen_ai.request.model', '')}".strip()

    def _request_attributes(self, rec: RequestRecord, phases: RequestPhases | None,
                            ) -> dict[str, Any]:
        attrs: dict[str, Any] = dict(rec.trace.attributes)
        attrs.update({
            "gen_ai.response.id": rec.request_id,
            "gen_ai.usage.input_tokens": rec.num_prompt_tokens,
            "gen_ai.usage.output_tokens": rec.num_output_tokens,
            "gen_ai.response.finish_reasons": [rec.finish_reason or rec.outcome],
            "batchpilot.lane": rec.lane, "batchpilot.tenant": rec.tenant,
            "batchpilot.priority": rec.priority, "batchpilot.outcome": rec.outcome,
            "batchpilot.cached_tokens": rec.num_cached_tokens,
            "batchpilot.preemptions": rec.num_preemptions,
        })
        if rec.finish_detail:
            attrs["batchpilot.finish_detail"] = rec.finish_detail
        for name in ("queue_delay_s", "ttft_s", "tpot_s", "e2e_s"):
            value = getattr(rec, name)
            if value is not None:
                attrs[f"batchpilot.{name}"] = float(value)
        if self.replica:
            attrs["batchpilot.replica"] = self.replica
        if phases is not None and phases.runs:
            attrs["batchpilot.config_version"] = phases.runs[0].config_version
        if phases is not None and phases.chunks_dropped:
            attrs["batchpilot.prefill_chunks_not_traced"] = phases.chunks_dropped
        if rec.outcome in ERROR_OUTCOMES:
            attrs["error.type"] = rec.outcome
        return attrs

    # ---- its phases ------------------------------------------------------------------------
    def _phase_spans(self, trace_id: int, own: SpanContext, rec: RequestRecord,
                     phases: RequestPhases, end: float) -> list[ReadableSpan]:
        spans = []
        tokenized = phases.arrival + max(0.0, phases.tokenize_s)
        if phases.tokenize_s > 0:
            spans.append(self._child(trace_id, own, "tokenize", phases.arrival, tokenized, {}))
        for wait in phases.waits:
            start = max(wait.start, tokenized) if wait.kind == "queued" else wait.start
            reasons = {f"batchpilot.wait.{r}_s": round(s, 9) for r, s in wait.reasons.items()
                       if r != TOKENIZE}
            attrs = {"batchpilot.wait.kind": wait.kind, **reasons}
            if wait.main_reason and wait.main_reason != TOKENIZE:
                attrs["batchpilot.wait.main_reason"] = wait.main_reason
            spans.append(self._child(trace_id, own, "queued", start, wait.end, attrs))
        for i, run in enumerate(phases.runs):
            spans += self._run_spans(trace_id, own, run, i > 0, end)
        return spans

    def _run_spans(self, trace_id: int, own: SpanContext, run: Run, recompute: bool,
                   end: float) -> list[ReadableSpan]:
        run_end = run.end if run.end is not None else end
        spans = []
        decode_from = run.start
        if run.chunks:
            decode_from = min(run.prefill_end or run_end, run_end)
            prefill = self._child(trace_id, own, "prefill", run.start, decode_from,
                                  {"batchpilot.recompute": recompute,
                                   "batchpilot.chunks": len(run.chunks)})
            spans.append(prefill)
            spans += [self._child(trace_id, prefill.context, "prefill_chunk", c.start, c.end,
                                  {"batchpilot.step_id": c.step_id,
                                   "batchpilot.tokens": c.tokens}) for c in run.chunks]
        if run.decode_steps or run_end > decode_from:
            spans.append(self._child(trace_id, own, "decode", decode_from, run_end,
                                     {"batchpilot.decode_steps": run.decode_steps}))
        return spans

    def _child(self, trace_id: int, parent: SpanContext, name: str, start: float, end: float,
               attrs: dict[str, Any]) -> ReadableSpan:
        return self._span(name, _context(trace_id, new_span_id()), parent, start, max(start, end),
                          attrs, SpanKind.INTERNAL, Status(StatusCode.UNSET), ())

    def _span(self, name: str, context: SpanContext, parent: SpanContext | None, start: float,
              end: float, attrs: dict[str, Any], kind: SpanKind, status: Status,
              events: Iterable[Event]) -> ReadableSpan:
        return ReadableSpan(name, context=context, parent=parent, resource=self.resource,
                            attributes=attrs, events=tuple(events), kind=kind, status=status,
                            start_time=ns(start), end_time=ns(max(start, end)),
                            instrumentation_scope=SCOPE)


def _context(trace_id: int, span_id: str) -> SpanContext:
    return SpanContext(trace_id, int(span_id, 16), is_remote=False, trace_flags=SAMPLED)


def _parent(trace_id: int, link: TraceLink) -> SpanContext | None:
    if not link.parent_span_id:
        return None
    return SpanContext(trace_id, int(link.parent_span_id, 16), is_remote=True,
                       trace_flags=SAMPLED if link.sampled else TraceFlags(0))


def _status(rec: RequestRecord) -> Status:
    if rec.outcome in ERROR_OUTCOMES:
        return Status(StatusCode.ERROR, rec.finish_detail or rec.outcome)
    return Status(StatusCode.UNSET)


def _events(phases: RequestPhases | None) -> list[Event]:
    """One `preempted` event per preemption: when, and which step took the KV back."""
    if phases is None:
        return []
    return [Event("batchpilot.preempted", {"batchpilot.step_id": run.preempted_at_step},
                  ns(run.end)) for run in phases.runs
            if run.preempted_at_step is not None and run.end is not None]


def routing_span(resource: Resource, link: TraceLink, start: float, end: float,
                 replica: int, reason: str, status: int, matched_blocks: int | None = None,
                 ) -> ReadableSpan:
    """A fleet ingress's span for one request: the routing decision (which replica, why),
    from arrival at the ingress to the end of the relayed response. The replica's request
    span is its child (the ingress forwards a traceparent naming this span)."""
    trace_id = int(link.trace_id, 16)
    attrs: dict[str, Any] = dict(link.attributes)
    attrs.update({"batchpilot.replica": f"replica-{replica}",
                  "batchpilot.routing_reason": reason, "http.response.status_code": status})
    if matched_blocks is not None:  # precise routing: prompt blocks the replica held
        attrs["batchpilot.routing_matched_blocks"] = matched_blocks
    error = status >= 500
    if error:
        attrs["error.type"] = str(status)
    return ReadableSpan("route", context=_context(trace_id, link.span_id),
                        parent=_parent(trace_id, link), resource=resource, attributes=attrs,
                        kind=SpanKind.SERVER, status=Status(StatusCode.ERROR if error
                                                            else StatusCode.UNSET),
                        start_time=ns(start), end_time=ns(max(start, end)),
                        instrumentation_scope=SCOPE)
