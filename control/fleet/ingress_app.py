"""The ingress's HTTP app (FastAPI) over a FleetIngress (ingress.py): the routes its
docstring lists, each a thin call into the fleet object, which owns the state."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from control.admin.origin_guard import OriginGuard
from control.api.body_limit import BodyLimit
from control.api.errors import APIError, install_error_handlers, shown
from control.api.routed import routed_value
from control.api.text_check import UnicodeBody
from control.fleet.control_routes import fleet_control_router
from control.fleet.metrics_merge import ingress_metrics, kv_index_metrics, merge_metrics
from control.fleet.restart import restart_router
from control.fleet.scaling_routes import scaling_router
from control.fleet.trace_fanout import guard_forwarded, install_trace_routes


def refuse_unrelayed(path: str) -> None:
    """404 for what no replica should be asked: a /control route the fleet does not have
    (the fleet owns its control plane; a replica's is reached through the routes above),
    and a path ending in "/" (a replica would redirect it to its own internal address)."""
    if path.startswith("control/") or path.endswith("/"):
        hint = f"; did you mean {shown('/' + path.rstrip('/'), 200)}?" \
            if path.endswith("/") else ""
        raise APIError(404, f"the fleet has no route {shown('/' + path, 200)}{hint}",
                       code="not_found")


def build_app(fleet: Any) -> FastAPI:
    """`fleet`: the FleetIngress."""
    app = FastAPI(title="batchpilot fleet", summary="one OpenAI API over N engine replicas")
    app.add_middleware(UnicodeBody)  # inside BodyLimit: reads a body already bounded
    app.add_middleware(BodyLimit, max_bytes=fleet.max_body_bytes)
    app.add_middleware(OriginGuard, check_host=fleet.loopback and not fleet.control_tokens,
                       tokens=fleet.control_tokens)
    install_error_handlers(app)

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def generate(request: Request) -> Response:
        body = await request.body()
        if fleet.draining:
            raise APIError(503, "the fleet is draining (shutting down)", code="draining",
                           headers={"Retry-After": "1"})
        try:
            parsed = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested ~1,000 deep
            parsed = {}  # the replica answers the 400 in the server's words
        parsed = parsed if isinstance(parsed, dict) else {}
        hop = fleet.door.enter(request.headers, parsed) if fleet.door else None
        decision = await fleet.route_generation(request.url.path, parsed, request.headers)
        # matched blocks are known only under precise routing (the ingress hashes prompts)
        blocks = decision.matched_blocks if fleet.prefix is not None else None
        if hop is not None:
            hop.reason, hop.matched_blocks = decision.reason, blocks
        return await fleet.forward(request, body, decision.replica_id, hop=hop,
                                   routed=routed_value(decision.reason, blocks))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ok = fleet.ready()
        return JSONResponse(fleet.readiness(), status_code=200 if ok else 503,
                            headers=None if ok else {"Retry-After": "5"})

    @app.get("/metrics")
    async def metrics() -> Response:
        answers = await fleet.fan_out("GET", "/metrics")
        texts = [(i, body.decode()) for i, status, body in answers if status == 200]
        own = ingress_metrics(fleet.routed, fleet.table.views)
        if fleet.prefix is not None:
            own += kv_index_metrics(fleet.matched, fleet.kv_index.families_data())
        own += fleet.scaling.families()  # a fixed fleet's too: its slots, no events
        if fleet.door is not None:  # its routing spans' export counters
            own += list(fleet.door.export.families("ingress"))
        return Response(merge_metrics(texts, own), media_type="text/plain; version=0.0.4")

    install_trace_routes(app, fleet)  # /v1/trace/*: every replica's, as one trace

    app.include_router(fleet_control_router(fleet))
    app.include_router(restart_router(fleet))  # before the catch-all below
    app.include_router(scaling_router(fleet))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def other(path: str, request: Request) -> Response:
        # /v1/whatif, /v1/loadtest/results, any other /v1/trace path: the fleet's tokens,
        # here, before the request reaches a replica (which may run without them)
        guard_forwarded(request, fleet.control_tokens)
        refuse_unrelayed(path)
        body = await request.body()
        return await fleet.forward(request, body, fleet.named_replica(request), retry=False)

    return app
