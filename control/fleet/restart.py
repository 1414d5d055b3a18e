"""A rolling restart, run by the ingress (like a canary: it completes if the caller leaves).

For each replica in turn (the next starts only once this one is back):

    drain     exclude it from routing (requests already sent to it finish there); wait
              until the ingress has none in flight to it, up to `grace_s`
    restart   `retire(grace left)` on the replica: its own drain ends what is left (finish
              reason "cancelled"; counted as aborted), then its `check_health` fails and
              Ray Serve stops that process and starts a new one, which loads the model
    ready     wait until it polls ready as a NEW incarnation and runs its target fleet
              version (the reconcile loop pushes it: control_plane.py); routed to again

    POST /control/fleet/restart   {"grace_s", "ready_timeout_s", "replicas"?, "reason"}
                                  -> 202 {"restart": ...}; admin token; 409 while one runs
                                  (restart_running) or a canary runs (canary_running)
    GET  /control/fleet/restart   the running restart, else the last one (or null)

A replica is restarted only while another one is routable, so the fleet always has one to
serve. A replica that does not come back within `ready_timeout_s` fails the restart (the
rest are left alone) and is put back into routing, to be used when Serve brings it up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from control.api.errors import APIError
from control.fleet.control_routes import fleet_caller

log = logging.getLogger("batchpilot.fleet")
WAIT_POLL_S = 0.05
RETIRE_SLACK_S = 30.0  # on top of the grace: the replica's abort flush, a slow handle call


class RestartFailed(Exception):
    """A replica did not drain or come back in time: the restart stops there."""


class RestartBody(BaseModel):
    # a misspelt field (grace for grace_s) or a guessable type (true for 1) is a 400: a
    # restart of every replica must not start on what the caller did not mean
    model_config = ConfigDict(extra="forbid", strict=True)
    grace_s: float = Field(default=30.0, ge=0, le=3600,
                           description="how long requests in flight on a replica may run")
    ready_timeout_s: float = Field(default=300.0, gt=0, le=3600,
                                   description="per replica: retired -> back, ready")
    replicas: list[int] | None = Field(default=None, max_length=1024,
                                       description="ids, in order; default all")
    reason: str = Field(default="", max_length=2000)


class RestartRun:
    def __init__(self, fleet: Any, replicas: list[int], grace_s: float,
                 ready_timeout_s: float, actor: str, reason: str, number: int):
        self.fleet, self.grace_s, self.ready_timeout_s = fleet, grace_s, ready_timeout_s
        self.restart_id = f"restart-{number}"
        self.actor, self.reason = actor, reason
        self.status = "running"  # running | done | failed
        self.started, self.finished = time.time(), None
        self.error: str | None = None
        self.steps = [{"replica_id": i, "phase": "waiting", "aborted": 0, "drain_s": None,
                       "restart_s": None, "spawn_s": None, "ready_s": None, "old": None,
                       "new": None}
                      for i in replicas]
        self.events: list[dict[str, Any]] = []  # one per phase per replica: the CLI prints
        self.task: asyncio.Future | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def aborted(self) -> int:
        return sum(step["aborted"] for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {"restart_id": self.restart_id, "status": self.status, "grace_s": self.grace_s,
                "ready_timeout_s": self.ready_timeout_s, "actor": self.actor,
                "reason": self.reason, "started": self.started, "finished": self.finished,
                "aborted": self.aborted, "error": self.error, "steps": self.steps,
                "events": self.events}

    def say(self, step: dict[str, Any], phase: str, message: str) -> None:
        step["phase"] = phase
        self.events.append({"time": time.time(), "replica_id": step["replica_id"],
                            "phase": phase, "message": message})
        log.warning("%s: replica %d: %s", self.restart_id, step["replica_id"], message)

    async def run(self) -> None:
        try:
            for step in self.steps:
                await self.restart_one(step)
            self.status = "done"
        except asyncio.CancelledError:
            self.status, self.error = "failed", "cancelled (the ingress stopped)"
            raise
        except Exception as exc:  # RestartFailed, or a bug: say so, never hang the caller
            self.status, self.error = "failed", str(exc)
            if not isinstance(exc, RestartFailed):
                log.exception("%s failed", self.restart_id)
        finally:
            for step in self.steps:  # a replica that failed to come back gets traffic
                self.fleet.table.include(step["replica_id"])  # once Serve brings it up
            self.finished = time.time()
            self._record_event("restart_end")

    async def restart_one(self, step: dict[str, Any]) -> None:
        i, table = step["replica_id"], self.fleet.table
        view = table.views[i]
        await self._until(lambda: view.healthy, f"replica {i} to be healthy before its"
                          " restart")
        await self._until(lambda: any(v.healthy and v.routable for v in table.views
                                      if v.replica_id != i),
                          f"another replica to serve while replica {i} restarts")
        step["old"] = _incarnation(view.polled)
        start = time.monotonic()
        table.exclude(i)
        self.say(step, "draining", f"out of routing; {view.inflight} request(s) in flight")
        deadline = start + self.grace_s
        while view.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(WAIT_POLL_S)
        left = max(0.0, deadline - time.monotonic())
        try:  # the replica's own drain ends what is left, then it fails its health checks
            step["aborted"] = int(await asyncio.wait_for(
                self.fleet.handles[i].retire.remote(left), left + RETIRE_SLACK_S))
        except Exception as exc:  # it died meanwhile: Serve is replacing it anyway
            log.warning("%s: replica %d's retire failed: %r", self.restart_id, i, exc)
        step["drain_s"], retired_at = time.monotonic() - start, time.time()
        self.say(step, "restarting", f"drained in {step['drain_s']:.2f} s, {step['aborted']}"
                 f" aborted; Ray Serve replaces pid {step['old']['pid']}")
        start = time.monotonic()
        await self._until(lambda: view.healthy and _incarnation(view.polled)["incarnation"]
                          not in (None, step["old"]["incarnation"]),
                          f"replica {i} to come back as a new process")
        step["restart_s"], step["new"] = time.monotonic() - start, _incarnation(view.polled)
        # retired -> Serve started the new process (its health checks failed, the old one
        # stopped) -> it loaded the model and answered ready
        step["spawn_s"] = (step["new"]["started_at"] or retired_at) - retired_at
        self.say(step, "converging", f"new process ready in {step['restart_s']:.2f} s (pid"
                 f" {step['new']['pid']} started {step['spawn_s']:.2f} s after retiring the"
                 " old one); installing the fleet's config version")
        start = time.monotonic()
        await self._until(lambda: self._converged(i), f"replica {i} to run the fleet's"
                          " config version")
        step["ready_s"] = time.monotonic() - start
        table.include(i)
        self.say(step, "done", f"back in routing in {step['ready_s']:.2f} s; "
                 f"{step['drain_s'] + step['restart_s'] + step['ready_s']:.2f} s in all")

    def _converged(self, replica_id: int) -> bool:
        versions = self.fleet.control.versions
        view = self.fleet.table.views[replica_id]
        if versions is None:  # no control plane: every replica runs the YAML
            return view.healthy
        return view.healthy and view.polled.get("fleet_version") == versions.target(replica_id)

    async def _until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RestartFailed(f"timed out after {self.ready_timeout_s:g} s waiting for"
                                    f" {what}")
            await asyncio.sleep(WAIT_POLL_S)

    def _record_event(self, kind: str) -> None:
        versions = self.fleet.control.versions
        if versions is not None:  # the fleet's audit events (GET /control/history)
            versions.event(kind, restart_id=self.restart_id, status=self.status,
                           actor=self.actor, reason=self.reason, aborted=self.aborted,
                           error=self.error, steps=[dict(s) for s in self.steps])


def _incarnation(polled: dict[str, Any]) -> dict[str, Any]:
    return {"incarnation": polled.get("incarnation"), "pid": polled.get("pid"),
            "started_at": polled.get("started_at")}


async def start_restart(fleet: Any, body: RestartBody, actor: str) -> RestartRun:
    """Check and start a rolling restart; APIError with the status to answer."""
    n, live = len(fleet.handles), fleet.live_ids()
    replicas = live if body.replicas is None else body.replicas
    if len(live) < 2:
        raise APIError(409, "a rolling restart needs 2 or more replicas: with one, its"
                       " requests would have nowhere to go", code="single_replica")
    if not replicas or len(set(replicas)) != len(replicas) or \
            not all(0 <= i < n for i in replicas):
        raise APIError(400, f"replicas={replicas} must be distinct replica ids in 0..{n - 1}",
                       code="invalid_value", param="replicas")
    off = [i for i in replicas if i not in live]
    if off:
        raise APIError(409, f"replica(s) {off} are scaled in (autoscaling has no replica in"
                       f" their slots); live: {live}", code="scaled_in", param="replicas")
    if fleet.draining:
        raise APIError(503, "the fleet is draining (shutting down)", code="draining")
    control = fleet.control
    if fleet.control_api:
        await control.ready()  # the versions a restarted replica must converge to
    async with control.change_lock:  # a canary starting now has set control.canary
        fleet.refuse_during_restart()
        fleet.refuse_during_scaling()
        run_ = control.canary
        if run_ is not None and run_.running:
            raise APIError(409, f"canary {run_.canary_id} is running: a restart would take"
                           " its replicas out from under it; wait for its decision (GET"
                           " /control/canary)", code="canary_running",
                           extra={"canary_id": run_.canary_id})
        fleet.restarts += 1
        run = RestartRun(fleet, replicas, body.grace_s, body.ready_timeout_s, actor,
                         body.reason, fleet.restarts)
        fleet.restart = run
        run._record_event("restart_start")
        run.task = asyncio.ensure_future(run.run())
    return run


def restart_router(fleet: Any) -> APIRouter:
    """`fleet`: the FleetIngress (its `restart`, `control`, `control_tokens`)."""
    router = APIRouter(prefix="/control/fleet")

    def caller(request: Request, scope: str) -> str:
        return fleet_caller(fleet, request, scope)

    @router.post("/restart")
    async def restart(request: Request, body: RestartBody | None = None) -> JSONResponse:
        actor = caller(request, "admin")
        run = await start_restart(fleet, body or RestartBody(), actor)
        return JSONResponse({"restart": run.to_dict()}, status_code=202)

    @router.get("/restart")
    async def restart_state(request: Request) -> dict[str, Any]:
        caller(request, "read")
        return {"restart": fleet.restart.to_dict() if fleet.restart else None}

    return router
