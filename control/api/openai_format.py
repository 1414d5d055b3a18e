"""Engine events -> OpenAI bodies, SSE chunks and X-Batchpilot-* headers, for one request.

A stream is: [chat only: a role chunk] text chunks ... a finish chunk (finish_reason, the
`batchpilot` object with usage and timing, and `error` when the server ended it) [a usage
chunk with `choices: []` when stream_options.include_usage] `data: [DONE]`. With
include_usage every other chunk has `"usage": null`, as OpenAI's API does (with vLLM's
continuous_usage_stats too, the usage so far: completion tokens of every choice). With n > 1 each
choice's chunks carry its `index` and come as its tokens do (interleaved); each choice has
its finish chunk, and the usage chunk and [DONE] follow the last one. Usage counts the
prompt once and the completion tokens of every choice (as OpenAI's API).

Logprobs (control/api/logprobs_format.py), when asked: each text chunk carries those of the
tokens that arrived since the chunk before (a token whose text is held back, a partial
character or a possible stop string, has its logprob sent with the text that follows, or
with the finish chunk). Completions' `echo`, and vLLM's `prompt_logprobs`, go in one chunk
before the first text chunk (the prompt's text with its logprobs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from control.api.field_policy import ignored_header
from control.api.header_values import header_text
from control.api.logprobs_format import CompletionLogprobs, chat_logprobs, vllm_prompt_logprobs
from control.api.request_meta import RequestMeta
from control.api.response_schemas import BatchpilotInfo, SLOTargets, Timing, Usage
from control.serve.streams import StreamEvent
from engine.config import LiveConfig
from engine.output.processor import Logprob
from engine.records import AdmissionDecision

TIMING_HEADERS = ("queue_delay_s", "ttft_s", "prefill_time_s", "decode_time_s", "e2e_s",
                  "tpot_s")


@dataclass(frozen=True)
class Echo:
    """Completions' echo: the prompt's text (the reply starts with it) and its first
    token's text (the first of the echoed logprobs, which has no value)."""

    text: str
    first_token: str


@dataclass
class ChoiceResult:
    """One choice of a non-streaming reply, gathered from its events."""

    index: int
    texts: list[str] = field(default_factory=list)
    entries: list[Logprob] = field(default_factory=list)
    prompt: tuple[Logprob, ...] | None = None
    event: StreamEvent | None = None  # the last (finished) one

    def add(self, event: StreamEvent) -> None:
        self.texts.append(event.delta_text)
        self.entries.extend(event.delta_logprobs)
        self.prompt = event.prompt_logprobs if self.prompt is None else self.prompt
        self.event = event


