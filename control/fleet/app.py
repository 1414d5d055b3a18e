"""The fleet as a Ray Serve application, and its life from `batchpilot fleet`.

    deployments: replica-0 .. replica-<N-1>   EngineReplica, one actor each (1 GPU each
                                              where CUDA is available, else `replica_cpus`)
                 ingress                      FleetIngress, the HTTP app (route_prefix "/")

With autoscaling (`autoscale.min_replicas` < `max_replicas` = N), slots min.. run 0 or 1
replica each, decided by Ray Serve's autoscaler with our policy (autoscale_board.py
slot_policy, on the ingress's signals; autoscale.py says the rule).

One deployment per replica, not one deployment of N: the router picks a replica by id
(affinity needs a stable target) and each keeps its id across restarts, so its stats, logs
and (later) metric labels and trace file stay its own. Serve restarts a replica whose actor
dies or whose `check_health` raises.

Start: without an address, a local Ray (`ray.init(num_cpus=...)`); with one, the cluster.
Stop (SIGTERM, Ctrl+C): the ingress refuses new requests, replicas get `shutdown_grace_s`
for what they run, the rest end with finish_reason "cancelled", then Serve shuts down.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from control.admin.auth import load_tokens
from control.fleet.autoscale import AutoscaleConfig, SlotState
from control.fleet.autoscale_board import RayBoard, publish_slot, slot_policy
from control.fleet.ingress import FleetIngress
from control.fleet.placement import deploy_failure, fit_to_cluster
from control.fleet.prefix_keys import PrefixSpec
from control.fleet.replica import EngineReplica
from control.fleet.router import RoutingPolicy
from control.fleet.signal_reach import child_processes, exited, reach_warning
from control.serve.settings import LOOPBACK_HOSTS, ServeSettings
from control.serve.stop_signals import stop_on_signals, wait_for_stop
from engine.gc_heap import freeze_startup_heap

log = logging.getLogger("batchpilot.fleet")
APP_NAME = "batchpilot-fleet"
MAX_ONGOING = 4096  # Serve's per-replica cap; the engine's own admission is the real limit
READY_LINE = "batchpilot fleet: ready"
# NOTE: Serve polls a stopping replica for requests left this often (its default 2 s): a
# replica is drained by then (ours, stop() and restart.py), so each poll was a wait
SHUTDOWN_POLL_S = 0.25
# Serve replaces a replica after 3 failed health checks in a row: a retired one (a rolling
# restart) or a broken one is gone ~3 periods after it fails; a check is one actor call
HEALTH_CHECK_S = 1.0
REACH_CHECK_S = 0.5  # after a stop signal: time for the local Ray's processes to exit on it


@dataclass(frozen=True)
class FleetSettings:
    serve: ServeSettings  # what every replica runs (model, --config, limits)
    replicas: int = 2
    address: str | None = None  # None: start a local Ray
    num_cpus: float | None = None  # local Ray's CPUs (None: all of the machine's)
    # CPUs Ray reserves per replica without a GPU; None: an equal share of what the
    # ingress leaves (placement.py)
    replica_cpus: float | None = None
    ingress_cpus: float = 0.5
    trace_dir: str | None = None  # each replica writes DIR/replica-<id>.duckdb
    policy: RoutingPolicy = RoutingPolicy()
    # None: a fixed fleet of `replicas`; else `replicas` == its max_replicas slots
    autoscale: AutoscaleConfig | None = None

    @property
    def autoscaled(self) -> bool:
        return self.autoscale is not None and self.autoscale.enabled

    def validate(self) -> FleetSettings:
        if self.replicas < 1:
            raise ValueError(f"replicas={self.replicas} must be >= 1")
        if self.autoscale is not None:
            self.autoscale.validate()
            if self.autoscale.max_replicas != self.replicas:
                raise ValueError(f"autoscale.max_replicas={self.autoscale.max_replicas} must"
                                 f" equal replicas={self.replicas} (the slots deployed)")
        if (self.replica_cpus is not None and self.replica_cpus <= 0) or self.ingress_cpus <= 0:
            raise ValueError(f"replica_cpus={self.replica_cpus} and ingress_cpus="
                             f"{self.ingress_cpus} must be > 0")
        self.policy.validate()
        self.serve.validate()
        return self

    def replica_settings(self, replica_id: int, prefix: PrefixSpec | None = None,
                         ) -> ServeSettings:
        """`prefix` (precise routing): the replica publishes KV events, its prefix hashes
        keyed with the fleet's secret, which the ingress shares."""
        # NOTE: no YAML watcher on a replica: a reload would change one replica's config
        # behind the fleet's versions; changes go through the ingress's /control
        serve = self.serve.replace(watch_config=False, replica_name=f"replica-{replica_id}")
        if prefix is not None:
            serve = serve.replace(kv_events=True, prefix_hash_key=prefix.hash_key)
        if self.trace_dir is None:
            return serve.replace(trace_db=None)  # one DuckDB file cannot take N writers
        return serve.replace(trace_db=f"{self.trace_dir}/replica-{replica_id}.duckdb")


