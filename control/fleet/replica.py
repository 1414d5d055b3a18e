"""One engine replica of the fleet: the app `batchpilot serve` runs (control/api/app.py:
the AsyncEngine and its loop thread, the OpenAI routes, probes, metrics, /control, the
trace), served in-process to the ingress instead of over a socket.

Ray Serve makes each replica an actor (one per deployment `replica-<id>`, one GPU each where
there are GPUs) and restarts it when it dies or `check_health` raises. The class needs no Ray
import, so tests and the routing bench drive it directly.

    ingress --handle.http(method, path, ...)--> EngineReplica.http --ASGI--> create_app(...)
            <-- {"status", "headers"}, {"body"}, ... (streamed; cancel = client disconnect)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from control.api.app import create_app
from control.fleet.asgi_call import call_asgi
from control.fleet.loads import MAX_STATS_WAIT_S, routing_key
from control.fleet.replica_window import FleetTee
from control.fleet.versioning import install_on
from control.serve.settings import ServeSettings
from engine.config.patch import live_to_dict, static_to_dict

DRAIN_POLL_S = 0.05
RETIRED = "retired by a rolling restart: Ray Serve is replacing this process"
ABORT_FLUSH_S = 5.0  # after aborting the rest, time for their final chunks to go out
MAX_KV_WAIT_S = 10.0  # a kv_events long poll's longest wait
STATS_CHECK_S = 0.05  # a stats long poll looks for a change this often (in-process: cheap)


class EngineReplica:
    """`replica_id` names it in stats, logs and (later) metric labels; it is stable across
    restarts (the deployment's, not the actor's)."""

    def __init__(self, settings: ServeSettings, replica_id: int):
        self.replica_id = replica_id
        # reached through the ingress's handle, never an edge: no edge header is trusted
        self.app = create_app(settings.replace(edge="off"))
        self.state = self.app.state.serving
        store = self.state.config_store
        if store is not None:
            store.fleet_version = 0  # the YAML every replica starts from (versioning.py)
        self.tee = FleetTee(self.state.engine.observer, store)  # stamps steps, keeps a window
        self.state.engine.observer = self.tee
        self._lifespan: Any = None
        self.started_at = time.time()
        # one per process: a rolling restart waits for a new one (pids repeat across nodes)
        self.incarnation = uuid.uuid4().hex[:12]
        self.retired = False  # set by retire(): check_health fails, Serve replaces us

    async def start(self) -> EngineReplica:
        """Start the engine loop (and the trace writer); return once the model is loaded
        (raises RuntimeError when it failed to load)."""
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        await self.state.engine.wait_loaded()
        return self

    async def http(self, method: str, path: str, query: bytes,
                   headers: list[tuple[bytes, bytes]], body: bytes,
                   ) -> AsyncIterator[dict[str, Any]]:
        """One HTTP request, streamed back message by message (control/fleet/asgi_call.py),
        after `{"accepted": replica_id}`: the ingress may retry a request elsewhere only
        while this first message has not come (nothing of it has run)."""
        yield {"accepted": self.replica_id}
        async for message in call_asgi(self.app, method, path, query, headers, body):
            yield message

    async def stats(self, since: tuple | None = None, wait_s: float = 0.0) -> dict[str, Any]:
        """What the router polls (~every 200 ms): cheap, read from the loop's last step.
        With `since` (loads.routing_key of the caller's last answer), an answer that routing
        would read the same waits up to `wait_s` (at most MAX_STATS_WAIT_S) for a change,
        looked for every STATS_CHECK_S here: an idle fleet's ingress calls about once a
        second instead of five times, and a change (a request queued) goes back at once."""
        now = self._stats()
        deadline = time.monotonic() + min(wait_s, MAX_STATS_WAIT_S)
        while since is not None and routing_key(now) == since and time.monotonic() < deadline:
            await asyncio.sleep(STATS_CHECK_S)
            now = self._stats()
        return now

    def _stats(self) -> dict[str, Any]:
        engine = self.state.engine
        stats = engine.stats
        problem = RETIRED if self.retired else engine.health()
        return {"replica_id": self.replica_id, "pid": os.getpid(),
                "incarnation": self.incarnation, "ready": problem is None, "reason": problem,
                "waiting": stats.waiting, "running": stats.running,
                "kv_usage": stats.kv_usage, "kv_blocks_used": stats.kv_blocks_used,
                "queue_slo_share": round(stats.queue_slo_share, 4),
                "inflight": self.state.inflight, "steps": stats.steps,
                "started_at": self.started_at, "fleet_version": self.tee.fleet_version}

    async def kv_events(self, epoch: str | None, seq: int,
                        wait_s: float = 0.0) -> dict[str, Any]:
        """What the ingress's KV index polls (control/fleet/kv_index.py): the prefix-cache
        blocks stored and evicted since batch `seq` of this process's log (`epoch`: the
        `incarnation` the reader's seq belongs to), or every findable block when the reader
        is new, from another incarnation, or fell behind the log. {"enabled": False}: this
        replica publishes none (the fleet does not route `precise`). With `wait_s` (at most
        MAX_KV_WAIT_S), a reader with nothing new waits up to that long for the next batch
        (a long poll: an idle fleet does not call ten times a second)."""
        parts = self.state.engine.parts
        manager = parts.engine.block_manager if parts is not None else None
        log = manager.events if manager is not None else None
        if log is None:
            return {"enabled": False}
        if epoch == self.incarnation and wait_s > 0:
            await wait_for_batch(log, seq, min(wait_s, MAX_KV_WAIT_S))
        head = {"enabled": True, "epoch": self.incarnation, "block_size": manager.block_size,
                "sharing": manager.hasher.sharing,
                "prefix_caching": manager.enable_prefix_caching, **log.counters()}
        if epoch == self.incarnation:
            batches = log.since(seq)
            if batches is not None:
                return {**head, "seq": batches[-1].seq if batches else seq,
                        "batches": [(b.stored, b.removed) for b in batches]}
        # between two steps, so the keys and the seq they are current at agree
        seq, keys = await self.state.engine.call(
            lambda e: (e.block_manager.events.seq, e.block_manager.cached_keys()))
        return {**head, "seq": seq, "snapshot": keys}

    # ---- the fleet's control plane (control/fleet/control_plane.py calls these) ---------
    async def install(self, config: dict[str, Any], fleet_version: int,
                      **kwargs: Any) -> dict[str, Any]:
        """Install fleet version `fleet_version` (its whole live config) between two steps;
        -> {"ok": True, "applied", "config_version", "fleet_version"} or the refusal as
        {"ok": False, "status", "code", "message"}. kwargs: actor, source, reason,
        lane_moves, dry_run (ConfigStore.install_fleet)."""
        return await install_on(self.state.config_store, config, fleet_version, kwargs)

    def control_state(self) -> dict[str, Any] | None:
        """The live config, static settings and profiles the fleet's version 0 starts
        from (None: the control API is off)."""
        store = self.state.config_store
        if store is None:
            return None
        return {"config": live_to_dict(store.current()), "static": static_to_dict(store.static),
                "profiles": store.profiles, "fleet_version": store.fleet_version}

    def window(self, since: float, fleet_version: int | None = None) -> dict[str, Any]:
        """Requests that ended since `since` (s since the epoch) under `fleet_version`."""
        return {"replica_id": self.replica_id,
                **self.tee.window.since(since, fleet_version)}

    def audit_event(self, source: str, actor: str, change: dict[str, Any], note: str) -> bool:
        """A fleet control decision (a canary's verdict) as a row of this replica's trace."""
        if self.state.config_store is None:
            return False
        self.state.config_store.audit_event(source, actor, change, note)
        return True

    def check_health(self) -> None:
        """Serve calls this periodically; raising makes it replace the replica. Only a dead
        or wedged engine loop counts (not draining, not paused admission)."""
        problem = RETIRED if self.retired else self.state.engine.serving_problem()
        if problem is not None:
            raise RuntimeError(f"replica {self.replica_id}: {problem}")

    async def retire(self, grace_s: float) -> int:
        """A rolling restart's last word to this process: drain (as `drain`), then fail
        every health check, so Serve stops it (gracefully: `__del__` flushes the trace) and
        starts a new one with a new `incarnation`. -> requests that had to be aborted.
        NOTE: Serve replaces a replica after REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD (3)
        failed checks in a row, `health_check_period_s` apart (app.py: HEALTH_CHECK_S)."""
        aborted = await self.drain(grace_s)
        self.retired = True
        return aborted

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests (503), give in-flight ones `grace_s`, abort the rest (their
        streams end with finish_reason "cancelled"). Returns how many were aborted."""
        engine = self.state.engine
        engine.start_draining()
        await self._wait_idle(grace_s)
        left = self.state.inflight
        if left:
            engine.abort_all("shutdown")
            await self._wait_idle(ABORT_FLUSH_S)
        return left

    async def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.state.inflight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    async def shutdown(self) -> None:
        """Stop the engine thread, flush the trace (Serve: from the replica's __del__)."""
        lifespan, self._lifespan = getattr(self, "_lifespan", None), None
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)


async def wait_for_batch(log: Any, seq: int, wait_s: float) -> None:
    """Until `log` (engine/kv/events.py) has a batch after `seq`, or wait_s passed. The
    engine thread's seal wakes this loop through call_soon_threadsafe, only while someone
    waits; a loop already closed is not woken (and nothing raises into the engine)."""
    loop, ready = asyncio.get_running_loop(), asyncio.Event()

    def sealed() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: its waiter is gone
            loop.call_soon_threadsafe(ready.set)

    log.listen(sealed)
    try:
        if log.seq == seq:  # (a batch sealed before we listened needs no wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), wait_s)
    finally:
        log.unlisten(sealed)
