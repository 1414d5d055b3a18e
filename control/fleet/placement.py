"""How the fleet fits the machine (or cluster) Ray has, decided before anything deploys.

    CPU only:  replicas x replica_cpus + ingress_cpus <= Ray's CPUs
               replica_cpus unset: (Ray's CPUs - ingress_cpus) / replicas, so the default
               fleet fits any machine (2 cores, 2 replicas: 0.75 CPU each)
    with GPUs: replicas <= Ray's GPUs (one each), ingress_cpus + 1 CPU a replica <= CPUs

A placement that cannot fit is a ValueError with the arithmetic, at once: Ray itself would
wait forever for resources that never come (and say so only in its controller's log).
A replica that fails to start surfaces its own error, not just Serve's "Deploying
application ... failed".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

MIN_REPLICA_CPUS = 0.1  # below this a replica cannot run a step in reasonable time


def fit_to_cluster(settings: Any, cpus: float, gpus: float, cuda: bool) -> Any:
    """`settings` (FleetSettings) with replica_cpus decided; ValueError if it cannot fit."""
    n, ingress = settings.replicas, settings.ingress_cpus
    if cuda:
        if n > gpus:
            raise ValueError(f"{n} replicas need one GPU each; Ray has {gpus:g} GPUs")
        needed = n * 1.0 + ingress
        if needed > cpus + 1e-9:
            raise ValueError(f"{n} replicas x 1 CPU + the ingress's {ingress:g} CPU ="
                             f" {needed:g} CPUs, but Ray has {cpus:g}")
        return settings
    per_replica = settings.replica_cpus
    if per_replica is None:
        per_replica = math.floor((cpus - ingress) / n * 100) / 100
        if per_replica < MIN_REPLICA_CPUS:
            raise ValueError(f"{n} replicas cannot share the {cpus - ingress:g} CPUs the"
                             f" ingress leaves of Ray's {cpus:g} (under {MIN_REPLICA_CPUS}"
                             " CPU each): fewer --replicas, or more --num-cpus")
    needed = n * per_replica + ingress
    if needed > cpus + 1e-9:
        room = math.floor((cpus - ingress) / n * 100) / 100
        raise ValueError(
            f"{n} replicas x {per_replica:g} CPU + the ingress's {ingress:g} CPU = {needed:g}"
            f" CPUs, but Ray has {cpus:g}: Ray would wait for them forever. Use"
            f" --replica-cpus {room:g} or less (or leave it unset), fewer --replicas, or"
            " more --num-cpus")
    return dataclasses.replace(settings, replica_cpus=per_replica)


def deploy_failure(status: Any, app_name: str) -> str | None:
    """What the failed replicas said, from `serve.status()`: 'replica-0: <its error's last
    line>; ...', or None when Serve recorded nothing."""
    app = status.applications.get(app_name)
    if app is None:
        return None
    reasons = []
    for name, deployment in sorted(app.deployments.items()):
        message = (getattr(deployment, "message", "") or "").strip()
        if not message or "HEALTHY" in str(getattr(deployment, "status", "")):
            continue
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        reasons.append(f"{name}: {last_error(lines)}")
    return "; ".join(reasons) or None


def last_error(lines: list[str]) -> str:
    """The last 'SomeError: message' line of a traceback, else the last line."""
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head:
            return line
    return lines[-1]
