"""The fleet's config as versions: desired state the ingress holds, replicas converge to.

    version 0   the YAML every replica starts from (a restarted replica runs it again)
    version k   a whole live config (`live_to_dict` form) + who, when, why, what changed

Every replica has a target version: the fleet's current one, or, while a canary runs, the
canary's candidate for the replicas it was given to. The ingress pushes each replica its
target's whole config (`EngineReplica.install`: idempotent, whatever the replica ran
before), and keeps pushing until the replica reports that version in its polled stats:
that is how a change, a rollback, a promotion and a restarted replica all converge.

Pure data here (no I/O, tested as such); control/fleet/control_plane.py does the pushing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from control.admin.config_store import ChangeError

HISTORY_LIMIT = 1000  # versions kept (the replicas' traces keep every install)


@dataclass(frozen=True)
class FleetVersion:
    version: int
    time: float  # s since the epoch, when recorded
    actor: str
    source: str  # startup | api | profile:NAME | rollback:V | canary
    reason: str
    diff: dict[str, list[Any]]  # dotted key -> [old, new], against the version before
    config: dict[str, Any]  # the whole live config (live_to_dict)
    lane_moves: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"version": self.version, "time": self.time, "actor": self.actor,
                "source": self.source, "reason": self.reason, "diff": self.diff}


class FleetVersions:
    """The history, the current version, canary pins, and the audit events."""

    def __init__(self, base_config: dict[str, Any], clock: Callable[[], float] = time.time):
        self.clock = clock
        self.history = [FleetVersion(0, clock(), "fleet", "startup", "", {}, base_config)]
        self.current = 0  # what every replica runs unless pinned to a canary candidate
        self.pinned: dict[int, int] = {}  # replica id -> candidate version (a canary)
        self.events: list[dict[str, Any]] = []  # canary starts and verdicts, with evidence

    def get(self, version: int) -> FleetVersion:
        for entry in self.history:
            if entry.version == version:
                return entry
        kept = f"{self.history[0].version}..{self.history[-1].version}"
        raise ChangeError(404, "unknown_version", f"no fleet version {version} in the"
                          f" history (kept: {kept})")

    @property
    def latest(self) -> FleetVersion:
        return self.get(self.current)

    def record(self, config: dict[str, Any], diff: dict[str, list[Any]], *, actor: str,
               source: str, reason: str, lane_moves: dict[str, str] | None = None,
               make_current: bool = True) -> FleetVersion:
        """A new version (numbers only grow, a canary's candidate included)."""
        entry = FleetVersion(self.history[-1].version + 1, self.clock(), actor, source,
                             reason, diff, config, dict(lane_moves or {}))
        self.history.append(entry)
        del self.history[1:-HISTORY_LIMIT]  # version 0 stays: a restart's baseline
        if make_current:
            self.current = entry.version
        return entry

    def target(self, replica_id: int) -> int:
        return self.pinned.get(replica_id, self.current)

    def check_expected(self, expected: int | None) -> None:
        if expected is not None and expected != self.current:
            raise ChangeError(412, "version_mismatch", f"the fleet config is at version"
                              f" {self.current}, not {expected}: someone changed it; read it"
                              " again and retry", current_version=self.current)

    def event(self, kind: str, **details: Any) -> dict[str, Any]:
        entry = {"time": self.clock(), "kind": kind, **details}
        self.events.append(entry)
        del self.events[:-HISTORY_LIMIT]
        return entry

    def convergence(self, reported: list[int | None], healthy: list[bool],
                    live: list[bool] | None = None) -> dict[str, Any]:
        """Each replica's version against its target. Converged: every live replica runs
        its target (one that is down is not: it will be pushed once up). `live[i]` False:
        autoscaling has slot i off, with no replica to run anything (it gets the target
        when it starts, before it is routed to); shown, not waited for."""
        live = live or [True] * len(reported)
        replicas = [{"replica_id": i, "fleet_version": v, "target_version": self.target(i),
                     "healthy": ok, "live": on}
                    for i, (v, ok, on) in enumerate(zip(reported, healthy, live, strict=True))]
        converged = all(r["fleet_version"] == r["target_version"] and r["healthy"]
                        for r in replicas if r["live"])
        return {"fleet_version": self.current, "converged": converged, "replicas": replicas}


async def install_on(store: Any, config: dict[str, Any], fleet_version: int,
                     kwargs: dict[str, Any]) -> dict[str, Any]:
    """The replica's side of a push (EngineReplica.install): a refusal is returned as data,
    not raised, so it crosses Ray as the same status, code and message one server gives."""
    if store is None:
        return {"ok": False, "status": 404, "code": "control_off",
                "message": "the control API is off on this replica"}
    try:
        result = await store.install_fleet(config, fleet_version, **kwargs)
    except ChangeError as exc:  # its extra (a `param`, the current version) goes along too
        return {"ok": False, "status": exc.status, "code": exc.code, "message": exc.message,
                "extra": exc.extra}
    return {"ok": True, "applied": result.applied, "config_version": result.version,
            "fleet_version": fleet_version, "diff": result.diff}
