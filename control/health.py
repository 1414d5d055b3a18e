"""Probes. /healthz: the process answers. /readyz: 200 only when the model is loaded, the
engine loop is alive and has made progress recently (or is idle), and the server is not
draining; else 503 with the reason. Both bodies carry a few numbers for operators.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from control.state import get_state

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    state = get_state(request)
    engine = state.engine
    reason = engine.health()
    stats = engine.stats
    body = {
        "status": "ready" if reason is None else "not_ready",
        "reason": reason,
        "model": state.settings.model_name,
        "draining": engine.draining,
        "inflight": state.inflight,
        "engine": {"steps": stats.steps, "last_step_s": stats.last_step_s,
                   "last_step_age_s": None if stats.last_step_at is None
                   else round(time.time() - stats.last_step_at, 3),
                   "running": stats.running, "waiting": stats.waiting,
                   "kv_blocks_used": stats.kv_blocks_used, "kv_usage": stats.kv_usage},
        "aborts": dict(engine.abort_counts),
        "rejections": dict(engine.reject_counts),
    }
    headers = {"Retry-After": "5"} if reason is not None else None
    return JSONResponse(body, status_code=200 if reason is None else 503, headers=headers)
