"""Engine deltas -> user-facing outputs: text, stop strings, finish reasons, metrics.

Stop strings are found here, on text; the caller then ends the request in the engine
(`Engine.abort(id, RequestStatus.STOPPED)`), which frees its blocks before the next step.

Logprobs (requests with `logprobs` / `prompt_logprobs`) are read from the step's sample-row
requests and decoded here, on the engine thread, each token alone (special tokens kept),
so a token that ends inside a multi-byte character reads U+FFFD. An executor without a
model computes none: such a request's `logprobs` / `prompt_logprobs` stay None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob
from engine.output.detokenizer import IncrementalDetokenizer
from engine.records import RequestRecord, StepOutput
from engine.request import Request, SamplingParams


@dataclass(frozen=True, slots=True)
class Logprob:
    """A token's logprob (raw model distribution), decoded: `token` is its text alone;
    `rank` 1 is the most likely (prompt tokens only; None for sampled ones); `top`:
    (token id, text, logprob), most likely first."""

    token_id: int
    token: str
    logprob: float
    rank: int | None
    top: tuple[tuple[int, str, float], ...] = ()


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
    # One per token of token_ids when asked (None: not asked, or none computed);
    # delta_logprobs: those of delta_token_ids
    logprobs: list[Logprob] | None = None
    delta_logprobs: list[Logprob] = field(default_factory=list)
    # Prompt tokens 1.. (the first has none), once the prompt is computed, when asked
    prompt_logprobs: tuple[Logprob, ...] | None = None


@dataclass
class _State:
    output: RequestOutput
    detok: IncrementalDetokenizer
    params: SamplingParams
    stop_reason: str | None = None  # "stop" once a stop string matched


class OutputProcessor:
    def __init__(self, tokenizer: object):
        self.tokenizer = tokenizer
        self._states: dict[str, _State] = {}
        self._token_text: dict[int, str] = {}  # token id -> its text alone (<= vocab size)

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
            params: SamplingParams) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop)
        out = RequestOutput(request_id, prompt, list(prompt_token_ids))
        if params.logprobs is not None:
            out.logprobs = []
        self._states[request_id] = _State(out, detok, params)

    def discard(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, step: StepOutput) -> tuple[list[RequestOutput], list[str]]:
        """Outputs that changed in this step, and the request ids a stop string ended
        (to finish in the engine)."""
        records = {r.request_id: r for r in step.finished}
        changed: dict[str, RequestOutput] = {}
        to_stop: list[str] = []
        rows: dict[str, Request] | None = None  # built only when a request asks logprobs
        for delta in step.deltas:
            state = self._states.get(delta.request_id)
            if state is None:
                continue
            out = state.output
            new_ids = [] if state.stop_reason else delta.new_token_ids
            params = state.params
            if params.logprobs is not None or params.prompt_logprobs is not None:
                if rows is None:
                    rows = {r.request_id: r for r in step.rows}
                self._take_logprobs(out, rows.get(delta.request_id), new_ids,
                                    out.request_id in changed)
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

    def _take_logprobs(self, out: RequestOutput, req: Request | None, new_ids: list[int],
                       again: bool) -> None:
        """Before `new_ids` join out.token_ids: decode their entries and, once the prompt
        is computed, its entries. `again`: out already changed in this step."""
        if not again:
            out.delta_logprobs = []
        if req is None:
            return
        if out.logprobs is not None and new_ids:
            done = len(out.token_ids)
            entries = req.logprobs[done:done + len(new_ids)]
            if len(entries) < len(new_ids):  # the executor computed none (no model)
                out.logprobs = None
            else:
                decoded = [self._decode(e) for e in entries]
                out.logprobs.extend(decoded)
                out.delta_logprobs = out.delta_logprobs + decoded
        wanted = req.num_prompt_tokens - 1
        if (req.sampling_params.prompt_logprobs is not None and out.prompt_logprobs is None
                and wanted >= 0 and len(req.prompt_logprobs) >= wanted and new_ids):
            out.prompt_logprobs = tuple(self._decode(e) for e in req.prompt_logprobs[:wanted])

    def _decode(self, entry: TokenLogprob) -> Logprob:
        return Logprob(entry.token_id, self._text(entry.token_id), entry.logprob, entry.rank,
                       tuple((t, self._text(t), lp) for t, lp in entry.top))

    def _text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text
