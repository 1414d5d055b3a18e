"""The ingress's /control API: one server's request shapes, auth and errors
(control/admin/routes.py), over the fleet's versions (versioning.py), plus the canary.

    GET   /control/config               fleet version (ETag), config, static, profiles, each
                                        replica's version and target, "converged"
    PATCH /control/config[?dry_run=1]   If-Match: <fleet version> (required); as one server;
                                        the answer adds each replica's push and converge_s
    POST  /control/profiles/{name}      POST /control/rollback/{fleet version}
    GET   /control/history              fleet versions + audit events (canary evidence)
    POST  /control/canary               If-Match required; {"changes", "lane_moves",
                                        "reason", "replicas": N, "watch_s"} -> 202, the run
    GET   /control/canary               the running canary, else the last one (or null)
    POST  /control/drain | /resume      every replica (or the one X-Batchpilot-Replica names)

With X-Batchpilot-Replica, reads (and drain/resume) go to that replica as before; config
writes are refused (409 fleet_managed): a replica's config is the fleet's to set.
While a canary runs, every config change is refused: 409 canary_running, naming it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ConfigDict, Field

from control.admin.auth import authorize
from control.admin.config_store import ChangeError
from control.admin.routes import ActionBody, ChangeBody, _version
from control.api.errors import APIError
from control.fleet.canary import CanaryRule
from control.fleet.canary_run import start_canary
from engine.config.patch import static_to_dict

REPLICA_HEADER = "x-batchpilot-replica"


MIN_POLL_S = 0.1  # s: ten polls a second at most


class CanaryBody(ChangeBody):
    model_config = ConfigDict(extra="forbid", strict=True)  # replicas: true is no count
    replicas: int = Field(default=1, description="replicas that take the change first")
    watch_s: float = Field(default=300.0, description="the comparison window, seconds")
    min_requests: int | None = Field(default=None, description="per side; default the rule's")
    # at least MIN_POLL_S: each poll asks every replica for its window (1e-9 made the
    # ingress poll ~200 times a second, 60% of a core, and kept 500 polls in its answer)
    poll_s: float | None = Field(default=None, ge=MIN_POLL_S, le=3600,
                                 description="between two comparisons; default ~window/10")


def fleet_caller(fleet: Any, request: Request, scope: str) -> str:
    """Who calls a fleet /control route (the token's name), checked against `scope`; 404
    while the fleet runs without its control API."""
    if not fleet.control_api:
        raise APIError(404, "the control API is off on this fleet", code="control_off")
    return authorize(request, fleet.control_tokens, scope)


def fleet_control_router(fleet: Any) -> APIRouter:
    """`fleet`: the FleetIngress (its `control`, `control_tokens`, `control_api`)."""
    router = APIRouter(prefix="/control")
    control = fleet.control

    def caller(request: Request, scope: str) -> str:
        return fleet_caller(fleet, request, scope)

    def refuse_named(request: Request) -> None:
        if request.headers.get(REPLICA_HEADER) is not None:
            raise APIError(409, "a replica's config is set by the fleet's control plane:"
                           " send the change without X-Batchpilot-Replica to change every"
                           " replica", code="fleet_managed", param="X-Batchpilot-Replica")

    async def run(call: Any, status: int = 200) -> JSONResponse:
        try:
            body = await call
        except ChangeError as exc:
            raise exc.api_error() from None
        return JSONResponse(body, status_code=status,
                            headers={"ETag": f'"{body.get("version", "")}"'})

    async def to_named(request: Request, scope: str) -> Response:
        """Relayed to the replica the header names, once the caller may use `scope` here:
        a replica started without the fleet's tokens would not check it again."""
        caller(request, scope)
        return await fleet.forward(request, await request.body(),
                                   fleet.named_replica(request), retry=False)

    @router.get("/config")
    async def get_config(request: Request) -> Response:
        if request.headers.get(REPLICA_HEADER) is not None:
            return await to_named(request, "read")
        caller(request, "read")

        async def body() -> dict[str, Any]:
            versions = await control.ready()
            run_ = control.canary
            return {"version": versions.current, "config": versions.latest.config,
                    "static": static_to_dict(control.static), "profiles": control.profiles,
                    "admission": "draining" if fleet.draining else "open",
                    **control.convergence(),
                    "canary": run_.to_dict() | {"polls": run_.polls[-1:]} if run_ else None}
        return await run(body())

    @router.patch("/config")
    async def patch_config(request: Request, body: ChangeBody, dry_run: bool = False,
                           ) -> JSONResponse:
        refuse_named(request)
        actor = caller(request, "admin")
        expected = _version(request.headers.get("if-match"), required=True)
        return await run(control.change(control.patched(body.changes), expected=expected,
                                        actor=actor, source="api", reason=body.reason,
                                        lane_moves=body.lane_moves, dry_run=dry_run))

    async def action(request: Request, body: ActionBody | None, dry_run: bool,
                     build: Any, source: str) -> JSONResponse:
        refuse_named(request)
        actor = caller(request, "admin")
        body = body or ActionBody()
        expected = _version(request.headers.get("if-match"), required=False)

        async def go() -> dict[str, Any]:
            await control.ready()
            return await control.change(build(), expected=expected, actor=actor,
                                        source=source, reason=body.reason,
                                        lane_moves=body.lane_moves, dry_run=dry_run)
        return await run(go())

    @router.post("/profiles/{name}")
    async def apply_profile(request: Request, name: str, body: ActionBody | None = None,
                            dry_run: bool = False) -> JSONResponse:
        return await action(request, body, dry_run, lambda: control.profile(name),
                            f"profile:{name}")

    @router.post("/rollback/{version}")
    async def rollback(request: Request, version: int, body: ActionBody | None = None,
                       dry_run: bool = False) -> JSONResponse:
        return await action(request, body, dry_run, lambda: control.rolled_back(version),
                            f"rollback:{version}")

    @router.get("/history")
    async def history(request: Request) -> Response:
        if request.headers.get(REPLICA_HEADER) is not None:
            return await to_named(request, "read")
        caller(request, "read")

        async def body() -> dict[str, Any]:
            versions = await control.ready()
            return {"version": versions.current,
                    "versions": [v.summary() for v in versions.history],
                    "events": versions.events}
        return await run(body())

    @router.post("/canary")
    async def canary(request: Request, body: CanaryBody) -> JSONResponse:
        refuse_named(request)
        actor = caller(request, "admin")
        expected = _version(request.headers.get("if-match"), required=True)
        try:
            rule = CanaryRule(**({} if body.min_requests is None else
                                 {"min_requests": body.min_requests})).validate()
        except ValueError as exc:
            raise APIError(400, str(exc), code="invalid_value", param="min_requests") from None

        async def go() -> dict[str, Any]:
            started = await start_canary(control, body.changes, expected=expected,
                                         actor=actor, reason=body.reason,
                                         lane_moves=body.lane_moves, replicas=body.replicas,
                                         watch_s=body.watch_s, rule=rule,
                                         poll_s=body.poll_s)
            return started.to_dict()
        return await run(go(), status=202)

    @router.get("/canary")
    async def canary_state(request: Request) -> dict[str, Any]:
        caller(request, "read")
        return {"canary": control.canary.to_dict() if control.canary else None}

    @router.post("/drain")
    @router.post("/resume")
    async def admission(request: Request) -> Response:
        if request.headers.get(REPLICA_HEADER) is not None:
            return await to_named(request, "admin")
        caller(request, "admin")
        raw = [(k, v) for k, v in request.scope["headers"]
               if k.lower() not in (b"host", b"content-length")]
        answers = await fleet.fan_out("POST", request.url.path, await request.body(), raw)
        replicas = [{"replica_id": i, "status": status, "answer": _json(text)}
                    for i, status, text in answers]
        ok = all(r["status"] == 200 for r in replicas)
        admission = "draining" if request.url.path.endswith("/drain") else "open"
        return JSONResponse({"admission": admission if ok else "mixed", "replicas": replicas},
                            status_code=200 if ok else 502)

    return router


def _json(body: bytes) -> Any:
    import json

    try:
        return json.loads(body or b"null")
    except ValueError:
        return body.decode("utf-8", "replace")
