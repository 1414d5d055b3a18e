"""The fleet fits the machine Ray has before anything deploys (control/fleet/placement.py):
the default sizing fits a 2-core machine, a placement that cannot fit says the arithmetic,
and a replica that fails to start is named with its own error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fixtures.requires import require_module

from control.fleet.app import FleetSettings
from control.fleet.placement import deploy_failure, fit_to_cluster
from control.serve.settings import ServeSettings


def fleet(**kw) -> FleetSettings:
    return FleetSettings(ServeSettings(), **kw)


def test_the_default_fleet_shares_what_the_ingress_leaves():
    assert fit_to_cluster(fleet(), 2.0, 0.0, False).replica_cpus == 0.75
    assert fit_to_cluster(fleet(replicas=3), 2.0, 0.0, False).replica_cpus == 0.5
    assert fit_to_cluster(fleet(replicas=4), 16.0, 0.0, False).replica_cpus == 3.87
    # chosen CPUs that fit are kept
    assert fit_to_cluster(fleet(replica_cpus=0.5), 2.0, 0.0, False).replica_cpus == 0.5


def test_a_fleet_that_cannot_fit_says_the_arithmetic_and_the_way_out():
    with pytest.raises(ValueError) as err:
        fit_to_cluster(fleet(replica_cpus=1.0), 2.0, 0.0, False)
    message = str(err.value)
    assert "2 replicas x 1 CPU + the ingress's 0.5 CPU = 2.5 CPUs, but Ray has 2" in message
    assert "--replica-cpus 0.75 or less" in message
    with pytest.raises(ValueError, match="under 0.1 CPU each"):
        fit_to_cluster(fleet(replicas=40), 2.0, 0.0, False)
    with pytest.raises(ValueError, match="one GPU each; Ray has 1 GPUs"):
        fit_to_cluster(fleet(), 8.0, 1.0, True)
    assert fit_to_cluster(fleet(), 8.0, 2.0, True).replica_cpus is None  # 1 GPU each


def test_a_gpu_fleet_counts_the_ingress_cpu_too():
    # 2 GPUs and 2 CPUs: each replica takes a CPU, and nothing is left for the ingress;
    # Ray would wait for it forever
    with pytest.raises(ValueError, match=r"2 replicas x 1 CPU \+ the ingress's 0.5 CPU ="
                       r" 2.5 CPUs, but Ray has 2"):
        fit_to_cluster(fleet(), 2.0, 2.0, True)
    assert fit_to_cluster(fleet(), 2.5, 2.0, True).replicas == 2


def test_a_failed_replica_is_named_with_its_own_error():
    traceback = ("The deployment failed to start 3 times in a row. See controller logs.\n"
                 "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                 "duckdb.IOException: IO Error: Cannot open file\n"
                 "ValueError: directory /nope does not exist")
    status = SimpleNamespace(applications={"app": SimpleNamespace(deployments={
        "replica-0": SimpleNamespace(status="DEPLOY_FAILED", message=traceback),
        "replica-1": SimpleNamespace(status="HEALTHY", message=""),
        "ingress": SimpleNamespace(status="UPDATING", message="")})})
    assert deploy_failure(status, "app") == (
        "replica-0: ValueError: directory /nope does not exist")
    assert deploy_failure(status, "other") is None


def test_a_cpu_replica_runs_one_torch_thread_fewer_than_its_whole_cpus():
    """OMP threads beside the replica's own event loop: floor(cpus) - 1, at least 1."""
    from control.fleet.app import replica_torch_threads

    assert [replica_torch_threads(c) for c in (0.75, 1.0, 2.0, 2.5, 4.9)] == [1, 1, 1, 1, 3]


def test_an_autoscaled_fleet_deploys_exactly_its_max_replicas_slots():
    from control.fleet.autoscale import AutoscaleConfig

    fleet(replicas=3, autoscale=AutoscaleConfig(1, 3)).validate()
    for replicas in (2, 4):  # fewer slots than the rule may run, or slots it never runs
        with pytest.raises(ValueError, match="must equal replicas"):
            fleet(replicas=replicas, autoscale=AutoscaleConfig(1, 3)).validate()


def test_a_local_fleet_that_cannot_fit_fails_before_ray_starts(monkeypatch):
    """`sized` checks a local fleet against the CPUs it was given (or the machine's)
    before ray.init: Ray's start-up (seconds, a dozen processes) is not spent on a
    fleet that cannot run; one that fits is fitted again to what Ray reports."""
    ray = require_module("ray", "pip install -e '.[fleet]'")
    from control.fleet import app

    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: started.append(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ValueError, match=r"= 2.5 CPUs, but Ray has 2"):
        app.sized(fleet(replica_cpus=1.0, num_cpus=2))
    assert started == []
    monkeypatch.setattr(app.os, "cpu_count", lambda: 2)
    with pytest.raises(ValueError, match=r"= 2.5 CPUs, but Ray has 2"):
        app.sized(fleet(replica_cpus=1.0))  # the machine's 2 cores
    assert started == []
    assert app.sized(fleet(num_cpus=2)).replica_cpus == 0.75
    assert [kw["num_cpus"] for kw in started] == [2]
