"""Engine events -> OpenAI bodies, SSE chunks and X-Batchpilot-* headers, for one request.

A stream is: [chat only: a role chunk] text chunks ... a finish chunk (finish_reason, the
`batchpilot` object with usage and timing, and `error` when the server ended it) [a usage
chunk with `choices: []` when stream_options.include_usage] `data: [DONE]`. With
include_usage every other chunk has `"usage": null`, as OpenAI's API does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from control.api.request_meta import RequestMeta
from control.api.schemas import BatchpilotInfo, Timing, Usage
from control.serve.streams import StreamEvent
from engine.records import AdmissionDecision

TIMING_HEADERS = ("queue_delay_s", "ttft_s", "prefill_time_s", "decode_time_s", "e2e_s",
                  "tpot_s")


@dataclass
class ResponseFormat:
    kind: str  # "chat" | "completion"
    request_id: str
    model: str
    prompt_tokens: int
    meta: RequestMeta
    include_usage: bool = False
    lane: str = ""  # admission's lane (the engine's record has the final word)
    estimated_wait_s: float | None = None
    created: int = field(default_factory=lambda: int(time.time()))

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
            usage=self.usage(completion_tokens))

    def start_headers(self) -> dict[str, str]:
        """What is known before the first token (all a stream can carry)."""
        headers = {"X-Batchpilot-Request-Id": self.request_id,
                   "X-Batchpilot-Lane": self.lane, "X-Batchpilot-Tenant": self.meta.tenant,
                   "X-Batchpilot-Priority": str(self.meta.priority)}
        if self.estimated_wait_s is not None:
            headers["X-Batchpilot-Estimated-Wait-S"] = f"{self.estimated_wait_s:.6f}"
        return headers

    def final_headers(self, info: BatchpilotInfo) -> dict[str, str]:
        headers = self.start_headers()
        headers["X-Batchpilot-Lane"] = info.lane
        for name in TIMING_HEADERS:
            value = getattr(info.timing, name)
            if value is not None:
                headers[_header_name(name)] = f"{value:.6f}"
        headers["X-Batchpilot-Finish-Reason"] = info.finish_reason or ""
        headers["X-Batchpilot-Prompt-Tokens"] = str(self.prompt_tokens)
        headers["X-Batchpilot-Completion-Tokens"] = str(info.usage.completion_tokens
                                                        if info.usage else 0)
        return headers

    # ---- non-streaming -----------------------------------------------------------------
    def body(self, text: str, event: StreamEvent, info: BatchpilotInfo) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": event.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": event.finish_reason}
            obj = "text_completion"
        return {"id": self.request_id, "object": obj, "created": self.created,
                "model": self.model, "choices": [choice],
                "usage": info.usage.model_dump(), "batchpilot": info.model_dump()}

    # ---- streaming ---------------------------------------------------------------------
    def role_chunk(self) -> bytes:
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def text_chunk(self, text: str) -> bytes:
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                      "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return self._chunk(choice)

    def finish_chunks(self, event: StreamEvent | None, completion_tokens: int,
                      finish_reason: str, error: dict[str, Any] | None = None) -> list[bytes]:
        info = self.info(event, completion_tokens).model_dump()
        info["finish_reason"] = finish_reason
        if self.kind == "chat":
            choice = {"index": 0, "delta": {}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}
        extra: dict[str, Any] = {"batchpilot": info}
        if error is not None:
            extra["error"] = error
        chunks = [self._chunk(choice, **extra)]
        if self.include_usage:
            chunks.append(self._chunk(None, usage=self.usage(completion_tokens).model_dump(),
                                      batchpilot=info))
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    def _chunk(self, choice: dict[str, Any] | None, **extra: Any) -> bytes:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        data: dict[str, Any] = {"id": self.request_id, "object": obj, "created": self.created,
                                "model": self.model, "choices": [choice] if choice else []}
        if self.include_usage:
            data["usage"] = None
        data.update(extra)
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def from_decision(fmt: ResponseFormat, decision: AdmissionDecision) -> ResponseFormat:
    fmt.lane = decision.lane or fmt.lane  # a draining refusal names no lane
    fmt.estimated_wait_s = decision.estimated_wait_s
    return fmt


def _header_name(field_name: str) -> str:
    """queue_delay_s -> X-Batchpilot-Queue-Delay-S"""
    return "X-Batchpilot-" + "-".join(p.capitalize() for p in field_name.split("_"))
