"""A window's requests replayed on N replicas, routed as the fleet's ingress routes them.

    prediction = replay_fleet(window, config, model, replicas=3)   # one merged Prediction

Each replica is its own engine (the replay's light path, control/whatif/lean.py) on its own
virtual clock, all with `config` and the same fitted step time. Before a request is routed,
every replica runs its steps up to the request's arrival (a busy replica's last step may
end after it: its load is then as of that step's start, as a polled replica's is), then
control/fleet/router.py's `choose` picks one from each replica's running and waiting
requests and KV usage, with the default policy: the replica its tenant and first 64 prompt
tokens hash to (rendezvous: the same tenant's shared prefix goes to the same replica),
unless it carries `max_imbalance` requests or `max_kv_imbalance` KV more than the least
loaded, then the less loaded of two at random (seeded: deterministic). What the single
replay assumes (control/whatif/replay.py) holds per replica: lengths, cancels at their
recorded time, deadlines, prefix hits within a tenant.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass

from tqdm import tqdm

from control.fleet.router import ReplicaLoad, RoutingPolicy, choose
from control.whatif.calibrate import FEATURES, StepTimeModel
from control.whatif.lean import LeanExecutor, ReplayEngine
from control.whatif.replay import (
    DUE_SLACK_S,
    IDLE_TICK_S,
    Prediction,
    _prompt,
    add_recorded,
    replay_plan,
)
from control.whatif.window import Window
from engine.config import EngineConfig
from engine.records import RequestRecord
from engine.sim.executor import FakeClock

MAX_REPLICAS = 64
AFFINITY_TOKENS = 64  # prompt ids hashed, as RoutingPolicy.prefix_tokens
DEFAULT_POLICY = RoutingPolicy()  # the ingress's default (control/fleet/router.py)


@dataclass
class _Replica:
    engine: ReplayEngine
    clock: FakeClock
    executor: LeanExecutor
    gap_s: float
    kv_peak: int = 0
    preempted: int = 0

    def load(self, replica_id: int) -> ReplicaLoad:
        e = self.engine
        return ReplicaLoad(replica_id, waiting=e.scheduler.lanes.num_waiting,
                           running=len(e.scheduler.running), kv_usage=e.block_manager.usage)

    def run_until(self, t: float, records: list[RequestRecord]) -> None:
        """Steps while there is work and its clock is before `t`; idle, its clock jumps
        to `t` (no step would have run). `t` infinite: until its work is done."""
        while self.clock.now < t:
            if not self.engine.has_unfinished_requests():
                if t != float("inf"):
                    self.clock.now = t
                return
            done = self.engine.replay_step()
            if done.ran:
                self.kv_peak = max(self.kv_peak, done.kv_used)
                self.preempted += done.preempted
                self.clock.now += self.gap_s if done.tokens else IDLE_TICK_S
            records.extend(done.finished)


def replay_fleet(window: Window, config: EngineConfig, model: StepTimeModel, label: str = "",
                 progress: bool = False, *, replicas: int,
                 policy: RoutingPolicy = DEFAULT_POLICY) -> Prediction:
    """Deterministic for a window, config, model and replica count."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas={replicas} must be in 1..{MAX_REPLICAS}")
    started = time.perf_counter()
    fleet = []
    for _ in range(replicas):
        clock = FakeClock(window.since)
        executor = LeanExecutor(model, clock)
        engine = ReplayEngine(config, executor, clock=clock, step_law=window.step_law)
        fleet.append(_Replica(engine, clock, executor, model.gap_s))
    reqs = window.requests
    lengths, entries, cancels = replay_plan(window, config)
    lanes, tenants, rng = set(config.live.lane_names), {}, random.Random(0)
    placed: dict[int, int] = {}  # request index -> replica
    records: list[RequestRecord] = []
    for t, i in tqdm(entries, desc=f"whatif {label} x{replicas}".strip(), unit="req",
                     disable=not progress):
        while cancels and cancels[0][0] <= t + DUE_SLACK_S:
            when, j = heapq.heappop(cancels)
            if j in placed:
                fleet[placed[j]].run_until(when, records)
                fleet[placed[j]].engine.abort(f"w{j}")
        for replica in fleet:
            replica.run_until(t, records)
        r = reqs[i]
        prompt = _prompt(i, r, tenants)
        key = f"{r.tenant}\x00{prompt[:AFFINITY_TOKENS]}".encode()
        k = choose(key, [rep.load(n) for n, rep in enumerate(fleet)], policy, rng).replica_id
        placed[i] = k
        add_recorded(fleet[k].engine, i, r, prompt, lengths[i], lanes)
    for when, j in sorted(cancels):  # cancels after the last arrival
        fleet[placed[j]].run_until(when, records)
        fleet[placed[j]].engine.abort(f"w{j}")
    for replica in fleet:
        replica.run_until(float("inf"), records)
    order = {f"w{i}": i for i in range(len(reqs))}
    records.sort(key=lambda rec: order[rec.request_id])
    largest = {name: max(rep.executor.largest[n] for rep in fleet)
               for n, name in enumerate(FEATURES) if n > 0}
    # KV: the busiest replica's peak, of one replica's pool (what a watermark acts on)
    return Prediction(label, records, sum(rep.executor.steps for rep in fleet),
                      config.static.num_kv_blocks,
                      max(rep.kv_peak for rep in fleet), sum(rep.preempted for rep in fleet),
                      max(rep.clock.now for rep in fleet) - window.since,
                      sum(rep.executor.beyond_seen for rep in fleet), largest,
                      time.perf_counter() - started)
