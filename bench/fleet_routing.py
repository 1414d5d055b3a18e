"""Fleet routing: prefix/tenant affinity vs random routing over two replicas, side by side.

    python -m bench.fleet_routing            # tiny model, 12 system prompts, 4 pairs of rounds
    python -m bench.fleet_routing --smoke    # seconds: 1 pair, 12 requests a round

The replicas run in this process (control/fleet/local.py: the same EngineReplica and
FleetIngress as `batchpilot fleet`, without Ray, whose start-up alone would take longer than
a smoke run), the ingress behind uvicorn on a loopback port, clients streaming over HTTP.

Workload: `--prompts` system prompts of ~`--system-tokens` tokens, each owned by one tenant
(X-Tenant), requests pick a prompt uniformly and add a unique question; `--concurrency`
clients in a closed loop, `max_tokens` 8. Each replica's KV pool (`--kv-blocks`) holds about
half the system prompts, so where a prompt's requests go decides whether its prefix is still
cached. Rounds alternate affinity / random (A B A B), each with fresh system prompts, so no
round starts with another's cache. Reported per mode: prefix hit rate (prompt tokens found
in the cache / looked up, summed over replicas), client TTFT p50 and p99, medians over rounds;
each round's line also counts the router's decisions (affinity, balance, random).
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
import uvicorn

from control.fleet.ingress import FleetIngress, build_app
from control.fleet.local import LocalHandle, wait_healthy
from control.fleet.replica import EngineReplica
from control.fleet.router import RoutingPolicy
from control.serve.settings import ServeSettings

WORDS = ["scheduler", "block", "cache", "token", "budget", "lane", "request", "prefill",
         "decode", "queue", "river", "fox", "shells", "weather", "number", "trace",
         "dashboard", "operator", "preempt"]


def system_prompt(round_id: int, index: int, words: int, rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"[round {round_id} agent {index}] You answer about {body}.\n"


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


def prefix_counts(replicas: list[EngineReplica]) -> tuple[float, float]:
    hits = queries = 0.0
    for replica in replicas:
        metrics = replica.state.metrics
        labels = {"model": replica.state.settings.model_name}
        reg = metrics.registry
        hits += reg.get_sample_value("batchpilot_prefix_cache_hits_total", labels) or 0.0
        queries += reg.get_sample_value("batchpilot_prefix_cache_queries_total", labels) or 0.0
    return hits, queries


async def run_round(args: argparse.Namespace, fleet: FleetIngress, replicas: list[EngineReplica],
                    url: str, mode: str, round_id: int) -> dict[str, Any]:
    fleet.policy = RoutingPolicy(mode=mode, max_imbalance=args.max_imbalance).validate()
    rng = random.Random(round_id)
    prompts = [system_prompt(round_id, i, args.system_words, rng) for i in range(args.prompts)]
    work = [(i, rng.randrange(args.prompts)) for i in range(args.requests)]
    hits0, queries0 = prefix_counts(replicas)
    decided0 = dict(fleet.decisions)
    ttfts: list[float] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while work:
            i, p = work.pop()
            question = f"Question {round_id}-{i}: what about {rng.choice(WORDS)}?"
            ttfts.append(await one_request(client, url, prompts[p] + question, f"tenant-{p}"))

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(args.concurrency)))
    await asyncio.sleep(0.5)  # the metrics thread counts the last steps
    hits1, queries1 = prefix_counts(replicas)
    ttfts.sort()
    decided = {k: v - decided0.get(k, 0) for k, v in fleet.decisions.items()}
    return {"mode": mode, "round": round_id, "decisions": decided,
            "prefix_hit_rate": (hits1 - hits0) / max(1.0, queries1 - queries0),
            "ttft_p50_s": ttfts[len(ttfts) // 2],
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))]}


async def main_async(args: argparse.Namespace, model: str) -> dict[str, Any]:
    settings = ServeSettings(model=model, control_api=False, watch_config=False,
                             engine_overrides={"num_kv_blocks": args.kv_blocks,
                                               "max_num_seqs": 8})
    replicas = [await EngineReplica(settings, i).start() for i in range(args.replicas)]
    fleet = FleetIngress([LocalHandle(r) for r in replicas], RoutingPolicy(), seed=0)
    fleet.start_polls()
    server = uvicorn.Server(uvicorn.Config(build_app(fleet), host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="off"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    await wait_healthy(lambda: all(r.healthy for r in fleet.table.snapshot()))
    rounds = []
    try:
        for pair in range(args.pairs):
            for mode in ("affinity", "random"):
                rounds.append(await run_round(args, fleet, replicas, url, mode,
                                              2 * pair + (mode == "random")))
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        server.should_exit = True
        await serving
        await fleet.stop_polls()
        for replica in replicas:
            await replica.shutdown()
    return summarize(args, rounds)


def summarize(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "fleet_routing", "smoke": args.smoke,
                           "replicas": args.replicas,
                           "prompts": args.prompts, "requests_per_round": args.requests,
                           "pairs": args.pairs}
    for mode in ("affinity", "random"):
        mine = [r for r in rounds if r["mode"] == mode]
        for key in ("prefix_hit_rate", "ttft_p50_s", "ttft_p99_s"):
            values = [r[key] for r in mine]
            out[f"{mode}_{key}"] = round(statistics.median(values), 4)
            out[f"{mode}_{key}_range"] = [round(min(values), 4), round(max(values), 4)]
    out["ttft_p50_ratio_random_over_affinity"] = round(
        out["random_ttft_p50_s"] / max(1e-9, out["affinity_ttft_p50_s"]), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--model", help="default: the tests' tiny random-weight Llama")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--system-words", type=int, default=120)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--kv-blocks", type=int, default=160)
    parser.add_argument("--max-imbalance", type=int, default=RoutingPolicy.max_imbalance)
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.requests, args.pairs, args.concurrency = 4, 12, 1, 3
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
