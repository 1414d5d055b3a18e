"""When the fleet wants one replica more or one fewer, and what each replica slot does about
it: pure functions over the ingress's signals, run by Ray Serve's autoscaler
(autoscale_policy.py) and tested as tables without Ray.

A fleet of `min_replicas`..`max_replicas` is `max_replicas` slots (Serve deployments
`replica-<id>`, app.py). Slots below `min_replicas` always run one replica. Each slot above
runs 0 or 1, and Serve asks `slot_step` for it every control-loop tick:

    off --(wanted for upscale_delay_s)--> starting --(polled ready)--> on
    starting --(not ready after START_TIMEOUT_S)--> off
    on --(unwanted for downscale_delay_s)--> retiring --(nothing in flight)--> off
    retiring --(wanted again)--> on

`retiring` is the drain: the ingress routes nothing new to the slot (it reads the phase
from the board, autoscale_board.py) while the slot still returns 1 replica, and the slot
goes to 0 only once the ingress reports no request in flight to it and the replica reports
none running or waiting. Serve never stops a replica with work on it, so no request is
lost or cut short by a scale-down.

Wanted replicas (`wanted`), over the replicas routed to (on and ready), n of them:
- more on pressure: waiting requests per replica >= up_waiting (as many as bring the
  waiting under up_waiting a replica, up to max_replicas: a burst starts several slots at
  once), or one more (n + 1) when a queued request has spent >= up_queue_share of its
  lane's TTFT target waiting, or mean KV usage >= up_kv_usage;
- one fewer (n - 1) when idle: nothing waiting and what runs would fit n - 1 replicas at
  <= down_running each, with mean KV usage <= down_kv_usage;
- else n. The gap between the two thresholds is the hysteresis; the delays are its time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.config.known_keys import did_you_mean

PHASES = ("off", "starting", "on", "retiring")
STALE_S = 10.0  # signals older than this (the ingress is gone): every slot holds
RETIRE_SETTLE_S = 1.5  # > two of the ingress's publish periods (autoscale_board.py)
START_TIMEOUT_S = 900.0  # a slot not ready this long after it started goes back to off


@dataclass(frozen=True)
class AutoscaleConfig:
    min_replicas: int = 1
    max_replicas: int = 1  # == min_replicas: a fixed-size fleet
    up_waiting: float = 2.0  # mean waiting requests per routed replica
    up_queue_share: float = 0.5  # longest queue wait / its lane's TTFT target
    up_kv_usage: float = 0.85  # mean KV usage of the routed replicas
    down_running: float = 1.0  # running requests per replica of the smaller fleet, at most
    down_kv_usage: float = 0.3
    upscale_delay_s: float = 5.0  # pressure held this long before a slot starts
    downscale_delay_s: float = 30.0  # idle this long before a slot starts to drain

    @property
    def enabled(self) -> bool:
        return self.max_replicas > self.min_replicas

    def validate(self) -> AutoscaleConfig:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} and max_replicas="
                             f"{self.max_replicas} must satisfy 1 <= min <= max")
        for name in ("up_waiting", "up_queue_share", "down_running", "upscale_delay_s",
                     "downscale_delay_s"):
            value = getattr(self, name)
            if not 0.0 <= value < float("inf"):
                raise ValueError(f"autoscale.{name}={value} must be a number >= 0")
        for name in ("up_kv_usage", "down_kv_usage"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"autoscale.{name}={getattr(self, name)} must be in 0..1")
        if self.down_kv_usage >= self.up_kv_usage:
            raise ValueError(f"autoscale.down_kv_usage={self.down_kv_usage} must be below"
                             f" up_kv_usage={self.up_kv_usage} (else the fleet flaps)")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, changes: dict[str, Any]) -> AutoscaleConfig:
        """A copy with `changes` (JSON: names and numbers) applied and validated; unknown
        names and wrong types are a ValueError naming them, never ignored."""
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"unknown autoscale setting(s) {unknown}"
                             f"{did_you_mean(unknown, fields)}; known: {sorted(fields)}")
        typed: dict[str, Any] = {}
        for name, value in changes.items():
            want_int = fields[name] == "int"
            if isinstance(value, bool) or not isinstance(value, int | float) or (
                    want_int and not isinstance(value, int)):
                raise ValueError(f"autoscale.{name}={value!r} must be "
                                 f"{'an integer' if want_int else 'a number'}")
            typed[name] = value if want_int else float(value)
        return dataclasses.replace(self, **typed).validate()


def parse_settings(items: list[str], flag: str) -> dict[str, float]:
    """A command line's NAME=NUMBER items (`flag`: the option, for the message) ->
    {name: number}; ValueError naming the item. AutoscaleConfig.replace checks the names."""
    changes = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            changes[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{flag} {item!r} must be NAME=NUMBER") from None
    return changes


@dataclass(frozen=True)
class SlotSignal:
    """One slot as the ingress sees it (its last poll, its own in-flight count)."""
    slot: int
    routed: bool  # the ingress routes new requests to it (on or fixed, and ready)
    ready: bool  # its last poll answered ready
    inflight: int = 0  # requests the ingress has open on it
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    queue_slo_share: float = 0.0


@dataclass(frozen=True)
class FleetSignals:
    at: float  # time.time() the ingress published them
    slots: tuple[SlotSignal, ...]
    config: AutoscaleConfig
    hold: str | None = None  # a canary or rolling restart runs: no slot changes phase

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "hold": self.hold, "config": self.config.to_dict(),
                "slots": [dataclasses.asdict(s) for s in self.slots]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetSignals:
        return cls(float(data["at"]), tuple(SlotSignal(**s) for s in data["slots"]),
                   AutoscaleConfig(**data["config"]), data.get("hold"))


def wanted(signals: FleetSignals) -> tuple[int, str]:
    """-> (replicas the fleet wants, why): see the module docstring."""
    cfg = signals.config
    routed = [s for s in signals.slots if s.routed and s.ready]
    n = len(routed)
    if n == 0:  # nothing to judge load by (starting up, or every replica down): hold
        return max(cfg.min_replicas, sum(s.ready for s in signals.slots)), "no_signal"
    waiting = sum(s.waiting for s in routed)
    kv = sum(s.kv_usage for s in routed) / n
    share = max(s.queue_slo_share for s in routed)
    if n < cfg.max_replicas:
        if waiting / n >= cfg.up_waiting and waiting > 0:
            # as many as bring the queue under up_waiting a replica, at once: a burst
            # on 1 of 8 replicas should not wait out eight delays and starts in a row
            enough = math.floor(waiting / cfg.up_waiting) + 1 if cfg.up_waiting else n + 1
            return min(cfg.max_replicas, max(n + 1, enough)), "waiting"
        if share >= cfg.up_queue_share and share > 0:
            return n + 1, "queue_delay"
        if kv >= cfg.up_kv_usage:
            return n + 1, "kv_usage"
    running = sum(max(s.running, s.inflight) for s in routed)
    if (n > cfg.min_replicas and waiting == 0 and kv <= cfg.down_kv_usage
            and running <= cfg.down_running * (n - 1)):
        return n - 1, "idle"
    return n, "steady"


@dataclass(frozen=True)
class SlotState:
    """A slot's phase, kept by Serve between two ticks (its policy_state) and published
    for the ingress. `since`: time.time() the current want began (for the delays)."""
    phase: str = "off"
    reason: str = ""
    since: float | None = None  # when the pending change was first wanted
    changed_at: float | None = None  # when `phase` last changed
    waited_s: float | None = None  # how long the want had held when `phase` began

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SlotState | None:
        if not data or data.get("phase") not in PHASES:
            return None
        return cls(data["phase"], str(data.get("reason", "")), data.get("since"),
                   data.get("changed_at"), data.get("waited_s"))


def slot_step(slot: int, replicas: int, state: SlotState | None,
              signals: FleetSignals | None, now: float) -> tuple[int, SlotState]:
    """Slot `slot` running `replicas` (0 or 1) now -> (replicas it should run, new state).
    Stale or missing signals, or a hold: the slot keeps what it runs (a retiring one goes
    on draining)."""
    if state is None:  # first tick (or the controller restarted): what runs is its phase
        state = SlotState("on" if replicas else "off", "start", None, now)
    if signals is None or now - signals.at > STALE_S:
        return replicas, state
    cfg = signals.config
    if slot < cfg.min_replicas:
        return 1, _phase(state, "on", "min_replicas", now)
    want, why = wanted(signals)
    wants = slot < want
    me = next((s for s in signals.slots if s.slot == slot), None)
    if state.phase == "retiring":
        if wants and signals.hold is None:
            return 1, _phase(state, "on", why, now)
        # signals published before the ingress read `retiring` may predate requests it
        # routed there meanwhile: judge idleness only on signals from after it knew
        settled = signals.at >= _changed(state, now) + RETIRE_SETTLE_S
        idle = settled and (me is None or (me.inflight == 0 and me.running == 0
                                           and me.waiting == 0))
        return (0, _phase(state, "off", state.reason, now)) if idle else (1, state)
    if signals.hold is not None:
        return replicas, dataclasses.replace(state, since=None)
    if state.phase == "off":
        if not wants or slot >= cfg.max_replicas:
            return 0, dataclasses.replace(state, since=None)
        return _after(state, cfg.upscale_delay_s, now, why, (0, 1), "starting")
    if state.phase == "starting":
        if me is not None and me.ready:
            state = _phase(state, "on", state.reason, now)
        elif now - _changed(state, now) > START_TIMEOUT_S:
            return 0, _phase(state, "off", "start_timeout", now)
    if wants or state.phase == "starting":
        return 1, dataclasses.replace(state, since=None)
    return _after(state, cfg.downscale_delay_s, now, why, (1, 1), "retiring")


def _after(state: SlotState, delay_s: float, now: float, why: str, replicas: tuple[int, int],
           phase: str) -> tuple[int, SlotState]:
    """Wait out `delay_s` of a want that holds (replicas[0] meanwhile), then go to `phase`
    (replicas[1])."""
    since = state.since if state.since is not None else now
    if now - since >= delay_s:
        return replicas[1], dataclasses.replace(_phase(state, phase, why, now),
                                                waited_s=round(now - since, 3))
    return replicas[0], dataclasses.replace(state, since=since)


def _phase(state: SlotState, phase: str, reason: str, now: float) -> SlotState:
    if state.phase == phase:
        return dataclasses.replace(state, since=None)
    return SlotState(phase, reason, None, now)


def _changed(state: SlotState, now: float) -> float:
    return now if state.changed_at is None else state.changed_at
