"""1 vs 2 engine replicas on local Ray: throughput and latency at the rate where one replica
saturates, and each fleet's burst capacity.

    python -m bench.fleet_scaling            # smollm2-135m, 48 requests a run, 3 pairs
    python -m bench.fleet_scaling --smoke    # the tests' tiny model, 8 requests, 1 pair

Workload: playbooks/scenarios/chat.yaml (one tenant, prompts lognormal mean 150 tokens,
streamed) with every answer `--output-tokens` long (64) and `--concurrency` clients (64,
so the client does not cap a 2-replica fleet), written beside the results as chat-<N>.yaml.
Each pair starts fleet A (1 replica, `replica_cpus` = every core) and then fleet B (2
replicas, half the cores each) on one local Ray (`ray.init` once; `serve.shutdown` between
fleets, each stopped by its drain), and on each, after a warm-up:

1. burst: `batchpilot loadtest --rate 1000 --requests N` (every request at once) -> the
   fleet's capacity (ok requests/s); A's in the first pair is C1;
2. rate: the same scenario at C1 req/s (1.0x one replica's capacity; fixed for all pairs).

Printed per side: request_rps, output_tps, TTFT and TPOT p50/p99, failed requests, how the
ingress split each run's requests (its routed counter: the load tester's one /v1/models
lookup included); per pair B/A ratios and C2/C1; medians [min, max] over pairs. Queued
requests may wait up to QUEUE_TIMEOUT_MS (not the default 30 s) before they time out.

NOTE: on a CPU-only machine the two replicas split the same cores (Ray sets each actor's
OMP_NUM_THREADS to its `num_cpus`), so B has no more compute than A: expect C2/C1 near 1 or
below (two processes, two schedulers, one core each). The method is what carries to a
multi-GPU box, where each replica gets its own GPU and B should approach 2x A.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import loadtest_goals
from bench.loadtest_goals import BURST_RATE, SCENARIOS
from control.fleet.app import replica_torch_threads

SIDES = {"A": 1, "B": 2}  # side -> replicas
QUEUE_TIMEOUT_MS = 600_000  # a queued request's limit before it ends as a timeout
SMOKE = {"pairs": 1, "requests": 8, "output_tokens": 16, "concurrency": 16}
ROUTED = re.compile(r'^batchpilot_fleet_routed_requests_total\{([^}]*)\}\s+([0-9.e+]+)', re.M)


def write_scenario(out: Path, output_tokens: int, concurrency: int) -> Path:
    """chat.yaml with fixed-length answers and a client concurrency that lets a 2-replica
    fleet fill (chat.yaml's 16 would be the bottleneck of the burst)."""
    data = yaml.safe_load((SCENARIOS / "chat.yaml").read_text())
    data.update(name=f"chat-{output_tokens}", concurrency=concurrency,
                output={"dist": "fixed", "value": output_tokens})
    path = out / f"chat-{output_tokens}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def loadtest(url: str, scenario: Path, rate: float, requests: int, tokenizer: str | None,
             out: Path) -> dict[str, Any]:
    """One `batchpilot loadtest` run in this process -> its summary."""
    return loadtest_goals.loadtest(url, scenario, [], 1, out, rate, requests, tokenizer)[0]


