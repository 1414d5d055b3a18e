"""The routing bench's bed (bench/fleet_routing.py): two or more replicas of one model in this
process behind a real ingress and its HTTP server, the workloads' prompts, and the replicas'
prefix-cache counters. An OracleIndex answers where blocks are by asking the replicas'
block managers directly."""

from __future__ import annotations

import argparse
import asyncio
import random

import uvicorn

from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.prefix_keys import PrefixSpec
from control.fleet.replica import EngineReplica
from control.fleet.router import RoutingPolicy
from control.serve.settings import ServeSettings

WORDS = ["scheduler", "block", "cache", "token", "budget", "lane", "request", "prefill",
         "decode", "queue", "river", "fox", "shells", "weather", "number", "trace",
         "dashboard", "operator", "preempt"]
BLOCK_SIZE = 16  # the engine's default, which the replicas run
POOL_SHARE = 0.7  # a replica's pool over a round's live prompt blocks: < 1 is the pressure


def live_blocks(spec: PrefixSpec, work: list[tuple[str, str]], block_size: int) -> int:
    """Distinct full prompt blocks of a round (as the replicas' prefix cache keys them)."""
    keys, live = spec.build(), set()
    try:
        for prompt, tenant in work:
            live.update(keys.keys("/v1/completions", {"prompt": prompt},
                                  {"x-tenant": tenant}, block_size, "tenant"))
    finally:
        keys.close()
    return len(live)


def system_prompt(round_id: int, index: int, words: int, rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"[round {round_id} agent {index}] You answer about {body}.\n"


def prefix_counts(replicas: list[EngineReplica]) -> dict[int, tuple[float, float]]:
    """id(replica) -> (prefix-cache hit tokens, looked-up tokens) so far; a restarted
    replica is a new object whose counts start at 0."""
    counts = {}
    for replica in replicas:
        reg, labels = replica.state.metrics.registry, {"model": replica.state.settings.model_name}
        counts[id(replica)] = (
            reg.get_sample_value("batchpilot_prefix_cache_hits_total", labels) or 0.0,
            reg.get_sample_value("batchpilot_prefix_cache_queries_total", labels) or 0.0)
    return counts


def hit_rate(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]],
             ) -> float:
    hits = sum(h - before.get(k, (0.0, 0.0))[0] for k, (h, _) in after.items())
    queries = sum(q - before.get(k, (0.0, 0.0))[1] for k, (_, q) in after.items())
    return hits / max(1.0, queries)


def workload(args: argparse.Namespace, round_id: int, rng: random.Random,
             ) -> list[tuple[str, str]]:
    """[(prompt, tenant)] of one round, in the order clients pop them (from the end)."""
    if args.workload == "system-prompts":
        prompts = [system_prompt(round_id, i, args.system_words, rng)
                   for i in range(args.prompts)]
        picks = [rng.randrange(args.prompts) for _ in range(args.requests)]
        return [(prompts[p] + f"Question {round_id}-{i}: what about {rng.choice(WORDS)}?",
                 f"tenant-{p}") for i, p in enumerate(picks)]
    # cache-pressure: each tenant's documents open with the tenant's own preamble, longer
    # than the 256 characters affinity hashes, so affinity sends all of a tenant's
    # documents to one replica, whose pool cannot hold them all
    preambles = [system_prompt(round_id, t, args.preamble_words, rng)
                 for t in range(args.tenants)]
    docs = [[preambles[t] + system_prompt(round_id, 100 * t + d, args.system_words, rng)
             for d in range(args.docs)] for t in range(args.tenants)]
    work = []
    for i in range(args.requests):
        t, d = rng.randrange(args.tenants), rng.randrange(args.docs)
        work.append((docs[t][d] + f"Question {round_id}-{i}: {rng.choice(WORDS)}?",
                     f"tenant-{t}"))
    return work


class OracleIndex:
    """A KV index that knows every replica's blocks at no cost: it asks their block
    managers directly (in this process), where the real index follows events a poll late."""

    def __init__(self, bed: Bed):
        self.bed, self.enabled, self.sharing = bed, True, "tenant"

    @property
    def block_size(self) -> int:
        return self.bed.index.block_size or 16

    def matches(self, keys: list[int]) -> dict[int, int]:
        out = {}
        for i, replica in enumerate(self.bed.replicas):
            manager = replica.state.engine.parts.engine.block_manager
            out[i] = next((n for n, key in enumerate(keys) if not manager.holds(key)),
                          len(keys))
        return out


class Bed:
    """The replicas, the ingress (precise-capable: KV events on, one hash key) and its
    server; `restart(i)` replaces replica i with a fresh process-like replica."""

    def __init__(self, args: argparse.Namespace, model: str):
        self.spec = PrefixSpec(model)
        args.live_blocks = live_blocks(self.spec, workload(args, 0, random.Random(0)),
                                       BLOCK_SIZE)
        if args.kv_blocks is None:
            args.kv_blocks = max(1, round(POOL_SHARE * args.live_blocks))
        self.settings = ServeSettings(
            model=model, control_api=False, watch_config=False, kv_events=True,
            prefix_hash_key=self.spec.hash_key,
            # NOTE: no SLO shedding: the bench compares where requests go, and a replica that
            # refuses (429) a request a slow CPU would serve late would end the round
            engine_overrides={"num_kv_blocks": args.kv_blocks, "max_num_seqs": 8,
                              "slo_unreachable": "serve"})
        self.replicas: list[EngineReplica] = []
        self.url = ""

    async def start(self, n: int) -> None:
        self.replicas = [await EngineReplica(self.settings, i).start() for i in range(n)]
        self.handles = [LocalHandle(r) for r in self.replicas]
        self.fleet = FleetIngress(self.handles, RoutingPolicy(mode="precise"), seed=0,
                                  prefix=self.spec)
        self.index, self.oracle = self.fleet.kv_index, OracleIndex(self)
        self.fleet.start_polls()
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.fleet), host="127.0.0.1",
                                                    port=0, log_level="warning",
                                                    lifespan="off"))
        self.serving = asyncio.ensure_future(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        await wait_healthy(lambda: all(r.healthy for r in self.fleet.table.snapshot()))

    async def restart(self, i: int) -> None:
        await self.replicas[i].shutdown()
        self.replicas[i] = await EngineReplica(self.settings, i).start()
        self.handles[i].replica = self.replicas[i]  # the ingress's handle, as Serve's would
        await wait_healthy(lambda: all(r.healthy for r in self.fleet.table.snapshot()))

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.serving
        await self.fleet.stop_polls()
        for replica in self.replicas:
            await replica.shutdown()
