"""What the engine loop (engine_loop.py) publishes and the words it ends requests with: plain
records, importable without the loop (the API's responses read ABORT_REASONS).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import RequestStatus

# Why a request is aborted from outside the engine -> (engine status, finish detail).
ABORT_REASONS: dict[str, tuple[RequestStatus, str]] = {
    "client_disconnect": (RequestStatus.CANCELLED, "client disconnected"),
    "request_timeout": (RequestStatus.TIMEOUT, "request timeout"),
    "stream_idle_timeout": (RequestStatus.TIMEOUT, "stream idle timeout"),
    "shutdown": (RequestStatus.CANCELLED, "server shutting down"),
    "engine_error": (RequestStatus.ERROR, "engine error"),
    # n > 1: admission refused a later choice, so the choices admitted before it end
    "choice_rejected": (RequestStatus.CANCELLED, "choice rejected"),
}


@dataclass(frozen=True)
class LoopStats:
    """Published by the engine thread after each step; read by anyone (one attribute)."""

    steps: int = 0
    last_step_at: float | None = None  # wall time (time.time(), s) the last step ended
    last_step_s: float = 0.0  # duration of the last step
    running: int = 0
    waiting: int = 0
    streams: int = 0  # requests with a client attached
    kv_blocks_used: int = 0  # held by requests (cached free blocks excluded)
    kv_usage: float = 0.0
    # the longest queue wait as a share of its lane's TTFT target (engine/lanes/queues.py)
    queue_slo_share: float = 0.0
