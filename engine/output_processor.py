"""Engine deltas -> user-facing outputs: text, stop strings, finish reasons, metrics.

Stop strings are found here, on text; the caller then ends the request in the engine
(`Engine.abort(id, RequestStatus.STOPPED)`), which frees its blocks before the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.detokenizer import IncrementalDetokenizer
from engine.records import RequestRecord, StepOutput
from engine.request import SamplingParams


@dataclass(frozen=True)
class RequestMetrics:
    """Seconds, from the engine's record of the request."""

    queue_delay_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prefill_time_s: float | None
    decode_time_s: float | None

    @classmethod
    def from_record(cls, rec: RequestRecord) -> RequestMetrics:
        return cls(rec.queue_delay_s, rec.ttft_s, rec.tpot_s, rec.e2e_s, rec.prefill_time_s,
                   rec.decode_time_s)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # stop | length | cancelled | timeout | error
    delta_text: str = ""  # text new since the previous output of this request
    delta_token_ids: list[int] = field(default_factory=list)
    metrics: RequestMetrics | None = None  # once finished
    record: RequestRecord | None = None  # once finished


@dataclass
class _State:
    output: RequestOutput
    detok: IncrementalDetokenizer
    stop_reason: str | None = None  # "stop" once a stop string matched


class OutputProcessor:
    def __init__(self, tokenizer: object):
        self.tokenizer = tokenizer
        self._states: dict[str, _State] = {}

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
            params: SamplingParams) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop)
        self._states[request_id] = _State(RequestOutput(request_id, prompt,
                                                        list(prompt_token_ids)), detok)

    def discard(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, step: StepOutput) -> tuple[list[RequestOutput], list[str]]:
        """Outputs that changed in this step, and the request ids a stop string ended
        (to finish in the engine)."""
        records = {r.request_id: r for r in step.finished}
        changed: dict[str, RequestOutput] = {}
        to_stop: list[str] = []
        for delta in step.deltas:
            state = self._states.get(delta.request_id)
            if state is None:
                continue
            out = state.output
            new_ids = [] if state.stop_reason else delta.new_token_ids
            out.token_ids.extend(new_ids)
            out.delta_token_ids = out.delta_token_ids + new_ids if out.request_id in changed \
                else list(new_ids)
            state.detok.add_tokens(new_ids)
            if state.detok.stopped_on is not None and state.stop_reason is None:
                state.stop_reason = "stop"
                if not delta.finished:
                    to_stop.append(delta.request_id)
            if delta.finished:
                out.finished = True
                out.finish_reason = state.stop_reason or delta.finish_reason
                record = records.get(delta.request_id)
                out.record = record
                out.metrics = RequestMetrics.from_record(record) if record else None
                del self._states[delta.request_id]
            out.delta_text = (out.delta_text if out.request_id in changed else "") + \
                state.detok.take_delta(final=out.finished)
            out.text = state.detok.text[:state.detok.emitted]
            changed[out.request_id] = out
        return list(changed.values()), to_stop
