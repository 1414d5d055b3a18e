"""A canary rollout, run by the ingress (not the CLI: it completes if the caller leaves).

    start  check the change (as a fleet change), record it as version k (not current),
           pin k on N healthy replicas, push it to them; the window opens once they run it
    poll   every poll_s: each side's requests that ended in the window under its version
           (canaries: k, baseline: the current version) -> canary.py's rule
    end    promote: k becomes current, the rest are pushed k | roll back: the canaries go
           back to the current version; either way the evidence (both sides' figures, the
           thresholds, the decision) goes to the fleet's audit events and, as a
           config_changes row, into every replica's trace
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from control.admin.config_store import ChangeError
from control.fleet.canary import CanaryRule, SideStats, Verdict, decide, side_stats
from control.fleet.control_plane import CALL_TIMEOUT_S, FleetControl

log = logging.getLogger("batchpilot.fleet")
MAX_WATCH_S = 24 * 3600.0
POLLS_KEPT = 500


def poll_every(watch_s: float) -> float:
    """About ten polls a window, 1 to 15 s apart."""
    return min(max(watch_s / 10, 1.0), 15.0)


class CanaryRun:
    def __init__(self, control: FleetControl, *, version: int, base_version: int,
                 canaries: list[int], baseline: list[int], watch_s: float, rule: CanaryRule,
                 actor: str, reason: str, diff: dict[str, list[Any]],
                 poll_s: float | None = None):
        self.control, self.version, self.base_version = control, version, base_version
        self.canary_id = f"canary-{version}"
        self.canaries, self.baseline = canaries, baseline
        self.watch_s, self.rule, self.actor, self.reason, self.diff = (
            watch_s, rule, actor, reason, diff)
        self.poll_s = poll_s or poll_every(watch_s)
        self.status = "watching"  # watching | promoted | rolled_back
        self.started = self.window_start = time.time()
        self.deadline = self.window_start + watch_s
        self.extensions = 0
        self.polls: list[dict[str, Any]] = []
        self.decision: dict[str, Any] | None = None
        self.task: asyncio.Future | None = None

    @property
    def running(self) -> bool:
        return self.status == "watching"

    def to_dict(self) -> dict[str, Any]:
        return {"canary_id": self.canary_id, "status": self.status, "version": self.version,
                "base_version": self.base_version, "canaries": self.canaries,
                "baseline": self.baseline, "watch_s": self.watch_s, "poll_s": self.poll_s,
                "started": self.started, "window_start": self.window_start,
                "deadline": self.deadline, "extensions": self.extensions,
                "actor": self.actor, "reason": self.reason, "diff": self.diff,
                "thresholds": asdict(self.rule), "polls": self.polls,
                "decision": self.decision}

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(max(0.0, min(self.poll_s, self.deadline - time.time())))
                verdict, canary, baseline = await self.poll()
                if verdict.decision == "extend":
                    self.deadline += self.watch_s
                    self.extensions += 1
                elif verdict.decision in ("promote", "rollback"):
                    await self.finish(verdict, canary, baseline)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave canaries pinned to a change nobody watches
            log.exception("canary %s failed; rolling back", self.canary_id)
            await self.finish(Verdict("rollback", f"the canary itself failed ({exc!r})", []),
                              None, None)

    async def poll(self) -> tuple[Verdict, SideStats, SideStats]:
        now = time.time()
        duration = max(now - self.window_start, 1e-9)
        canary = await self._side(self.canaries, self.version, duration)
        baseline = await self._side(self.baseline, self.base_version, duration)
        verdict = decide(canary, baseline, self.rule, window_over=now >= self.deadline,
                         extensions=self.extensions)
        self.polls.append({"time": now, "elapsed_s": now - self.window_start,
                           "canary": canary.to_dict(), "baseline": baseline.to_dict(),
                           **verdict.to_dict()})
        del self.polls[:-POLLS_KEPT]
        return verdict, canary, baseline

    async def _side(self, replicas: list[int], version: int, duration: float) -> SideStats:
        handles = self.control.fleet.handles

        async def one(i: int) -> dict[str, Any] | None:
            try:
                return await asyncio.wait_for(
                    handles[i].window.remote(self.window_start, version), CALL_TIMEOUT_S)
            except Exception as exc:  # a replica that is down adds nothing to its side
                log.warning("canary %s: replica %d's window: %r", self.canary_id, i, exc)
                return None

        windows = await asyncio.gather(*(one(i) for i in replicas))
        return side_stats([w for w in windows if w is not None], replicas, duration)

    async def finish(self, verdict: Verdict, canary: SideStats | None,
                     baseline: SideStats | None) -> None:
        control = self.control
        promote = verdict.decision == "promote"
        async with control.change_lock:
            versions = control.versions
            for i in self.canaries:
                versions.pinned.pop(i, None)
            if promote:
                versions.current = self.version
            status = "promoted" if promote else "rolled_back"
            decision = {
                "canary_id": self.canary_id, "decision": status, "why": verdict.why,
                "version": self.version, "base_version": self.base_version,
                "fleet_version": versions.current, "time": time.time(),
                "window_s": time.time() - self.window_start, "extensions": self.extensions,
                "canary": canary.to_dict() if canary else None,
                "baseline": baseline.to_dict() if baseline else None,
                "thresholds": asdict(self.rule),
                "checks": [c.to_dict() for c in verdict.checks]}
            log.warning("canary %s: %s (%s)", self.canary_id, status, verdict.why)
            targets = control.fleet.live_ids() if promote else self.canaries
            pushed = await control.push_all(targets, "canary")
            decision["converged"] = pushed["converged"]
            decision["converge_s"] = pushed["converge_s"]
            versions.event(f"canary_{'promote' if promote else 'rollback'}", **decision)
            # NOTE: the status changes last: a reader that sees the verdict sees it applied
            self.decision, self.status = decision, status
        await control.audit(f"canary_{'promote' if promote else 'rollback'}", self.actor,
                            {"fleet_version": [self.base_version, versions.current]},
                            json.dumps(decision, default=str))


async def start_canary(control: FleetControl, changes: dict[str, Any], *,
                       expected: int | None, actor: str, reason: str,
                       lane_moves: dict[str, str], replicas: int, watch_s: float,
                       rule: CanaryRule, poll_s: float | None = None) -> CanaryRun:
    """Check, record and push the candidate to `replicas` canaries; start watching.
    Raises ChangeError with the status one server would give (400, 409, 412)."""
    versions = await control.ready()
    async with control.change_lock:
        control.refuse_during_canary()
        control.fleet.refuse_during_restart()  # a restart takes replicas out one by one
        control.fleet.refuse_during_scaling()  # a slot starting or draining under it
        versions.check_expected(expected)
        live = control.fleet.live_ids()
        n = len(live)
        if n < 2:
            raise ChangeError(409, "too_few_replicas", f"a canary needs 2 live replicas or"
                              f" more (one takes the change, the rest are the baseline); the"
                              f" fleet has {n}", param="replicas")
        if not 1 <= replicas < n:
            raise ChangeError(400, "invalid_value", f"replicas={replicas} must be 1..{n - 1}:"
                              f" the fleet has {n} replica(s) and the rest are the baseline",
                              param="replicas")
        if not 0 < watch_s <= MAX_WATCH_S:
            raise ChangeError(400, "invalid_value", f"watch_s={watch_s} must be in (0,"
                              f" {MAX_WATCH_S:.0f}]", param="watch_s")
        healthy = [v.replica_id for v in control.fleet.table.views if v.healthy]
        if len(healthy) < replicas + 1:
            raise ChangeError(503, "no_replica", f"a canary on {replicas} replica(s) needs"
                              f" {replicas + 1} healthy ones; {len(healthy)} are")
        config, diff = control.patched(changes)(versions)
        if not diff:
            raise ChangeError(400, "invalid_value", "the change sets every setting to its"
                              " current value: there is nothing to canary", param="changes")
        canaries = healthy[:replicas]
        await control.check_on_replicas(config, lane_moves, actor, replicas=canaries)
        entry = versions.record(config, diff, actor=actor, source="canary", reason=reason,
                                lane_moves=lane_moves, make_current=False)
        versions.pinned.update(dict.fromkeys(canaries, entry.version))
        pushed = await control.push_all(canaries, actor)
        if not pushed["converged"]:
            for i in canaries:
                versions.pinned.pop(i, None)
            await control.push_all(canaries, actor)
            raise ChangeError(502, "canary_failed", "the canary replicas did not take the"
                              f" change: {pushed['replicas']}")
        run = CanaryRun(control, version=entry.version, base_version=versions.current,
                        canaries=canaries, baseline=[i for i in live if i not in canaries],
                        watch_s=watch_s, rule=rule, actor=actor, reason=reason, diff=diff,
                        poll_s=poll_s)
        versions.event("canary_start", canary_id=run.canary_id, version=entry.version,
                       base_version=versions.current, canaries=canaries, watch_s=watch_s,
                       actor=actor, reason=reason, diff=diff, thresholds=asdict(rule))
        control.canary = run
        run.task = asyncio.ensure_future(run.run())
    await control.audit("canary_start", actor, {"fleet_version": [versions.current,
                                                                  entry.version]},
                        json.dumps({"canary_id": run.canary_id, "canaries": canaries,
                                    "watch_s": watch_s, "diff": diff}, default=str))
    return run