@dataclass
class ResponseFormat:
    kind: str  # "chat" | "completion"
    request_id: str
    model: str
    prompt_tokens: int
    meta: RequestMeta
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage on every chunk
    lane: str = ""  # admission's lane (the engine's record has the final word)
    estimated_wait_s: float | None = None
    admission: str = ""  # an admitted request's admission reason (slo_deferred), or ""
    slo: SLOTargets | None = None  # the admitted lane's SLO, from the live config
    created: int = field(default_factory=lambda: int(time.time()))
    # Logprobs asked: N alternatives (chat: top_logprobs, 0 with logprobs=true alone;
    # completions: logprobs); None: every choice says "logprobs": null
    top_logprobs: int | None = None
    prompt_logprobs: int | None = None  # vLLM's extension: N alternatives per prompt token
    echo: Echo | None = None  # completions only
    trace_id: str = ""  # the request's distributed trace (control/otel/context.py)
    ignored_fields: tuple[str, ...] = ()  # field_policy.py: named in the answer
    _legacy: dict[int, CompletionLogprobs] = field(default_factory=dict, init=False,
                                                   repr=False)  # by choice: text offsets

    # ---- pieces ------------------------------------------------------------------------
    def usage(self, completion_tokens: int) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=self.prompt_tokens + completion_tokens)

    def info(self, event: StreamEvent | None, completion_tokens: int) -> BatchpilotInfo:
        rec = event.record if event is not None else None
        timing = Timing(**{k: getattr(rec, k) for k in TIMING_HEADERS}) if rec else Timing()
        return BatchpilotInfo(
            request_id=self.request_id, lane=rec.lane if rec else self.lane,
            tenant=rec.tenant if rec else self.meta.tenant,
            priority=rec.priority if rec else self.meta.priority,
            finish_reason=event.finish_reason if event else None,
            finish_detail=event.finish_detail if event else "",
            num_cached_tokens=rec.num_cached_tokens if rec else 0,
            num_preemptions=rec.num_preemptions if rec else 0, timing=timing,
            usage=self.usage(completion_tokens), slo=self.slo,
            ignored_fields=list(self.ignored_fields))

    def start_headers(self) -> dict[str, str]:
        """What is known before the first token (all a stream can carry)."""
        headers = {"X-Batchpilot-Request-Id": self.request_id,
                   "X-Batchpilot-Lane": header_text(self.lane),
                   "X-Batchpilot-Tenant": header_text(self.meta.tenant),
                   "X-Batchpilot-Priority": str(self.meta.priority)}
        if self.trace_id:
            headers["X-Batchpilot-Trace-Id"] = self.trace_id
        if self.estimated_wait_s is not None:
            headers["X-Batchpilot-Estimated-Wait-S"] = f"{self.estimated_wait_s:.6f}"
        if self.admission:
            headers["X-Batchpilot-Admission"] = self.admission
        if self.ignored_fields:
            headers["X-Batchpilot-Ignored-Fields"] = ignored_header(self.ignored_fields)
        return headers

    def final_headers(self, info: BatchpilotInfo) -> dict[str, str]:
        headers = self.start_headers()
        headers["X-Batchpilot-Lane"] = header_text(info.lane)
        for name in TIMING_HEADERS:
            value = getattr(info.timing, name)
            if value is not None:
                headers[_header_name(name)] = f"{value:.6f}"
        headers["X-Batchpilot-Finish-Reason"] = info.finish_reason or ""
        headers["X-Batchpilot-Prompt-Tokens"] = str(self.prompt_tokens)
        headers["X-Batchpilot-Completion-Tokens"] = str(info.usage.completion_tokens
                                                        if info.usage else 0)
        return headers

    # ---- logprobs ----------------------------------------------------------------------
    def logprobs(self, entries: Sequence[Logprob], prompt: Sequence[Logprob] | None = None,
                 index: int = 0) -> dict[str, Any] | None:
        """Choice `index`'s `logprobs` for these output tokens; `prompt` (completions'
        echo, once): the prompt's entries go first, after its first token's."""
        if self.top_logprobs is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(entries, self.top_logprobs)
        legacy = self._legacy.setdefault(index, CompletionLogprobs(self.top_logprobs))
        if prompt is not None and self.echo is not None:
            return legacy.render([*prompt, *entries], self.echo.first_token)
        return legacy.render(entries)

    def _prompt_extra(self, prompt: Sequence[Logprob] | None) -> dict[str, Any]:
        if self.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(prompt or (), self.prompt_logprobs)}

    # ---- non-streaming -----------------------------------------------------------------
    def body(self, results: list[ChoiceResult], info: BatchpilotInfo) -> dict[str, Any]:
        """The whole reply: one choice per result (in index order)."""
        choices, extra = [], {}
        for r in results:
            text, event = "".join(r.texts), r.event
            reason = event.finish_reason if event is not None else None
            if self.kind == "chat":
                choices.append({"index": r.index,
                                "message": {"role": "assistant", "content": text},
                                "logprobs": self.logprobs(r.entries, index=r.index),
                                "finish_reason": reason})
                extra = extra or self._prompt_extra(r.prompt)  # one prompt: on the response
            else:
                echoed = self.echo.text if self.echo is not None else ""
                choices.append({"index": r.index, "text": echoed + text,
                                "logprobs": self.logprobs(r.entries, r.prompt or (), r.index),
                                "finish_reason": reason, **self._prompt_extra(r.prompt)})
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model, "choices": choices, **extra,
                "usage": info.usage.model_dump(), "batchpilot": info.model_dump()}

    # ---- streaming ---------------------------------------------------------------------
    def role_chunk(self, index: int = 0) -> bytes:
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None}, tokens=0)

    def text_chunk(self, text: str, entries: Sequence[Logprob] = (), index: int = 0,
                   tokens: int | None = None) -> bytes:
        """`tokens`: completion tokens of every choice so far (continuous usage)."""
        logprobs = self.logprobs(entries, index=index)
        if self.kind == "chat":
            choice = {"index": index, "delta": {"content": text}, "logprobs": logprobs,
                      "finish_reason": None}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs,
                      "finish_reason": None}
        return self._chunk(choice, tokens=tokens)

    def prompt_chunk(self, prompt: Sequence[Logprob] | None, index: int = 0) -> bytes | None:
        """The chunk before the first text: completions' echoed prompt (with its logprobs)
        and vLLM's prompt_logprobs; None when neither was asked."""
        if self.echo is None and self.prompt_logprobs is None:
            return None
        extra = self._prompt_extra(prompt)
        if self.kind == "chat":
            return self._chunk({"index": index, "delta": {}, "logprobs": None,
                                "finish_reason": None}, tokens=0, **extra)
        text = self.echo.text if self.echo is not None else ""
        logprobs = self.logprobs((), prompt or (), index) if self.echo is not None else None
        return self._chunk({"index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": None, **extra}, tokens=0)

    def finish_chunks(self, event: StreamEvent | None, completion_tokens: int,
                      finish_reason: str, error: dict[str, Any] | None = None,
                      entries: Sequence[Logprob] = (), index: int = 0,
                      last: bool = True) -> list[bytes]:
        """Choice `index`'s finish chunk; `entries`: logprobs of tokens no text chunk
        carried yet; `completion_tokens`: of every choice so far. `last`: the stream ends
        here (the usage chunk, [DONE])."""
        info = self.info(event, completion_tokens).model_dump()
        info["finish_reason"] = finish_reason
        logprobs = self.logprobs(entries, index=index) if entries else None
        if self.kind == "chat":
            choice = {"index": index, "delta": {}, "logprobs": logprobs,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": "", "logprobs": logprobs,
                      "finish_reason": finish_reason}
        extra: dict[str, Any] = {"batchpilot": info}
        if error is not None:
            extra["error"] = error
        chunks = [self._chunk(choice, tokens=completion_tokens, **extra)]
        if not last:
            return chunks
        if self.include_usage:
            chunks.append(self._chunk(None, usage=self.usage(completion_tokens).model_dump(),
                                      batchpilot=info))
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    def _chunk(self, choice: dict[str, Any] | None, tokens: int | None = None,
               **extra: Any) -> bytes:
        """`tokens`: completion tokens so far, the usage a continuous-usage chunk carries."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        data: dict[str, Any] = {"id": self.request_id, "object": obj, "created": self.created,
                                "model": self.model, "choices": [choice] if choice else []}
        if self.include_usage:
            data["usage"] = (self.usage(tokens).model_dump()
                             if self.continuous_usage and tokens is not None else None)
        data.update(extra)
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def from_decision(fmt: ResponseFormat, decision: AdmissionDecision,
                  live: LiveConfig | None = None) -> ResponseFormat:
    """`live`: the config the request was admitted under (its lane's SLO)."""
    fmt.lane = decision.lane or fmt.lane  # a draining refusal names no lane
    fmt.estimated_wait_s = decision.estimated_wait_s
    fmt.admission = decision.reason or "" if decision.accepted else ""
    if live is not None and fmt.lane in live.lane_names:
        slo = live.lane_slo(live.lane(fmt.lane))
        fmt.slo = SLOTargets(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s) if slo.is_set else None
    return fmt


def _header_name(field_name: str) -> str:
    """queue_delay_s -> X-Batchpilot-Queue-Delay-S"""
    return "X-Batchpilot-" + "-".join(p.capitalize() for p in field_name.split("_"))
