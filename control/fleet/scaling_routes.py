"""The autoscaler over HTTP, at the ingress:

    GET   /control/fleet/autoscale   (read)   config, each slot's phase, the wanted count
                                              and why, the last scale events
    PATCH /control/fleet/autoscale   (admin)  {"changes": {NAME: number}, "reason": "..."}:
                                              thresholds and delays, live (the policy reads
                                              them with the next signals, within a second)

The size (min_replicas, max_replicas) is fixed when the fleet deploys: it is how many Serve
deployments exist and which of them Serve may scale. A change is recorded as a fleet audit
event (GET /control/history) with its actor and reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from control.api.errors import APIError
from control.fleet.control_routes import fleet_caller

log = logging.getLogger("batchpilot.fleet")
MAX_REASON = 500


class AutoscaleChange(BaseModel):
    # a misspelt field is a 400, never ignored; strict: true or "2" is no number
    model_config = ConfigDict(extra="forbid", strict=True)
    changes: dict[str, float | int] = Field(max_length=16)
    reason: str = Field(default="", max_length=MAX_REASON)


async def history_of(control: Any) -> Any:
    """The fleet's versions and events (built from a replica at first use), or None when no
    replica can give them now (the change applies all the same)."""
    try:
        return await control.ready()
    except Exception as exc:  # no replica to build them from now: the change is applied
        log.warning("autoscale change not recorded in the fleet's history: %r", exc)
        return None


def scaling_router(fleet: Any) -> APIRouter:
    """`fleet`: the FleetIngress (its `scaling`, `control`, `control_tokens`)."""
    router = APIRouter(prefix="/control/fleet")

    def caller(request: Request, scope: str) -> str:
        return fleet_caller(fleet, request, scope)

    @router.get("/autoscale")
    async def autoscale_state(request: Request) -> dict[str, Any]:
        caller(request, "read")
        return fleet.scaling.view()

    @router.patch("/autoscale")
    async def autoscale_change(request: Request, body: AutoscaleChange) -> dict[str, Any]:
        actor = caller(request, "admin")
        scaling = fleet.scaling
        if not scaling.enabled:
            raise APIError(409, "this fleet is not autoscaled (start it with --min-replicas"
                           " and --max-replicas)", code="not_autoscaled")
        if {"min_replicas", "max_replicas"} & set(body.changes):
            raise APIError(400, "min_replicas and max_replicas are fixed when the fleet"
                           " deploys (they are its Serve deployments); restart it to change"
                           " them", code="invalid_value", param="changes")
        try:
            new = scaling.config.replace(body.changes)
        except ValueError as exc:
            raise APIError(400, str(exc), code="invalid_value", param="changes") from None
        old, scaling.config = scaling.config.to_dict(), new
        diff = {k: [old[k], v] for k, v in new.to_dict().items() if old[k] != v}
        event = {"time": time.time(), "actor": actor, "reason": body.reason, "diff": diff}
        # the fleet's history is built on its first use: a change made before any other
        # /control call was left out of GET /control/history
        versions = await history_of(fleet.control)
        if versions is not None:
            versions.event("autoscale_config", **event)
        scaling.config_changes.append(event)
        # recorded: false says the history missed it (no replica could build it), not hidden
        return {"applied": bool(diff), "diff": diff, "config": new.to_dict(),
                "recorded": versions is not None}

    return router