def routed_by_replica(url: str) -> dict[str, float]:
    """The ingress's routed-request counters summed per replica (from its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for labels, value in ROUTED.findall(text):
        replica = re.search(r'replica="([^"]*)"', labels)
        key = replica.group(1) if replica else "?"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def warm_up(url: str, model_id: str, replicas: int) -> None:
    """A few short requests at once, so every replica has run a forward before a run."""
    def one(i: int) -> None:
        httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": model_id, "prompt": f"warm up {i}", "max_tokens": 4,
            "ignore_eos": True}).raise_for_status()

    with ThreadPoolExecutor(4 * replicas) as pool:
        list(pool.map(one, range(8 * replicas)))


@contextlib.contextmanager
def fleet(model: str, replicas: int, replica_cpus: float, port: int):
    """A started `batchpilot fleet` of `replicas` replicas, `replica_cpus` each: yields
    (url, seconds it took to be ready); drained and Serve shut down at the end."""
    from control.fleet.app import FleetSettings, start, stop
    from control.serve.settings import ServeSettings

    # NOTE: a burst queues most of its requests; under the default queue_timeout_ms (30 s)
    # a slow or shared machine ends them as timeouts, and the capacity would measure that
    # limit instead of throughput (it did: 47 of 48 on the VM at load average 10)
    serve = ServeSettings(model=model, port=port, log_level="warning",
                          engine_overrides={"queue_timeout_ms": QUEUE_TIMEOUT_MS})
    settings = FleetSettings(serve,
                             replicas=replicas, replica_cpus=replica_cpus,
                             ingress_cpus=0.5)
    began = time.monotonic()
    ingress = start(settings)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # start() returns once loaded; the ingress sees them at its next poll
        body = httpx.get(f"{url}/readyz", timeout=30).json()
        if all(r["healthy"] for r in body["replicas"]) and len(body["replicas"]) == replicas:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {replicas}-replica fleet did not poll ready: {body}")
        time.sleep(0.2)
    try:
        yield url, time.monotonic() - began
    finally:
        aborted = stop(ingress, grace_s=10.0)
        if aborted:
            print(f"fleet of {replicas}: {aborted} requests aborted at stop", flush=True)


def measure(url: str, scenario: Path, rate: float, args, out: Path) -> dict[str, Any]:
    """One `batchpilot loadtest` run -> the figures this bench reports (latencies in ms)."""
    before = routed_by_replica(url)
    s = loadtest(url, scenario, rate, args.requests, args.tokenizer, out)
    after = routed_by_replica(url)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    return {"rate_rps": round(rate, 3), "requests": s["requests"], "ok": s["ok"],
            "failed": s["requests"] - s["ok"], "duration_s": round(s["duration_s"], 2),
            "request_rps": round(s["request_rps"], 3), "output_tps": round(s["output_tps"], 1),
            "ttft_p50_ms": ms(s["ttft"]["p50"]), "ttft_p99_ms": ms(s["ttft"]["p99"]),
            "tpot_p50_ms": ms(s["tpot"]["p50"]), "tpot_p99_ms": ms(s["tpot"]["p99"]),
            "split": {k: int(after[k] - before.get(k, 0.0)) for k in sorted(after)}}


def run_side(side: str, pair: int, rate: float | None, args, model: str, scenario: Path,
             out: Path) -> dict[str, Any]:
    """Start side's fleet, warm it, burst then (once rate is known) the rate run."""
    replicas = SIDES[side]
    cpus = args.a_replica_cpus if side == "A" and args.a_replica_cpus else args.cores / replicas
    with fleet(model, replicas, cpus, args.port) as (url, start_s):
        model_id = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        warm_up(url, model_id, replicas)
        row: dict[str, Any] = {"replicas": replicas, "replica_cpus": cpus,
                               "torch_threads": replica_torch_threads(cpus),
                               "start_s": round(start_s, 1)}
        row["burst"] = measure(url, scenario, BURST_RATE, args, out / f"{side}{pair}-burst")
        rate = rate if rate is not None else row["burst"]["request_rps"]
        row["at_c1"] = measure(url, scenario, rate, args, out / f"{side}{pair}-rate")
    print(json.dumps({"pair": pair, "side": side, **row}), flush=True)
    return row


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def summarize(rows: list[dict[str, dict]], c1: float) -> dict[str, Any]:
    """Medians [min, max] over pairs per side, and the per-pair ratios B/A."""
    keys = ("request_rps", "output_tps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "failed")
    sides: dict[str, Any] = {}
    for side, replicas in SIDES.items():
        at = [r[side]["at_c1"] for r in rows]
        sides[side] = {"replicas": replicas, "replica_cpus": rows[0][side]["replica_cpus"],
                       "torch_threads": rows[0][side]["torch_threads"],
                       "capacity_rps": spread([r[side]["burst"]["request_rps"] for r in rows]),
                       "capacity_output_tps": spread([r[side]["burst"]["output_tps"]
                                                      for r in rows]),
                       "start_s": spread([r[side]["start_s"] for r in rows]),
                       **{k: spread([a[k] for a in at if a[k] is not None]) for k in keys
                          if any(a[k] is not None for a in at)}}
    ratios = {}
    for key in ("request_rps", "output_tps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                "tpot_p99_ms"):
        pairs = [(r["B"]["at_c1"][key], r["A"]["at_c1"][key]) for r in rows]
        found = [b / a for b, a in pairs if a and b is not None]
        if found:
            ratios[f"{key}_b_over_a"] = spread(found)
    ratios["c2_over_c1"] = spread([r["B"]["burst"]["request_rps"]
                                   / r["A"]["burst"]["request_rps"] for r in rows])
    # per side, each pair's requests routed to each replica (burst, then the rate run)
    splits = {side: [{run: r[side][run]["split"] for run in ("burst", "at_c1")} for r in rows]
              for side in SIDES}
    return {"c1_rps": round(c1, 3), "sides": sides, "ratios": ratios, "splits": splits}


def run(args: argparse.Namespace, model: str, out: Path) -> dict[str, Any]:
    import ray

    scenario = write_scenario(out, args.output_tokens, args.concurrency)
    # NOTE: logical CPUs: every core for A's replica plus the ingress's half (it only
    # forwards); Ray does not pin threads, OMP_NUM_THREADS per actor is what splits cores
    ray.init(num_cpus=args.cores + 1, include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, dict]] = []
    c1: float | None = None
    try:
        for pair in range(args.pairs):
            row = {"A": run_side("A", pair, c1, args, model, scenario, out)}
            c1 = c1 if c1 is not None else row["A"]["burst"]["request_rps"]
            row["B"] = run_side("B", pair, c1, args, model, scenario, out)
            rows.append(row)
    finally:
        ray.shutdown()
    assert c1 is not None
    return {"bench": "fleet_scaling", "smoke": args.smoke, "model": args.model_name,
            "scenario": scenario.name, "requests": args.requests, "pairs": args.pairs,
            "cores": args.cores, **summarize(rows, c1),
            "note": f"{args.cores} CPU cores shared by both sides: B's 2 replicas split the"
            " cores A's one replica had, so no more compute; on GPUs each replica has its own"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"tiny model, {SMOKE}")
    parser.add_argument("--model", default="smollm2-135m", help="alias or checkpoint")
    parser.add_argument("--pairs", type=int, default=3, help="A B rounds (default 3)")
    parser.add_argument("--requests", type=int, default=48, help="per run (default 48)")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64, help="clients at most")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                        help="CPUs the fleets share (default: this machine's)")
    parser.add_argument("--a-replica-cpus", type=float,
                        help="CPUs for the 1-replica side (default: every core; e.g. cores-1"
                        " leaves one to its event loop, as `batchpilot serve` does)")
    parser.add_argument("--port", type=int, default=8125)
    parser.add_argument("--out", help="load-test reports here (default: a temporary folder)")
    args = parser.parse_args()
    if args.pairs < 1 or args.requests < 1 or args.cores < 1:
        parser.error(f"--pairs={args.pairs}, --requests={args.requests} and --cores="
                     f"{args.cores} must be >= 1")
    if args.smoke:
        vars(args).update(SMOKE)
    args.tokenizer, args.model_name = None, args.model
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scaling-")))
        if args.smoke:
            from bench.random_models import tiny_checkpoint

            args.model = args.tokenizer = str(tiny_checkpoint(tmp / "model"))
            args.model_name = "tiny (tests)"
        out = Path(args.out) if args.out and not args.smoke else tmp
        out.mkdir(parents=True, exist_ok=True)
        result = run(args, args.model, out)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
