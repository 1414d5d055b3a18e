"""The fleet's one control plane, in the ingress: changes become fleet versions
(versioning.py), are checked on every replica, then pushed to each; a reconcile loop pushes
any replica whose polled version is not its target (a restarted one, a failed push).

    PATCH /control/config --> validate (the same apply_patch as one server: same 400s)
                          --> dry run on each healthy replica (lane moves: same 409s)
                          --> record version k --> push k to every replica, concurrently;
                              each installs it between two steps and answers
    every RECONCILE_S     --> a replica reporting != its target gets pushed again

Runs on the ingress's event loop. A replica is reached only by handle
(`install`, `window`, `audit_event`, `control_state`: EngineReplica), never over HTTP, so
the replicas' own control tokens are not needed: the ingress checks the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from control.admin.config_store import ChangeError
from control.fleet.versioning import FleetVersion, FleetVersions
from engine.config import StaticConfig
from engine.config.patch import apply_patch, diff, live_from_dict, live_to_dict

log = logging.getLogger("batchpilot.fleet")
RECONCILE_S = 0.5  # between two checks of every replica's version
RETRY_S = 5.0  # after a push failed, before that replica is pushed again
CALL_TIMEOUT_S = 30.0  # a replica call slower than this counts as failed (it may be dying)

Build = Callable[[FleetVersions], tuple[dict[str, Any], dict[str, list[Any]]]]


class FleetControl:
    def __init__(self, fleet: Any):
        self.fleet = fleet  # FleetIngress: handles, table (polled stats), any_replica()
        n = len(fleet.handles)
        self.versions: FleetVersions | None = None
        self.static: StaticConfig | None = None
        self.profiles: dict[str, dict[str, Any]] = {}
        self.canary: Any = None  # the running or last CanaryRun (canary_run.py)
        self.last_push: list[dict[str, Any]] = [{} for _ in range(n)]
        self._locks = [asyncio.Lock() for _ in range(n)]
        self._retry_at = [0.0] * n
        self._init_lock = asyncio.Lock()
        self.change_lock = asyncio.Lock()  # one change (or canary start/decision) at a time

    # ---- state -------------------------------------------------------------------------
    async def ready(self) -> FleetVersions:
        """The versions, first built from a healthy replica's live config (version 0)."""
        async with self._init_lock:
            if self.versions is None:
                replica_id = self.fleet.any_replica()
                state = await self.fleet.handles[replica_id].control_state.remote()
                if state is None:
                    raise ChangeError(404, "control_off", "the control API is off on this"
                                      " fleet's replicas")
                self.static = StaticConfig(**state["static"])
                self.profiles = state["profiles"]
                self.versions = FleetVersions(state["config"])
            return self.versions

    def runs_target(self, replica_id: int) -> bool:
        """Whether the replica runs the config the fleet means for it (every replica does
        before the fleet has versions: each runs the YAML). A replica Serve restarted or
        autoscaling started comes up on the YAML until the reconcile loop pushes it."""
        versions = self.versions
        return versions is None or self.fleet.table.views[replica_id].polled.get(
            "fleet_version") == versions.target(replica_id)

    def reported(self) -> list[int | None]:
        return [v.polled.get("fleet_version") for v in self.fleet.table.views]

    def convergence(self) -> dict[str, Any]:
        views = self.fleet.table.views
        live = [self.fleet.scaling.callable(v.replica_id) for v in views]
        out = self.versions.convergence(self.reported(), [v.healthy for v in views], live)
        for row, push in zip(out["replicas"], self.last_push, strict=True):
            row["last_push"] = push
        return out

    def refuse_during_canary(self) -> None:
        run = self.canary
        if run is not None and run.running:
            raise ChangeError(409, "canary_running", f"canary {run.canary_id} is running"
                              f" (fleet version {run.version} on replica(s)"
                              f" {', '.join(map(str, run.canaries))}, decision due by"
                              f" {time.strftime('%H:%M:%S', time.localtime(run.deadline))}):"
                              " wait for its decision (GET /control/canary)",
                              canary_id=run.canary_id)

    # ---- building a change -------------------------------------------------------------
    def patched(self, changes: dict[str, Any]) -> Build:
        def build(versions: FleetVersions) -> tuple[dict[str, Any], dict[str, list[Any]]]:
            live = live_from_dict(versions.latest.config)
            try:
                new = apply_patch(live, self.static, changes)
            except ValueError as exc:
                raise ChangeError.invalid(exc) from None
            return live_to_dict(new), diff(live, new)
        return build

    def profile(self, name: str) -> Build:
        if name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none are defined in the YAML"
            raise ChangeError(404, "unknown_profile", f"no profile {name!r}; profiles: {known}")
        return self.patched(self.profiles[name])

    @staticmethod
    def rolled_back(version: int) -> Build:
        def build(versions: FleetVersions) -> tuple[dict[str, Any], dict[str, list[Any]]]:
            target = versions.get(version).config
            return dict(target), diff(live_from_dict(versions.latest.config),
                                      live_from_dict(target))
        return build

    # ---- applying ----------------------------------------------------------------------
    async def change(self, build: Build, *, expected: int | None, actor: str, source: str,
                     reason: str, lane_moves: dict[str, str], dry_run: bool,
                     ) -> dict[str, Any]:
        """A fleet-wide change: checked, recorded as a version, pushed to every replica;
        -> the single server's answer plus each replica's push and the time to converge."""
        versions = await self.ready()
        async with self.change_lock:
            self.refuse_during_canary()
            versions.check_expected(expected)
            config, changes = build(versions)
            await self.check_on_replicas(config, lane_moves, actor)
            if dry_run or not changes:
                return {"applied": False, "version": versions.current, "diff": changes,
                        "config": config}
            entry = versions.record(config, changes, actor=actor, source=source,
                                    reason=reason, lane_moves=lane_moves)
            log.warning("fleet config version %d by %s (%s): %s%s", entry.version, actor,
                        source, changes, f"; reason: {reason}" if reason else "")
            pushed = await self.push_all(self.fleet.live_ids(), actor)
        return {"applied": True, "version": entry.version, "diff": changes, "config": config,
                **pushed}

    async def check_on_replicas(self, config: dict[str, Any], lane_moves: dict[str, str],
                                actor: str, replicas: Any = None) -> None:
        """A dry run on each healthy replica: its refusal (a lane that still has requests)
        is the answer, in one server's words, naming the replica."""
        views = self.fleet.table.views
        ids = [v.replica_id for v in views if v.healthy and (replicas is None
                                                              or v.replica_id in replicas)]
        answers = await asyncio.gather(*(self._install(i, config, -1, actor=actor,
                                                       source="check", reason="",
                                                       lane_moves=lane_moves, dry_run=True)
                                         for i in ids))
        for i, answer in zip(ids, answers, strict=True):
            if not answer.get("ok"):
                raise ChangeError(answer.get("status", 502), answer.get("code", "replica"),
                                  f"replica {i}: {answer.get('message')}",
                                  **answer.get("extra", {}))

    async def push_all(self, replica_ids: Any, actor: str) -> dict[str, Any]:
        """Push each replica its target, concurrently; -> per replica and the time the
        slowest took (recorded -> installed between two steps, s)."""
        views = self.fleet.table.views
        results = await asyncio.gather(*(
            self.sync_replica(i, actor) if views[i].healthy else _down(i)
            for i in replica_ids))
        ok = [r for r in results if r.get("ok")]
        return {"replicas": results, "converged": len(ok) == len(results),
                "converge_s": max((r["applied_s"] for r in ok), default=0.0)
                if len(ok) == len(results) else None}

    async def sync_replica(self, replica_id: int, actor: str,
                           reason: str = "") -> dict[str, Any]:
        """Install the replica's target version (read under its lock: the newest wins)."""
        async with self._locks[replica_id]:
            start = time.monotonic()
            entry: FleetVersion = self.versions.get(self.versions.target(replica_id))
            answer = await self._install(replica_id, entry.config, entry.version, actor=actor,
                                         source=f"fleet:{entry.version}",
                                         reason=reason or entry.reason,
                                         lane_moves=entry.lane_moves, dry_run=False)
            answer["applied_s"] = time.monotonic() - start
            if answer.get("ok"):
                view = self.fleet.table.views[replica_id]
                view.polled["fleet_version"] = entry.version
                view.pushed = (time.monotonic(), entry.version)
            else:
                self._retry_at[replica_id] = time.monotonic() + RETRY_S
                log.warning("replica %d did not take fleet version %d: %s", replica_id,
                            entry.version, answer.get("message"))
            self.last_push[replica_id] = {"version": entry.version, "ok": answer.get("ok"),
                                          "time": time.time(),
                                          "error": answer.get("message")}
            return answer

    async def _install(self, replica_id: int, config: dict[str, Any], version: int,
                       **kwargs: Any) -> dict[str, Any]:
        try:
            answer = await asyncio.wait_for(self.fleet.handles[replica_id].install.remote(
                config, version, **kwargs), CALL_TIMEOUT_S)
        except Exception as exc:  # down or restarting: the reconcile loop pushes it later
            answer = {"ok": False, "status": 503, "code": "replica_unavailable",
                      "message": f"replica {replica_id} is not available ({exc!r})"}
        return {"replica_id": replica_id, **answer}

    async def reconcile_forever(self, every_s: float = RECONCILE_S) -> None:
        """Until cancelled: push every healthy replica that reports another version than
        its target (a restarted replica reports 0) and is not being pushed already."""
        while True:
            await asyncio.sleep(every_s)
            if self.versions is None:
                continue
            now = time.monotonic()
            for view, version in zip(self.fleet.table.views, self.reported(), strict=True):
                i = view.replica_id
                if (view.healthy and version != self.versions.target(i)
                        and not self._locks[i].locked() and now >= self._retry_at[i]):
                    asyncio.ensure_future(self.sync_replica(i, "fleet", "reconcile"))

    async def audit(self, source: str, actor: str, change: dict[str, Any],
                    note: str) -> None:
        """A control decision as a config_changes row in every replica's trace."""
        async def one(handle: Any) -> None:
            try:
                await asyncio.wait_for(handle.audit_event.remote(source, actor, change, note),
                                       CALL_TIMEOUT_S)
            except Exception as exc:  # a replica that is down misses it: say so
                log.warning("could not record %s on a replica: %r", source, exc)

        await asyncio.gather(*(one(self.fleet.handles[i]) for i in self.fleet.live_ids()))


async def _down(replica_id: int) -> dict[str, Any]:
    """A replica that is down is not called (that could wait for a timeout): the reconcile
    loop pushes it its target once its poll answers again."""
    return {"replica_id": replica_id, "ok": False, "status": 503, "code": "replica_down",
            "message": f"replica {replica_id} is down; it gets this version when it is back"}