class _ServeReplica(EngineReplica):
    async def __init__(self, settings: ServeSettings, replica_id: int):  # type: ignore[misc]
        super().__init__(settings, replica_id)  # Ray actors may construct asynchronously
        await self.start()
        freeze_startup_heap()  # an actor process of its own (engine/gc_heap.py)

    async def __del__(self) -> None:  # Serve calls it when it stops the replica
        await self.shutdown()


class _ServeIngress(FleetIngress):
    """The ingress in its Serve actor, whose process it has to itself: its heap frozen once
    built (engine/gc_heap.py). Ray, FastAPI and precise routing's tokenizer come to ~426,000
    tracked objects, and a full collection over them took ~154 ms, a stall of every request's
    routing and of every stream it relays."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        freeze_startup_heap()


def replica_torch_threads(replica_cpus: float) -> int:
    """Torch threads of a CPU replica: its CPUs less one for its event loop, at least 1."""
    return max(1, math.floor(replica_cpus) - 1)


def _actor_options(settings: FleetSettings) -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"num_cpus": 1, "num_gpus": 1}
    # NOTE: Ray sets a worker's OMP_NUM_THREADS to floor(num_cpus), so a 2-CPU replica ran 2
    # spinning torch threads beside its own event loop, which then waited for the step and
    # the step for it (bench.fleet_scaling: 2.7x slower than two 1-CPU replicas on the same
    # cores). As `batchpilot serve` does, torch gets one thread fewer than the CPUs.
    assert settings.replica_cpus is not None, "start() sizes replicas first (placement.py)"
    threads = replica_torch_threads(settings.replica_cpus)
    return {"num_cpus": settings.replica_cpus,
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads)}}}


def build_application(settings: FleetSettings) -> Any:
    """The bound Serve application (nothing starts until `serve.run`)."""
    from ray import serve

    replica_options = _actor_options(settings)
    prefix = PrefixSpec(settings.serve.model) if settings.policy.mode == "precise" else None
    handles = []
    for i in range(settings.replicas):
        deployment = serve.deployment(
            _ServeReplica, name=f"replica-{i}", **_slot_size(settings, i),
            max_ongoing_requests=MAX_ONGOING, ray_actor_options=replica_options,
            health_check_period_s=HEALTH_CHECK_S, health_check_timeout_s=30.0,
            graceful_shutdown_timeout_s=settings.serve.shutdown_grace_s + 5.0,
            graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S)
        handles.append(deployment.bind(settings.replica_settings(i, prefix), i))
    ingress = serve.deployment(
        serve.ingress()(_ServeIngress), name="ingress", num_replicas=1,
        max_ongoing_requests=MAX_ONGOING, graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
        ray_actor_options={"num_cpus": settings.ingress_cpus})
    # the caller's token is checked at the ingress, and passed on to the replicas (which
    # load the same tokens); loaded whatever is on: they guard the trace and what-if too
    tokens = load_tokens(settings.serve.control_tokens_path)
    return ingress.bind(handles, settings.policy, control_tokens=tokens,
                        max_body_bytes=settings.serve.limits.max_body_bytes,
                        loopback=settings.serve.host in LOOPBACK_HOSTS,
                        control_api=settings.serve.control_api, otlp=settings.serve.otlp,
                        prefix=prefix, autoscale=settings.autoscale,
                        board=RayBoard() if settings.autoscaled else None, app=APP_NAME)


def _slot_size(settings: FleetSettings, slot: int) -> dict[str, Any]:
    """One replica, or (an autoscaled slot) 0..1 as our policy says. Serve's own delays are
    0: the policy keeps its own (autoscale.py), live-changeable, and drains before 0."""
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy

    if not settings.autoscaled or slot < settings.autoscale.min_replicas:
        return {"num_replicas": 1}
    return {"autoscaling_config": AutoscalingConfig(
        min_replicas=0, max_replicas=1, initial_replicas=0, upscale_delay_s=0.0,
        downscale_delay_s=0.0, policy=AutoscalingPolicy(policy_function=slot_policy))}


def start(settings: FleetSettings) -> Any:
    """Start (or join) Ray and Serve, deploy the fleet; -> the ingress handle once every
    replica has loaded its model. ValueError: the fleet cannot fit what Ray has;
    RuntimeError: a replica failed to start (its own error in the message)."""
    return deploy(sized(settings))


def deploy(settings: FleetSettings) -> Any:
    """The fleet of `sized` settings deployed on the running Ray -> the ingress handle.
    RuntimeError: a replica failed to start, or Serve's own start failed twice."""
    from ray import serve
    from ray.exceptions import RayActorError

    try:
        return _deploy_once(settings)
    except RayActorError as exc:
        if settings.address:  # a shared cluster's Serve is not ours to restart
            raise RuntimeError(f"Ray Serve failed to start on {settings.address}: {exc}") \
                from None
        # NOTE: on a starved 2-core machine Serve's controller has killed its HTTP proxy
        # before it became ready (a missed health check), and serve.start raised. That is
        # Serve's start-up under load, not the fleet: once more from a clean Serve
        log.warning("Ray Serve's start failed (%s); starting it once more", exc)
        serve.shutdown()
    try:
        return _deploy_once(settings)
    except RayActorError as exc:
        raise RuntimeError(f"Ray Serve failed to start twice (a machine too busy for its"
                           f" health checks?): {exc}") from None


