"""Where the ingress and Serve's autoscaler meet: the fleet's signals and each slot's phase,
as small JSON values under the fleet's app name.

    <app>/signals    FleetSignals: the ingress publishes them every PUBLISH_S
    <app>/slot/<i>   SlotState: slot i's policy publishes it when it changes

On Ray the board is the cluster's internal key-value store (GCS), which the Serve controller
(where `slot_policy` runs) and the ingress replica both reach; tests use a dict. A value that
does not parse reads as missing: the policy then holds, the ingress treats the slot as off
unless it is below min_replicas.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol

from control.fleet.autoscale import FleetSignals, SlotState, slot_step

log = logging.getLogger("batchpilot.fleet")
NAMESPACE = "batchpilot-fleet"
PUBLISH_S = 0.5  # the ingress's signals, at most this old (plus a GCS round trip)
READ_CACHE_S = 0.25  # Serve ticks every ~0.1 s per deployment: read the signals less often


class Board(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...


class MemoryBoard:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value


class RayBoard:
    """Ray's internal KV (needs a connected Ray: the controller and every replica are)."""

    def get(self, key: str) -> bytes | None:
        from ray.experimental.internal_kv import _internal_kv_get

        return _internal_kv_get(key, namespace=NAMESPACE)

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, value, overwrite=True, namespace=NAMESPACE)


def _load(board: Board, key: str) -> Any:
    raw = board.get(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def publish_signals(board: Board, app: str, signals: FleetSignals) -> None:
    board.put(f"{app}/signals", json.dumps(signals.to_dict()).encode())


def read_signals(board: Board, app: str) -> FleetSignals | None:
    data = _load(board, f"{app}/signals")
    try:
        return FleetSignals.from_dict(data) if isinstance(data, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def publish_slot(board: Board, app: str, slot: int, state: SlotState) -> None:
    board.put(f"{app}/slot/{slot}", json.dumps(state.to_dict()).encode())


def read_slot(board: Board, app: str, slot: int) -> SlotState | None:
    data = _load(board, f"{app}/slot/{slot}")
    return SlotState.from_dict(data) if isinstance(data, dict) else None


_signals_cache: dict[str, tuple[float, FleetSignals | None]] = {}


def slot_policy(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Ray Serve's custom autoscaling policy for deployment `replica-<slot>` (called by the
    Serve controller every tick with an AutoscalingContext): -> (replicas, policy_state)."""
    slot = int(ctx.deployment_name.rsplit("-", 1)[1])
    return policy_tick(RayBoard(), ctx.app_name, slot, ctx.target_num_replicas,
                       ctx.policy_state, time.time())


def policy_tick(board: Board, app: str, slot: int, target: int, policy_state: dict[str, Any],
                now: float) -> tuple[int, dict[str, Any]]:
    """One tick of slot `slot` (Serve's target for it now: `target`): the rule is
    autoscale.slot_step; this reads the signals (cached READ_CACHE_S) and publishes the
    slot's state when it changes (or the last tick could not)."""
    cached = _signals_cache.get(app)
    if cached is None or now - cached[0] > READ_CACHE_S or cached[0] > now:
        try:
            cached = (now, read_signals(board, app))
        except Exception as exc:  # GCS unreachable this tick: hold (stale signals do too)
            log.warning("autoscale: could not read the fleet's signals: %r", exc)
            cached = (now, None)
        _signals_cache[app] = cached
    state = SlotState.from_dict(policy_state.get("slot"))
    replicas, new = slot_step(slot, min(target, 1), state, cached[1], now)
    published = bool(policy_state.get("published")) and new == state
    if not published:  # a change, or one the last tick could not publish
        try:
            publish_slot(board, app, slot, new)
            published = True
        except Exception as exc:
            log.warning("autoscale: could not publish slot %d: %r", slot, exc)
    return replicas, {"slot": new.to_dict(), "published": published}
