"""The ingress's half of autoscaling: it publishes the fleet's signals for Serve's autoscaler
(autoscale_board.py), reads back each slot's phase, routes and calls accordingly, and turns
phase changes into scale events (fleet audit events, /metrics, the dashboard's Fleet page).

Which slots the ingress may call (`callable`): fixed ones (below min_replicas), and those
starting, on, or retiring with work left. A slot with no replica is never called: a call
queued at its handle would make Serve start it (its cold-start path bypasses our policy).
A retiring slot whose last poll and in-flight count say it is idle is not polled again:
that is the moment its policy sends it to 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from control.fleet.autoscale import PHASES, AutoscaleConfig, FleetSignals, SlotSignal, wanted
from control.fleet.autoscale_board import PUBLISH_S, Board, publish_signals, read_slot

log = logging.getLogger("batchpilot.fleet")
EVENTS_KEPT = 200
# phase change -> event name (what the dashboard, metrics and audit rows say)
EVENT_OF = {("off", "starting"): "scale_up", ("starting", "on"): "ready",
            ("on", "retiring"): "scale_down", ("retiring", "on"): "kept",
            ("retiring", "off"): "stopped", ("starting", "off"): "start_failed"}


class FleetScaling:
    def __init__(self, fleet: Any, config: AutoscaleConfig, board: Board | None, app: str):
        """`fleet`: the FleetIngress (its table, restart, control); `board`: None for a
        fixed-size fleet (every slot always on)."""
        self.fleet, self.config, self.board, self.app = fleet, config.validate(), board, app
        n = len(fleet.handles)
        self.phases = ["on" if self.fixed(i) else "off" for i in range(n)]
        self.reasons = ["min_replicas" if self.fixed(i) else "" for i in range(n)]
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self.counts: dict[tuple[int, str, str], int] = {}  # (slot, event, reason): /metrics
        self.config_changes: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)  # PATCHes
        self.last_signals: FleetSignals | None = None

    @property
    def enabled(self) -> bool:
        return self.board is not None and self.config.enabled

    def fixed(self, slot: int) -> bool:
        return self.board is None or slot < self.config.min_replicas

    def routed(self, slot: int) -> bool:
        """New requests may go to it (when healthy)."""
        return self.phases[slot] == "on"

    def callable(self, slot: int) -> bool:
        phase = self.phases[slot]
        if phase == "retiring":
            return not self._idle(slot)
        return phase in ("starting", "on")

    def live_ids(self) -> list[int]:
        return [i for i in range(len(self.phases)) if self.callable(i)]

    def in_flight(self) -> str | None:
        """A scale event still under way (a slot starting or draining), for the 409s of
        a canary or rolling restart; None when every slot is settled."""
        for i, phase in enumerate(self.phases):
            if phase in ("starting", "retiring"):
                return f"replica {i} is {phase} ({self.reasons[i]})"
        return None

    def _idle(self, slot: int) -> bool:
        view = self.fleet.table.views[slot]
        p = view.polled
        return view.inflight == 0 and not p.get("running") and not p.get("waiting")

    # ---- the loop ----------------------------------------------------------------------
    def signals(self, now: float) -> FleetSignals:
        slots = []
        for view in self.fleet.table.views:
            p, i = view.polled if view.healthy else {}, view.replica_id
            slots.append(SlotSignal(i, self.routed(i) and view.routable, view.healthy,
                                    view.inflight, int(p.get("waiting", 0)),
                                    int(p.get("running", 0)), float(p.get("kv_usage", 0.0)),
                                    float(p.get("queue_slo_share", 0.0))))
        return FleetSignals(now, tuple(slots), self.config, self.hold())

    def hold(self) -> str | None:
        restart, canary = self.fleet.restart, self.fleet.control.canary
        if restart is not None and restart.running:
            return f"rolling restart {restart.restart_id}"
        if canary is not None and canary.running:
            return f"canary {canary.canary_id}"
        return None

    async def run_forever(self) -> None:
        """Publish the signals and read the slots' phases every PUBLISH_S, until cancelled."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the board unreachable: phases stay as last read
                log.warning("autoscale: %r", exc)
            await asyncio.sleep(PUBLISH_S)

    async def tick(self) -> None:
        signals = self.signals(time.time())
        self.last_signals = signals
        board = self.board
        assert board is not None

        def exchange() -> list[Any]:
            publish_signals(board, self.app, signals)
            return [None if self.fixed(i) else read_slot(board, self.app, i)
                    for i in range(len(self.phases))]

        for i, state in enumerate(await asyncio.to_thread(exchange)):
            if state is not None and state.phase != self.phases[i]:
                await self.changed(i, self.phases[i], state.phase, state.reason,
                                   state.waited_s)

    async def changed(self, slot: int, old: str, new: str, reason: str,
                      waited_s: float | None = None) -> None:
        """`waited_s`: how long the rule's want had held when the policy acted (>= its
        delay; None for a change no delay gates)."""
        self.phases[slot], self.reasons[slot] = new, reason
        name = EVENT_OF.get((old, new), f"{old}_to_{new}")
        key = (slot, name, reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        live = sum(p == "on" for p in self.phases)
        event = {"time": time.time(), "event": name, "replica_id": slot, "from": old,
                 "to": new, "reason": reason, "waited_s": waited_s, "routed_replicas": live}
        self.events.append(event)
        log.warning("autoscale: replica %d %s -> %s (%s); %d routed", slot, old, new, reason,
                    live)
        control = self.fleet.control
        if control.versions is None and self.fleet.control_api:
            try:  # the fleet's audit events live with its versions, built on first use
                await control.ready()
            except Exception as exc:
                log.warning("autoscale: no fleet audit event for %s: %r", name, exc)
        if control.versions is not None:  # the fleet's audit events (GET /control/history)
            control.versions.event(f"autoscale_{name}", **event)
        if name in ("scale_up", "scale_down"):  # a row in every live replica's trace
            asyncio.ensure_future(control.audit(f"autoscale_{name}", "autoscaler",
                                                {f"replica-{slot}": [old, new]}, str(event)))

    # ---- what readers see --------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        signals = self.last_signals
        want = wanted(signals) if signals is not None and self.enabled else None
        return {"enabled": self.enabled, "config": self.config.to_dict(),
                "wanted": None if want is None else {"replicas": want[0], "reason": want[1]},
                "hold": signals.hold if signals is not None else None,
                "in_flight": self.in_flight(),
                "slots": [{"replica_id": i, "phase": p, "reason": r, "fixed": self.fixed(i)}
                          for i, (p, r) in enumerate(zip(self.phases, self.reasons,
                                                         strict=True))],
                "events": list(self.events), "config_changes": list(self.config_changes)}

    def families(self) -> list[Any]:
        """Prometheus families, every sample labelled by replica (as every fleet series
        is): each slot's phase (1 for the one it is in), and its scale events."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        phases = GaugeMetricFamily(
            "batchpilot_fleet_replica_phase", "1 for the replica slot's autoscaling phase"
            " (off, starting, on, retiring), 0 for the others; a fixed fleet's are on.",
            labels=["replica", "phase"])
        for slot, current in enumerate(self.phases):
            for phase in PHASES:
                phases.add_metric([str(slot), phase], 1.0 if phase == current else 0.0)
        events = CounterMetricFamily(
            "batchpilot_fleet_scale_events",
            "Replica slots that changed autoscaling phase, by slot, event and reason.",
            labels=["replica", "event", "reason"])
        for (slot, name, reason), count in sorted(self.counts.items()):
            events.add_metric([str(slot), name, reason], count)
        return [phases, events]
