"""An EngineReplica's drain and retirement, over a stand-in engine (no model, no Ray): what
the ingress polls and what Serve's health check sees once a rolling restart retires it, and
the count of requests a drain had to abort."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from control.fleet import replica as replica_module
from control.fleet.replica import RETIRED, EngineReplica


class StandInEngine:
    """Requests in flight that never finish on their own; abort_all ends them."""

    def __init__(self, state):
        self.state, self.draining, self.aborted = state, False, None
        self.stats = SimpleNamespace(waiting=0, running=2, kv_usage=0.1, kv_blocks_used=3,
                                     queue_slo_share=0.0, steps=7)

    def health(self):
        return None

    def serving_problem(self):
        return None

    def start_draining(self):
        self.draining = True

    def abort_all(self, reason):
        self.aborted, self.state.inflight = reason, 0


def stand_in_replica(inflight: int) -> EngineReplica:
    replica = EngineReplica.__new__(EngineReplica)  # no app, no engine: the stand-in's
    replica.replica_id, replica.incarnation, replica.started_at = 1, "abc", 0.0
    replica.retired = False
    replica.state = SimpleNamespace(inflight=inflight)
    replica.state.engine = StandInEngine(replica.state)
    replica.tee = SimpleNamespace(fleet_version=0)
    return replica


def test_a_drain_counts_the_requests_it_had_to_abort(monkeypatch):
    monkeypatch.setattr(replica_module, "ABORT_FLUSH_S", 0.1)
    replica = stand_in_replica(inflight=2)
    assert asyncio.run(replica.drain(0.05)) == 2
    assert replica.state.engine.draining and replica.state.engine.aborted == "shutdown"


def test_a_retired_replica_polls_not_ready_and_fails_its_health_check(monkeypatch):
    """Retired by a rolling restart: the ingress routes nothing more to it (its polls say
    not ready, why) while Serve's health checks fail until it replaces the process."""
    monkeypatch.setattr(replica_module, "ABORT_FLUSH_S", 0.1)
    replica = stand_in_replica(inflight=0)
    assert replica._stats()["ready"] is True
    assert asyncio.run(replica.retire(0.05)) == 0
    stats = replica._stats()
    assert stats["ready"] is False and stats["reason"] == RETIRED
    with pytest.raises(RuntimeError, match="retired by a rolling restart"):
        replica.check_health()
