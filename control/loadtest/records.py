"""What the load tester plans and what it observes: plain records shared by the scenario
planner (scenario.py), the runner (runner.py), the metrics (metrics.py) and the report.

Times are seconds: `arrival_s` from the start of the run; the others from the moment the
request was sent (`sent_at` is wall time, time.time()), except `server_*`: the server's own
timing (`batchpilot.timing` of the body or the last stream chunk), counted from when it
stamped the request's arrival. The client's time minus the server's is the delay the server
does not see (connection, parsing, queues before its stamp, the response's way back).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    arrival_s: float  # when to send it, from the start of the run
    prompt_tokens: int  # wanted prompt length (server tokenizer)
    output_tokens: int  # max_tokens (forced with ignore_eos when the scenario says so)
    tenant: str
    lane: str | None  # None: the server routes it
    stream: bool
    cancel_after_s: float | None  # the client gives up (closes the connection) after this
    kind: str = "chat"  # chat | rag (a long context) | ... as the scenario names it
    ignore_eos: bool = True


@dataclass
class RequestResult:
    planned: PlannedRequest
    outcome: str  # ok | rejected | timeout | cancelled | error
    http_status: int | None = None
    error: str = ""  # the server's error code or message, or the client exception
    request_id: str = ""  # the server's id (X-Batchpilot-Request-Id)
    sent_at: float = 0.0  # wall time the request was (first) sent
    sends: int = 1  # 1 + the times the client sent it again after a refusal (--client-retries)
    retry_after: str | None = None  # the last refusal's Retry-After header
    last_send_s: float = 0.0  # when the last send left, from the first (0: sent once)
    ttft_s: float | None = None  # first content chunk (stream) or whole response
    e2e_s: float | None = None  # last byte
    chunk_times_s: list[float] = field(default_factory=list)  # every content chunk, from send
    prompt_tokens: int = 0  # as the server counted them (usage)
    output_tokens: int = 0  # as the server counted them (usage), or chunks received
    server_ttft_s: float | None = None  # batchpilot.timing.ttft_s; None: not sent
    server_e2e_s: float | None = None  # batchpilot.timing.e2e_s; None: not sent
    # batchpilot.lane and batchpilot.slo: the lane the server ran it in and that lane's
    # targets ({ttft_s, tpot_s}); goodput counts by them when the scenario sets no slo
    server_lane: str = ""
    server_slo: dict | None = None


@dataclass(frozen=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
