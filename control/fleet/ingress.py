"""The fleet's front door: one HTTP app in front of N engine replicas (Ray Serve handles).

    POST /v1/completions, /v1/chat/completions   routed (control/fleet/router.py), relayed
    GET  /v1/models, /health, /version, ...      any healthy replica
    GET  /healthz                                this ingress answers
    GET  /readyz                                 200 while one replica is ready; each one's stats
    GET  /metrics                                every replica's, labelled replica="<id>"
    GET  /v1/trace/*                             every replica's trace as one (trace_fanout.py)
    /control/config, history, canary, ...        the fleet's control plane (control_routes.py)
    /control/fleet/restart                       a rolling restart (restart.py)
    anything else (/v1/whatif, ...)              the replica named by X-Batchpilot-Replica
                                                 (default: the first healthy one); what
                                                 needs a token on one server needs the
                                                 fleet's here (trace_fanout.guard_forwarded)

Every answer from a replica carries `X-Batchpilot-Replica`. The class needs no Ray import:
`handles` are anything with `.options(stream=True).http.remote(...)`, `.stats.remote(since, wait_s)`
and `.drain.remote(grace_s)`, and for /control `.install`, `.window`, `.audit_event`,
`.control_state`, `.retire` (Serve's DeploymentHandles, or local stand-ins in the bench and
tests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from control.admin.auth import Token
from control.api.errors import APIError, shown
from control.api.limits import RequestLimits
from control.api.routed import ROUTED_HEADER, routed_value
from control.fleet.autoscale import AutoscaleConfig
from control.fleet.autoscale_board import Board
from control.fleet.control_plane import FleetControl
from control.fleet.forward import NotAccepted, fan_out, open_call, relay, upstream_headers
from control.fleet.ingress_app import build_app
from control.fleet.kv_index import KVIndex, follow_forever
from control.fleet.loads import POLL_S, LoadTable, poll_forever
from control.fleet.prefix_keys import PrefixSpec
from control.fleet.router import (
    Decision,
    NoReplicaAvailable,
    RoutingPolicy,
    affinity_key,
    choose,
    prompt_prefix,
)
from control.fleet.scaling import FleetScaling
from control.otel.door import Hop, TraceDoor
from control.otel.settings import OtelSettings

log = logging.getLogger("batchpilot.fleet")
DEFAULT_MAX_BODY_BYTES = RequestLimits().max_body_bytes
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
REPLICA_HEADER = "x-batchpilot-replica"


class FleetIngress:
    def __init__(self, handles: list[Any], policy: RoutingPolicy, poll_s: float = POLL_S,
                 seed: int | None = None, control_tokens: tuple[Token, ...] = (),
                 control_api: bool = True, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 loopback: bool = False, otlp: OtelSettings | None = None,
                 prefix: PrefixSpec | None = None, autoscale: AutoscaleConfig | None = None,
                 board: Board | None = None, app: str = "batchpilot-fleet"):
        """`prefix`: how to hash requests as the replicas do (control/fleet/prefix_keys.py),
        needed by --routing precise; the tokenizer loads here. `autoscale` and `board`:
        slots min_replicas.. are scaled by Serve's autoscaler (scaling.py); without them
        every replica always runs."""
        self.handles = list(handles)
        self.policy = policy.validate()
        self.poll_s = poll_s
        self.table = LoadTable(len(self.handles))
        self.rng = random.Random(seed)
        self.draining = False
        self.decisions: dict[str, int] = {}  # reason -> count, for /readyz and the bench
        self.routed: dict[tuple[int, str], int] = {}  # (replica, reason) -> count: /metrics
        self._polls: list[asyncio.Task] = []
        self.control_api, self.control_tokens = control_api, control_tokens
        # the front door's own bounds, before a body is buffered to be forwarded
        # (control/api/body_limit.py, control/admin/origin_guard.py); `loopback`: it
        # listens on loopback (control/fleet/app.py says), so a tokenless one checks Host
        self.max_body_bytes, self.loopback = max_body_bytes, loopback
        self.control = FleetControl(self)  # /control: fleet versions, canaries
        self.restart: Any = None  # the running or last RestartRun (restart.py)
        self.restarts = 0  # started so far: names the next one
        # OpenTelemetry: a routing span per request (control/otel/door.py); None: no export
        self.door = TraceDoor(otlp) if otlp is not None else None
        if self.policy.mode == "precise" and prefix is None:
            raise ValueError("routing 'precise' needs the request hashing (prefix=)")
        self.prefix = prefix.build() if self.policy.mode == "precise" else None
        self.kv_index = KVIndex(len(self.handles))  # followed under precise routing
        self.matched: dict[int, int] = {}  # replica -> prompt blocks it held when routed
        if autoscale is None or board is None or not autoscale.enabled:
            autoscale, board = AutoscaleConfig(len(self.handles), len(self.handles)), None
        self.scaling = FleetScaling(self, autoscale, board, app)

    def start_polls(self) -> None:
        """On the event loop that serves the app: one poll loop per replica."""
        callable_ = self.scaling.callable
        self._polls = [asyncio.ensure_future(poll_forever(
            self.table, i, lambda since, wait_s, h=h: _await(h.stats.remote(since, wait_s)),
            self.poll_s, active=lambda i=i: callable_(i)))
            for i, h in enumerate(self.handles)]
        if self.prefix is not None:  # each replica's KV events, into the KV index
            self._polls += [asyncio.ensure_future(follow_forever(
                self.kv_index, i,
                lambda epoch, seq, wait_s, h=h: _await(h.kv_events.remote(epoch, seq, wait_s)),
                active=lambda i=i: callable_(i)))
                for i, h in enumerate(self.handles)]
        if self.scaling.enabled:  # the signals out to Serve's autoscaler, the phases back
            self._polls.append(asyncio.ensure_future(self.scaling.run_forever()))
        if self.control_api:  # pushes each replica its target fleet version until it has it
            self._polls.append(asyncio.ensure_future(self.control.reconcile_forever()))

    async def __serve_build_asgi_app__(self) -> FastAPI:  # Serve: on the replica's loop
        self.start_polls()
        return build_app(self)

    # ---- routing and forwarding -------------------------------------------------------
    async def route_generation(self, path: str, body: dict[str, Any], headers: Any,
                               ) -> Decision:
        """`route`, with the KV index's view under precise routing: how many leading
        blocks of this prompt each replica holds."""
        index, matched = self.kv_index, None
        if (self.prefix is not None and self.policy.mode == "precise" and index.enabled
                and index.block_size):
            keys = await self.prefix.of(path, body, headers, index.block_size, index.sharing)
            matched = index.matches(keys) if keys else None
        return self.route(body, headers, matched)

    def route(self, body: dict[str, Any], headers: Any,
              matched: dict[int, int] | None = None) -> Decision:
        tenant = headers.get("x-tenant") or body.get("user") or "default"
        salt = body.get("cache_salt")
        key = affinity_key(prompt_prefix(body, self.policy), str(tenant),
                           salt if isinstance(salt, str) else None, self.policy)
        try:
            decision = choose(key, self.table.snapshot(self.in_service()), self.policy,
                              self.rng, matched)
        except NoReplicaAvailable as exc:
            raise APIError(503, str(exc), code="no_replica", headers={"Retry-After": "1"}) \
                from None
        self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
        key = (decision.replica_id, decision.reason)
        self.routed[key] = self.routed.get(key, 0) + 1
        if matched is not None:  # what the chosen one holds, whatever the reason
            rid = decision.replica_id
            decision = dataclasses.replace(decision, matched_blocks=matched.get(rid, 0))
            self.matched[rid] = self.matched.get(rid, 0) + decision.matched_blocks
        return decision

    def in_service(self) -> Callable[[int], bool]:
        """Which replicas new requests may go to (when healthy): their slot on, and running
        the fleet's config, so none is served under the YAML a fresh replica starts on;
        while no healthy one runs it yet (a change being pushed), any whose slot is on."""
        ids = range(len(self.handles))
        on = [self.scaling.routed(i) for i in ids]
        current = [on[i] and self.control.runs_target(i) for i in ids]
        views = self.table.views
        return (current if any(c and views[i].healthy for i, c in enumerate(current))
                else on).__getitem__

    async def forward(self, request: Request, body: bytes, replica_id: int,
                      retry: bool = True, hop: Hop | None = None,
                      routed: bytes | None = None) -> Response:
        """Relay to `replica_id`; one that never accepts it is marked down and, when
        `retry`, the request goes to another replica (nothing of it ran; its trace says
        `retry`). `hop`: the request's routing span, when the fleet exports traces (its
        traceparent goes on). `routed`: why it goes there (control/api/routed.py
        routed_value), for the replica's trace."""
        handle = self.handles[replica_id]
        headers = upstream_headers(request.scope["headers"])
        if hop is not None:
            headers = hop.headers(headers, replica_id)
        if routed is not None:
            headers.append((ROUTED_HEADER.encode(), routed))
        gen = handle.options(stream=True).http.remote(
            request.method, request.url.path, request.scope.get("query_string", b""),
            headers, body)
        self.table.started(replica_id)
        try:
            start = await open_call(gen, replica_id)
        except NotAccepted as exc:
            self.table.done(replica_id)
            if exc.late:  # busy or gone: down only if it keeps not answering (loads.py)
                self.table.late(replica_id, str(exc))
            else:
                self.table.failed(replica_id, str(exc))
            if not retry:
                raise APIError(503, f"replica {replica_id} is not available ({exc})",
                               code="replica_unavailable", headers={"Retry-After": "1"}) \
                    from None
            # the retry's replica is not chosen on blocks: what it holds is not known
            return await self.forward(request, body, self.any_replica(), retry=False,
                                      hop=hop, routed=routed and routed_value("retry", None))
        except BaseException as exc:
            self.table.done(replica_id)
            if isinstance(exc, APIError):
                self.table.failed(replica_id, exc.message)
                if hop is not None:
                    hop.end(exc.status)
            raise

        def closed() -> None:
            self.table.done(replica_id)
            if hop is not None:
                hop.end(start["status"])

        return relay(gen, start, replica_id, request.url.path, on_close=closed,
                     on_failure=lambda exc: self.table.failed(replica_id, repr(exc)))

    def any_replica(self) -> int:
        return self.route({}, {}).replica_id

    def named_replica(self, request: Request) -> int:
        sent = request.headers.getlist(REPLICA_HEADER)
        if not sent:
            return self.any_replica()
        named = sent[0]
        # ASCII digits only: str.isdigit() is also true of '²' (int() raises: a 500) and
        # of other scripts' digits (int() takes them: an id nobody typed); at most 6 of
        # them (int() refuses over 4,300 digits: a 500)
        if len(sent) > 1 or not (named.isascii() and named.isdecimal() and len(named) <= 6) \
                or int(named) >= len(self.handles):
            raise APIError(400, f"X-Batchpilot-Replica={shown(named, 20)} must be one replica id"
                           f" in 0..{len(self.handles) - 1}", code="invalid_value",
                           param="X-Batchpilot-Replica")
        if not self.scaling.callable(int(named)):  # a call would make Serve start it
            raise APIError(503, f"replica {named} is scaled in (autoscaling has no replica"
                           f" in its slot now; live: {self.live_ids()})", code="scaled_in",
                           headers={"Retry-After": "5"})
        return int(named)

    def live_ids(self) -> list[int]:
        """Replicas that may be called now (every one, unless autoscaling has slots off)."""
        return self.scaling.live_ids()

    async def fan_out(self, method: str, path: str, body: bytes = b"",
                      headers: list[tuple[bytes, bytes]] | None = None,
                      ) -> list[tuple[int, int, bytes]]:
        """One request to every replica -> [(replica id, status, body)] (forward.py)."""
        return await fan_out(self.handles, self.live_ids(), method, path, body, headers)

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests (503), drain every replica; -> requests that were aborted."""
        self.draining = True
        results = await asyncio.gather(*(_await(self.handles[i].drain.remote(grace_s))
                                         for i in self.live_ids()), return_exceptions=True)
        return sum(r for r in results if isinstance(r, int))

    def refuse_during_restart(self) -> None:
        """409 while a rolling restart runs (a canary would lose its replicas under it)."""
        run = self.restart
        if run is not None and run.running:
            busy = [s["replica_id"] for s in run.steps if s["phase"] not in ("waiting", "done")]
            raise APIError(409, f"rolling restart {run.restart_id} is running (replica"
                           f" {busy[0] if busy else '-'} of {[s['replica_id'] for s in run.steps]}"
                           "): wait for it to end (GET /control/fleet/restart)",
                           code="restart_running", extra={"restart_id": run.restart_id})

    def refuse_during_scaling(self) -> None:
        """409 while a scale event is under way (a replica starting or draining): a canary
        or restart would count or take a replica that is coming or going."""
        busy = self.scaling.in_flight()
        if busy is not None:
            raise APIError(409, f"a scale event is under way ({busy}): wait for it to"
                           " settle (GET /control/fleet/autoscale)", code="scale_running")

    def readiness(self) -> dict[str, Any]:
        views = self.table.views
        return {"status": "ready" if self.ready() else "not_ready",
                "draining": self.draining, "routing": self.policy.mode,
                **({"kv_index": self.kv_index.families_data()} if self.prefix else {}),
                "decisions": dict(self.decisions),
                **({"autoscale": self.scaling.view()} if self.scaling.enabled else {}),
                "replicas": [{**v.polled, "replica_id": v.replica_id, "healthy": v.healthy,
                              "routable": v.routable, "ingress_inflight": v.inflight,
                              "failures": v.failures,
                              # False: not routed until the fleet's config reaches it
                              "runs_config": self.control.runs_target(v.replica_id)}
                             for v in views]}

    def ready(self) -> bool:
        return not self.draining and any(v.healthy for v in self.table.views)

    async def stop_polls(self) -> None:
        for task in self._polls:
            task.cancel()
        await asyncio.gather(*self._polls, return_exceptions=True)
        if self.door is not None:  # export the routing spans still queued
            await asyncio.to_thread(self.door.export.stop)
        if self.prefix is not None:
            self.prefix.close()


async def _await(ref: Any) -> Any:
    return await ref