def _deploy_once(settings: FleetSettings) -> Any:
    from ray import serve

    serve.start(http_options={"host": settings.serve.host, "port": settings.serve.port})
    if settings.autoscaled:  # a board a fleet before this one left on the cluster: clear
        board, scale = RayBoard(), settings.autoscale
        for slot in range(scale.min_replicas, scale.max_replicas):
            publish_slot(board, APP_NAME, slot, SlotState("off", "deploy"))
    try:
        return serve.run(build_application(settings), name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:
        reason = deploy_failure(serve.status(), APP_NAME)
        raise RuntimeError(f"{exc}: {reason}" if reason else str(exc)) from None


def sized(settings: FleetSettings) -> FleetSettings:
    """Ray started (or joined), and `settings` with each replica's CPUs fitted to it."""
    import ray
    import torch

    settings.validate()
    cuda = torch.cuda.is_available()
    if not ray.is_initialized():
        if settings.address:
            try:
                ray.init(address=settings.address, log_to_driver=False)
            except ConnectionError as exc:  # no cluster there: Ray's message, not its trace
                raise ValueError(f"--address {settings.address}: {exc} (start one with"
                                 " `ray start --head`, or leave --address out to start a"
                                 " local Ray)") from None
        else:
            # a local Ray has at most the machine's CPUs: a fleet that cannot fit those
            # fails before Ray starts (seconds, a dozen processes); fitted again below
            if not cuda:
                fit_to_cluster(settings, settings.num_cpus or os.cpu_count() or math.inf,
                               0.0, False)
            # "local": a Ray of our own, never a stray one another process left running
            ray.init(address="local", num_cpus=settings.num_cpus, include_dashboard=False,
                     log_to_driver=False)
    have = ray.cluster_resources()
    return fit_to_cluster(settings, have.get("CPU", 0.0), have.get("GPU", 0.0), cuda)


def stop(ingress: Any, grace_s: float) -> int:
    """Drain (new requests 503, in-flight ones get grace_s), then shut Serve down; ->
    requests that had to be aborted."""
    from ray import serve

    aborted = 0
    try:
        aborted = ingress.drain.remote(grace_s).result(timeout_s=grace_s + 30.0)
    except Exception as exc:  # a replica may be down: shut down anyway
        log.warning("drain did not finish: %r", exc)
    serve.shutdown()
    return aborted


def run(settings: FleetSettings) -> int:
    """`batchpilot fleet`: serve until SIGTERM / Ctrl+C, then drain and stop."""
    import ray

    try:
        settings = sized(settings)
        ingress = deploy(settings)
    except (ValueError, RuntimeError) as exc:
        print(f"batchpilot fleet: error: {exc}", file=sys.stderr)
        if not settings.address:
            ray.shutdown()
        return 2 if isinstance(exc, ValueError) else 1
    url = settings.serve.url
    cpus = "" if settings.replica_cpus is None else f" ({settings.replica_cpus:g} CPU each)"
    scale = settings.autoscale
    count = (f"{scale.min_replicas}-{scale.max_replicas} replicas (autoscaled, {scale.min_replicas}"
             " running)") if settings.autoscaled and scale else f"{settings.replicas} replicas"
    ray_children = {} if settings.address else child_processes()
    # before the ready line: a supervisor may stop us as soon as it reads it (a SIGTERM in
    # between met Ray's own handler, which exited 15 without draining)
    stop_requested = stop_on_signals()
    print(f"{READY_LINE}: {count}{cpus} of {settings.serve.model_name}"
          f" at {url}\n  probes: {url}/healthz {url}/readyz   metrics: {url}/metrics\n"
          f"  stop: Ctrl+C or SIGTERM (drains first)", flush=True)
    wait_for_stop(stop_requested)
    if ray_children:
        time.sleep(REACH_CHECK_S)  # the same signal reaches them at the same moment
        gone = exited(ray_children)
        if gone:
            log.warning(reach_warning(gone))
    log.info("draining the fleet (grace %.1fs)", settings.serve.shutdown_grace_s)
    aborted = stop(ingress, settings.serve.shutdown_grace_s)
    if aborted:
        log.warning("ended %d requests at shutdown", aborted)
    if not settings.address:
        ray.shutdown()
    return 0
