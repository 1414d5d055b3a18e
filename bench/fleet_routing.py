"""Fleet routing: precise (KV events), an oracle, affinity and random, side by side.

    python -m bench.fleet_routing            # tiny model, cache pressure, 4 groups of rounds
    python -m bench.fleet_routing --smoke    # seconds: 1 group, 16 requests a round
    python -m bench.fleet_routing --model smollm2-135m --workload system-prompts

The replicas run in this process (control/fleet/local.py: the same EngineReplica and
FleetIngress as `batchpilot fleet`, without Ray, whose start-up alone would take longer than
a smoke run), the ingress behind uvicorn on a loopback port, clients streaming over HTTP.

Routers: `precise` (the ingress's KV index, fed by the replicas' KV events a poll late:
control/fleet/kv_index.py), `oracle` (the same router asking every replica's block manager
directly, at no cost: the ceiling precise aims for), `affinity` (rendezvous hash of tenant +
the first 256 characters) and `random`; `--modes` may add `precise@W` (precise with
`load_blocks` W; `precise@0`: blocks alone decide, as precise did before it weighed load).
Rounds rotate through them (A B C D A B C D), each on fresh prompts, so no round starts
with another's cache.

Workloads (`--concurrency` clients in a closed loop, `max_tokens` 8, a unique question
each):
- `cache-pressure` (default): `--tenants` tenants with `--docs` documents each; a
  document's prompt opens with its tenant's preamble, longer than the 256 characters
  affinity hashes, so affinity sends all of a tenant's documents to one replica. Each
  replica's pool holds `--kv-blocks` blocks, by default 0.7x the distinct full blocks of a
  round's prompts (its live prefixes, counted with the model's tokenizer, so the pressure
  is the same whatever the model's tokens per word): one replica cannot hold them all, the
  fleet can. Halfway through every round the last replica is restarted with an empty cache
  (`--no-restart`: not).
- `system-prompts`: `--prompts` system prompts of `--system-words` words, each its own
  tenant's (where affinity does well).
Reported per router: prefix hit rate (prompt tokens found in the cache / looked up, summed
over replicas), client TTFT p50 and p99, medians over rounds with their ranges, TTFT p99
over all of its rounds' requests pooled, the routers' decisions, and ratios (precise over
oracle, affinity, random). A first round, not counted, warms the replicas up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_routing_bed import POOL_SHARE, Bed, hit_rate, prefix_counts, workload
from control.fleet.router import RoutingPolicy


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, tenant: str,
                      ) -> float:
    """Client TTFT in seconds (request sent -> first token chunk)."""
    sent = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", headers={"X-Tenant": tenant},
                             json={"prompt": prompt, "max_tokens": 8, "stream": True,
                                   "ignore_eos": True, "temperature": 0}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"status {resp.status_code}: {await resp.aread()!r}")
        ttft = None
        async for line in resp.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.perf_counter() - sent
    return ttft if ttft is not None else float("nan")


async def run_round(args: argparse.Namespace, bed: Bed, mode: str, round_id: int,
                    ) -> dict[str, Any]:
    """One round of `mode` on fresh prompts; cache-pressure restarts the last replica
    halfway (between the halves: no request is in flight)."""
    fleet = bed.fleet
    base, _, weight = mode.partition("@")
    fleet.policy = RoutingPolicy(
        mode="precise" if base == "oracle" else base, max_imbalance=args.max_imbalance,
        max_kv_imbalance=args.max_kv_imbalance,
        **({"load_blocks": float(weight)} if weight else {})).validate()
    fleet.kv_index = bed.oracle if mode == "oracle" else bed.index
    rng = random.Random(round_id)
    work = workload(args, round_id, rng)
    counts0 = [prefix_counts(bed.replicas)]
    decided0 = dict(fleet.decisions)
    ttfts: list[float] = []

    async def client_loop(client: httpx.AsyncClient, queue: list[tuple[str, str]]) -> None:
        while queue:
            prompt, tenant = queue.pop()
            ttfts.append(await one_request(client, bed.url, prompt, tenant))

    halves = [work] if not args.restart else [work[: len(work) // 2], work[len(work) // 2:]]
    indexed = 0
    async with httpx.AsyncClient(timeout=120) as client:
        for half, queue in enumerate(halves):
            if half:
                await asyncio.sleep(0.5)  # the metrics thread counts the last steps
                counts0.append(prefix_counts(bed.replicas))
                # what the KV index learnt from the events by now (5 polls after the last
                # request): a round too short for any precise decision still shows it
                indexed = sum(r["blocks"] for r in bed.index.families_data())
                await bed.restart(len(bed.replicas) - 1)
            await asyncio.gather(*(client_loop(client, queue)
                                   for _ in range(args.concurrency)))
    await asyncio.sleep(0.5)
    counts1 = prefix_counts(bed.replicas)
    # hits over both halves: the restarted replica's counters restart from 0
    before = {k: v for counts in counts0 for k, v in counts.items()}
    ttfts.sort()
    decided = {k: v - decided0.get(k, 0) for k, v in fleet.decisions.items()}
    return {"mode": mode, "round": round_id, "decisions": decided, "indexed_blocks": indexed,
            "prefix_hit_rate": hit_rate(before, {**before, **counts1}),
            "ttft_p50_s": quantile(ttfts, 0.5), "ttft_p99_s": quantile(ttfts, 0.99),
            "ttfts": ttfts}


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def main_async(args: argparse.Namespace, model: str) -> dict[str, Any]:
    bed = Bed(args, model)
    await bed.start(args.replicas)
    rounds = []
    try:
        # a round not counted: a replica's first requests pay for warm-up (allocations,
        # first shapes), which would land on whichever router runs first
        await run_round(args, bed, args.modes[0], -1)
        for pair in range(args.pairs):
            for k, mode in enumerate(args.modes):
                rounds.append(await run_round(args, bed, mode,
                                              len(args.modes) * pair + k))
                print(json.dumps({key: v for key, v in rounds[-1].items() if key != "ttfts"}),
                      flush=True)
    finally:
        await bed.stop()
    return summarize(args, rounds)


def summarize(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "fleet_routing", "smoke": args.smoke,
                           "workload": args.workload, "restart": args.restart,
                           "replicas": args.replicas, "requests_per_round": args.requests,
                           "pairs": args.pairs, "modes": args.modes,
                           "live_blocks": args.live_blocks, "kv_blocks": args.kv_blocks}
    for mode in args.modes:
        mine = [r for r in rounds if r["mode"] == mode]
        decisions: dict[str, int] = {}
        for r in mine:
            for reason, count in r["decisions"].items():
                decisions[reason] = decisions.get(reason, 0) + count
        out[f"{mode}_decisions"] = {k: v for k, v in decisions.items() if v}
        out[f"{mode}_indexed_blocks"] = min(r["indexed_blocks"] for r in mine)
        for key in ("prefix_hit_rate", "ttft_p50_s", "ttft_p99_s"):
            values = [r[key] for r in mine]
            out[f"{mode}_{key}"] = round(statistics.median(values), 4)
            out[f"{mode}_{key}_range"] = [round(min(values), 4), round(max(values), 4)]
        # a round's p99 is its slowest request or two; over every round's requests it
        # is the ~1% slowest of them all
        pooled = sorted(t for r in mine for t in r["ttfts"])
        out[f"{mode}_ttft_p99_pooled_s"] = round(quantile(pooled, 0.99), 4)
    ratios = out["ratios"] = {}
    for a, b, key in (("precise", "oracle", "prefix_hit_rate"),
                      ("precise", "affinity", "prefix_hit_rate"),
                      ("precise", "random", "prefix_hit_rate"),
                      ("precise", "affinity", "ttft_p99_s"),
                      ("precise", "affinity", "ttft_p99_pooled_s"),
                      ("precise", "precise@0", "prefix_hit_rate"),
                      ("precise", "precise@0", "ttft_p99_s"),
                      ("random", "affinity", "ttft_p50_s")):
        if a in args.modes and b in args.modes:
            ratios[f"{key}:{a}/{b}"] = round(out[f"{a}_{key}"] / max(1e-9, out[f"{b}_{key}"]), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--model", help="default: the tests' tiny random-weight Llama")
    parser.add_argument("--workload", choices=("cache-pressure", "system-prompts"),
                        default="cache-pressure")
    parser.add_argument("--modes", default="precise,oracle,affinity,random",
                        help="routers, in the order each group of rounds runs them")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=12, help="system-prompts: how many")
    parser.add_argument("--tenants", type=int, default=3, help="cache-pressure")
    parser.add_argument("--docs", type=int, default=4, help="cache-pressure: per tenant")
    parser.add_argument("--preamble-words", type=int, default=50,
                        help="cache-pressure: each tenant's preamble (> 256 characters)")
    parser.add_argument("--system-words", type=int, default=120)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=4, help="groups of rounds")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help=f"each replica's pool (default: {POOL_SHARE}x a round's live"
                             " prompt blocks)")
    parser.add_argument("--no-restart", dest="restart", action="store_false",
                        help="cache-pressure restarts the last replica halfway by default")
    parser.add_argument("--max-imbalance", type=int, default=RoutingPolicy.max_imbalance)
    parser.add_argument("--max-kv-imbalance", type=float,
                        default=RoutingPolicy.max_kv_imbalance)
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    args.restart = args.restart and args.workload == "cache-pressure"
    if args.smoke:
        args.prompts, args.requests, args.pairs, args.concurrency = 4, 16, 1, 3
        args.tenants, args.docs = 2, 3
    import torch

    torch.set_num_threads(1)  # two engine threads and the event loop share the cores
    with contextlib.ExitStack() as stack:
        model = args.model
        if model is None:
            from bench.random_models import tiny_checkpoint

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            model = str(tiny_checkpoint(folder))
        result = asyncio.run(main_async(args, model))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
