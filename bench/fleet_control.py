"""The fleet's control plane on local Ray: how long a config change takes to reach every
replica, and what the canary decides on a bad change and on a good one.

    python -m bench.fleet_control            # tiny model, 2 replicas, 5 pairs, 2 canaries
    python -m bench.fleet_control --smoke    # 2 pairs, 3 clients, 6 s canary windows

A 2-replica `batchpilot fleet` (control/fleet/app.py, as the CLI starts it) on a local Ray.
Convergence: PATCH /control/config alternating max_num_seqs between two values, pairs of
(idle fleet, fleet under `--clients` closed-loop clients), A B A B; the figure is the
ingress's `converge_s` (version recorded -> every replica answered that it installed it
between two steps) and the client's round trip. Canaries, under the same load: the bad
change max_num_seqs=1 and the good change max_num_seqs=64 (from 8), each on 1 replica,
`--watch` seconds; printed: the decision, its reason and both sides' figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def load(url: str, stop: threading.Event, client_id: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        i = 0
        while not stop.is_set():
            client.post("/v1/completions", headers={"X-Tenant": f"t{client_id}-{i % 3}"},
                        json={"prompt": f"Load {client_id} {i}", "max_tokens": 12,
                              "ignore_eos": True})
            i += 1


@contextlib.contextmanager
def loaded(url: str, clients: int):
    stop = threading.Event()
    threads = [threading.Thread(target=load, args=(url, stop, i), daemon=True)
               for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def wait_ready(url: str, replicas: int, timeout_s: float = 120.0) -> None:
    """Until the ingress has polled every replica healthy: start() returns once they are
    loaded, and a change pushed before the ingress's next poll skips a replica it has not
    seen yet (converged false; on a busy machine the poll came after the first change)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = httpx.get(f"{url}/readyz", timeout=30).json()["replicas"]
        if len(found) == replicas and all(r["healthy"] for r in found):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fleet did not poll {replicas} replicas healthy: {found}")
        time.sleep(0.2)


def change(client: httpx.Client, value: int) -> dict[str, Any]:
    version = client.get("/control/config").json()["version"]
    start = time.monotonic()
    resp = client.patch("/control/config", headers={"If-Match": str(version)},
                        json={"changes": {"max_num_seqs": value}, "reason": "bench"})
    rtt = time.monotonic() - start
    body = resp.json()
    assert resp.status_code == 200 and body["converged"], resp.text
    return {"converge_ms": body["converge_s"] * 1000, "round_trip_ms": rtt * 1000}


def canary(client: httpx.Client, value: int, watch_s: float) -> dict[str, Any]:
    version = client.get("/control/config").json()["version"]
    resp = client.post("/control/canary", headers={"If-Match": str(version)}, json={
        "changes": {"max_num_seqs": value}, "replicas": 1, "watch_s": watch_s,
        "min_requests": 5, "reason": "bench"})
    assert resp.status_code == 202, resp.text
    while (run := client.get("/control/canary").json()["canary"])["status"] == "watching":
        time.sleep(0.5)
    d = run["decision"]
    keep = ("requests", "ttft_p99_s", "tpot_p99_s", "error_rate", "goodput_share")
    return {"change": f"max_num_seqs -> {value}", "decision": run["status"], "why": d["why"],
            "decided_after_s": round(d["window_s"], 1),
            "canary": {k: d["canary"][k] for k in keep},
            "baseline": {k: d["baseline"][k] for k in keep}}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1), "n": len(values)}


def run(args: argparse.Namespace, model: str) -> dict[str, Any]:
    import ray
    from ray import serve

    from control.fleet.app import FleetSettings, start
    from control.serve.settings import ServeSettings

    settings = FleetSettings(ServeSettings(model=model, port=args.port,
                                           engine_overrides={"num_kv_blocks": 256}),
                             replicas=2, num_cpus=2, replica_cpus=0.5, ingress_cpus=0.25)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    url = f"http://127.0.0.1:{args.port}"
    try:
        start(settings)
        wait_ready(url, settings.replicas)
        out: dict[str, Any] = {"bench": "fleet_control", "smoke": args.smoke,
                               "pairs": args.pairs, "clients": args.clients,
                               "watch_s": args.watch}
        rows: dict[str, list[dict[str, float]]] = {"idle": [], "loaded": []}
        with httpx.Client(base_url=url, timeout=60) as client:
            for pair in range(args.pairs):
                rows["idle"].append(change(client, 16 + pair % 2))
                with loaded(url, args.clients):
                    rows["loaded"].append(change(client, 8 + pair % 2))
                print(json.dumps({"pair": pair, "idle": rows["idle"][-1],
                                  "loaded": rows["loaded"][-1]}), flush=True)
            for mode, found in rows.items():
                for key in ("converge_ms", "round_trip_ms"):
                    out[f"{mode}_{key}"] = summary([r[key] for r in found])
            if client.get("/control/config").json()["config"]["max_num_seqs"] != 8:
                change(client, 8)
            with loaded(url, args.clients):
                out["canary_bad"] = canary(client, 1, args.watch)
                out["canary_good"] = canary(client, 64, args.watch)
        return out
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--model", help="default: the tests' tiny random-weight Llama")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--watch", type=float, default=20.0, help="canary window, s")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.watch, args.clients = 2, 6.0, 3
    with contextlib.ExitStack() as stack:
        model = args.model
        if model is None:
            from bench.random_models import tiny_checkpoint

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            model = str(tiny_checkpoint(folder))
        print(json.dumps(run(args, model)), flush=True)  # one line: the last is the result


if __name__ == "__main__":
    main()
