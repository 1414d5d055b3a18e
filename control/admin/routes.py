"""The control API: read and steer the live engine. Changes apply from the next step.

    GET   /control/config                 live config + version (ETag), static, profiles,
                                          admission state, lanes' running/waiting, and
                                          "fitted": step budgets fitted at start-up (or null)
    PATCH /control/config[?dry_run=1]     If-Match: <version> (required); body
                                          {"changes": merge patch, "lane_moves", "reason"}
    POST  /control/profiles/{name}        a named profile from the YAML
    POST  /control/rollback/{version}     an earlier version's settings, as a new version
    GET   /control/history                every version: who, when, why, what changed
    POST  /control/drain | /control/resume   stop / restart admitting new requests

read scope for GETs, admin for the rest (control/admin/auth.py). Errors: 400 invalid value
(the message names the field), 404 unknown profile or version, 409 a removed lane still
has requests, 412 stale If-Match, 428 no If-Match on a PATCH.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from control.admin.config_store import ChangeError, ChangeResult, ConfigStore
from control.api.errors import APIError, shown
from control.api.query_check import check_known_query
from control.serve.state import get_state
from engine.config.patch import live_to_dict, static_to_dict

router = APIRouter(prefix="/control")


class ChangeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    changes: dict[str, Any] = Field(default_factory=dict)
    lane_moves: dict[str, str] = Field(default_factory=dict)
    reason: str = Field(default="", max_length=2000)


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lane_moves: dict[str, str] = Field(default_factory=dict)
    reason: str = Field(default="", max_length=2000)


def _store(request: Request, scope: str) -> tuple[ConfigStore, str]:
    state = get_state(request)
    if state.config_store is None:
        raise APIError(404, "the control API is off on this server", code="control_off")
    from control.admin.auth import authorize

    actor = authorize(request, state.control_tokens, scope)
    check_known_query(request)  # (control/api/query_check.py) after the token check
    return state.config_store, actor


def _result(result: ChangeResult) -> JSONResponse:
    body = {"applied": result.applied, "version": result.version, "diff": result.diff,
            "config": live_to_dict(result.live)}
    return JSONResponse(body, headers={"ETag": f'"{result.version}"'})


async def _run(call) -> JSONResponse:
    try:
        return _result(await call)
    except ChangeError as exc:
        raise exc.api_error() from None


def _version(header: str | None, required: bool) -> int | None:
    if header is None:
        if required:
            raise APIError(428, "send If-Match with the version you read (GET /control/config"
                           " returns it, and its ETag): concurrent edits must not overwrite"
                           " each other", code="if_match_required", param="If-Match")
        return None
    try:
        return int(header.strip().removeprefix("W/").strip('"'))
    except ValueError:
        raise APIError(400, f"If-Match {shown(header)} must be a config version number",
                       code="invalid_value", param="If-Match") from None


@router.get("/config")
async def get_config(request: Request) -> JSONResponse:
    store, _ = _store(request, "read")
    try:
        live = store.current()
    except ChangeError as exc:
        raise exc.api_error() from None
    engine = store.engine
    gauges = await engine.call(lambda e: e.gauges())
    body = {
        "version": live.version, "config": live_to_dict(live),
        "static": static_to_dict(store.static), "profiles": store.profiles,
        "fitted": store.step_fit.to_dict() if store.step_fit is not None else None,
        "admission": "draining" if engine.admission_paused or engine.draining else "open",
        "lanes_state": {name: {"running": gauges.running_by_lane.get(name, 0),
                               "waiting": gauges.waiting_by_lane.get(name, 0)}
                        for name in live.lane_names},
    }
    return JSONResponse(body, headers={"ETag": f'"{live.version}"'})


@router.patch("/config")
async def patch_config(request: Request, body: ChangeBody, dry_run: bool = False,
                       ) -> JSONResponse:
    store, actor = _store(request, "admin")
    expected = _version(request.headers.get("if-match"), required=True)
    return await _run(store.patch(body.changes, expected_version=expected, actor=actor,
                                  reason=body.reason, lane_moves=body.lane_moves,
                                  dry_run=dry_run))


async def _action(request: Request, body: ActionBody | None, dry_run: bool,
                  change: Callable[..., Any]) -> JSONResponse:
    """A profile or a rollback: the store builds the change; If-Match is optional."""
    store, actor = _store(request, "admin")
    body = body or ActionBody()
    expected = _version(request.headers.get("if-match"), required=False)
    return await _run(change(store, actor=actor, reason=body.reason,
                             expected_version=expected, lane_moves=body.lane_moves,
                             dry_run=dry_run))


@router.post("/profiles/{name}")
async def apply_profile(request: Request, name: str, body: ActionBody | None = None,
                        dry_run: bool = False) -> JSONResponse:
    return await _action(request, body, dry_run,
                         lambda store, **kw: store.apply_profile(name, **kw))


@router.post("/rollback/{version}")
async def rollback(request: Request, version: int, body: ActionBody | None = None,
                   dry_run: bool = False) -> JSONResponse:
    return await _action(request, body, dry_run,
                         lambda store, **kw: store.rollback(version, **kw))


@router.get("/history")
async def history(request: Request) -> dict[str, Any]:
    store, _ = _store(request, "read")
    try:
        store.current()
    except ChangeError as exc:
        raise exc.api_error() from None
    return {"versions": [
        {"version": v.version, "time": v.time, "actor": v.actor, "source": v.source,
         "reason": v.reason, "diff": v.diff} for v in store.history]}


@router.post("/drain")
async def drain(request: Request, body: ActionBody | None = None) -> dict[str, str]:
    store, actor = _store(request, "admin")
    if not store.engine.admission_paused:
        store.engine.admission_paused = True
        store.audit_admission(True, actor, (body or ActionBody()).reason)
    return {"admission": "draining"}


@router.post("/resume")
async def resume(request: Request, body: ActionBody | None = None) -> dict[str, str]:
    store, actor = _store(request, "admin")
    if store.engine.draining:
        raise APIError(409, "the server is shutting down; admission cannot be resumed",
                       code="shutting_down")
    if store.engine.admission_paused:
        store.engine.admission_paused = False
        store.audit_admission(False, actor, (body or ActionBody()).reason)
    return {"admission": "open"}
