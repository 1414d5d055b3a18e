"""What a fleet replica adds to each step, on the engine thread: the fleet config version
stamped on the StepRecord (so the trace says which fleet version every step ran under), and
a window of recently ended requests the ingress compares a canary against the rest with.

    AsyncEngine._step -> FleetTee.on_step(engine, out) -> the server's Observer (metrics,
                         | record.fleet_version = store.fleet_version        trace rows)
                         | ended requests -> RequestWindow (bounded deque)

The fleet version changes only on the engine thread between two steps (ConfigStore installs
it with the config it names), so the stamp read here is the one the step ran under.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from engine.config import LiveConfig
from engine.records import StepOutput

WINDOW_LIMIT = 200_000  # ended requests kept (~a few MB); a window older than that is cut


class RequestWindow:
    """Ended requests as (end time s since epoch, outcome, ttft_s, tpot_s, good, fleet
    version). `good`: finished (stop or length) within its own deadline, if it had one,
    and meeting its lane's SLO (engine/config/slo.py) in the config it ended under."""

    def __init__(self, limit: int = WINDOW_LIMIT):
        self.entries: deque[tuple[float, str, float | None, float | None, bool, int | None]] \
            = deque(maxlen=limit)

    def add(self, out: StepOutput, fleet_version: int | None,
            live: LiveConfig | None = None) -> None:
        """Engine thread: the step's ended requests and its rejections at arrival; `live`:
        the installed config (its lanes' SLOs)."""
        for rec in out.finished:
            end = rec.finished_time or time.time()
            good = rec.outcome == "finished" and (rec.deadline is None or end <= rec.deadline)
            if good and live is not None and rec.lane in live.lane_names:
                good = live.lane_slo(live.lane(rec.lane)).met(rec.ttft_s, rec.tpot_s)
            self.entries.append((end, rec.outcome, rec.ttft_s, rec.tpot_s, good,
                                 fleet_version))
        for decision in out.admissions:
            if not decision.accepted:
                self.entries.append((decision.time or time.time(), "rejected", None, None,
                                     False, fleet_version))

    def since(self, start: float, fleet_version: int | None = None) -> dict[str, Any]:
        """Requests that ended at or after `start` (under `fleet_version`, when given):
        {"outcomes": {outcome: n}, "good": n, "ttft": [s...], "tpot": [s...]}; latencies of
        finished requests only. Raw samples, so the ingress can pool replicas' p99s."""
        outcomes: dict[str, int] = {}
        ttft: list[float] = []
        tpot: list[float] = []
        good = 0
        for end, outcome, t1, t2, ok, fv in list(self.entries):  # a copy: the engine appends
            if end < start or (fleet_version is not None and fv != fleet_version):
                continue
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            good += ok
            if outcome == "finished":
                if t1 is not None:
                    ttft.append(t1)
                if t2 is not None:
                    tpot.append(t2)
        return {"outcomes": outcomes, "good": good, "ttft": ttft, "tpot": tpot}


class FleetTee:
    """Wraps the server's Observer (or None) as the engine loop's observer."""

    def __init__(self, inner: Any, store: Any, window: RequestWindow | None = None):
        self.inner, self.store = inner, store
        self.window = window or RequestWindow()

    @property
    def fleet_version(self) -> int | None:
        return self.store.fleet_version if self.store is not None else None

    def on_step(self, engine: Any, out: StepOutput) -> None:
        version = self.fleet_version
        if out.record is not None:
            out.record.fleet_version = version
        self.window.add(out, version, getattr(engine, "live_config", None))
        if self.inner is not None:
            self.inner.on_step(engine, out)

    def on_change(self, engine: Any) -> None:
        if self.inner is not None:
            self.inner.on_change(engine)
