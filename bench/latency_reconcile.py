"""Does the server report the latency its clients see? (issue 22) Client vs server, live.

Two workloads against `batchpilot serve` on its default config (the bundled SmolLM2):

1. blocked: a long prompt (1,500 tokens, max_tokens 1), and 0.3 s later a 2-token prompt
   streamed. The client's TTFT of the short request is compared with the server's
   `ttft_s`; its client-side queue delay (until the long prompt's answer arrives: the
   engine thread could not take the short request before) with the server's
   `queue_delay_s`. `--rounds` times, each with its own long text (no prefix-cache hits).
2. replay: `--requests` rows of the bundled Azure conversation trace at their own
   inter-arrival times (x `--time-scale`), prompts as long as the trace's (the first 80
   rows: median 388 tokens, up to 4,085, 57k in all), short answers (8 tokens), all
   streamed: client vs server TTFT and E2E. (The issue's code-completion trace is not
   bundled; these are the longest-prompt real rows we have.)

Each server writes a trace; after it stops, the requests' queue delays and wait reasons
are read back, so the output also says where the wait went.

    python -m bench.latency_reconcile [--against 3a962c5] [--rounds 5] [--requests 80]
    python -m bench.latency_reconcile --smoke   # the tests' tiny model, this tree only

--against REF: the same workloads on REF too (a temporary `git worktree`), this tree
first. The figures of a run on a shared or noisy machine are marked by the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx

from bench.loadtest_goals import ROOT, start_server
from control.loadtest.metrics import e2e_gap_s, ttft_gap_s
from control.loadtest.runner import run
from control.loadtest.scenario import plan, scenario_from_dict

LONG_TOKENS, SHORT_AFTER_S = 1500, 0.3
TARGET_STEP_S = 0.25  # engine/calibration/budget_fit.py's default target_step_ms
SMOKE = {"rounds": 2, "requests": 6, "long_tokens": 300, "time_scale": 0.2,
         "prompt_scale": 0.05}
REPLAY = {"name": "long-prompt-replay", "seed": 22, "concurrency": 64,
          "arrival": {"process": "trace"}, "prompt": {"dist": "trace"},
          "output": {"dist": "fixed", "value": 8}, "tenants": {"replay": 1},
          "stream_ratio": 1.0, "ignore_eos": True}


async def _stream_first_token(client: httpx.AsyncClient, prompt: str) -> tuple[float, dict]:
    """(client TTFT, the last chunk's `batchpilot` object) of one streamed 2-token request."""
    sent, first, info = time.perf_counter(), None, {}
    async with client.stream("POST", "/v1/completions", json={
            "prompt": prompt, "max_tokens": 2, "ignore_eos": True, "stream": True}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            info = chunk.get("batchpilot") or info
    return (first or time.perf_counter()) - sent, info


async def blocked_round(url: str, long_text: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        sent_long = time.perf_counter()
        answered: list[float] = []

        async def long() -> None:
            reply = await client.post("/v1/completions", json={
                "prompt": long_text, "max_tokens": 1, "ignore_eos": True})
            reply.raise_for_status()
            answered.append(time.perf_counter())

        long_task = asyncio.ensure_future(long())
        await asyncio.sleep(SHORT_AFTER_S)
        sent_short = time.perf_counter()
        ttft, info = await _stream_first_token(client, "Hi")
        await long_task
    timing = info.get("timing") or {}
    # The engine thread takes the short request no earlier than the end of the step it
    # is running when the request arrives; without chunking that is the whole prefill.
    blocked_until = max(0.0, answered[0] - sent_short) if answered else None
    return {"client_ttft_s": ttft, "server_ttft_s": timing.get("ttft_s"),
            "server_queue_delay_s": timing.get("queue_delay_s"),
            "client_blocked_s": blocked_until, "long_e2e_s": answered[0] - sent_long,
            "request_id": info.get("request_id")}


def replay(url: str, maker, args: argparse.Namespace, key: str) -> list:
    scenario = scenario_from_dict({**REPLAY, "requests": args.requests, "trace": {
        "path": "azure_llm_2023_conv.csv", "time_scale": args.time_scale,
        "prompt_scale": args.prompt_scale, "limit": args.requests}})
    planned = plan(scenario)
    prompts = {p.index: maker.make(p.prompt_tokens, seed=f"{key}:{p.index}")[0]
               for p in planned}
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    results, _duration = asyncio.run(run(url, planned, prompts, model=model, concurrency=64))
    failed = [r for r in results if r.outcome != "ok"]
    if failed:
        print(f"  {len(failed)} replay request(s) did not end ok; first: {failed[0].outcome}"
              f" {failed[0].error}", file=sys.stderr)
    return results


def _dist(values: list[float]) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"n": 0}
    p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    return {"n": len(values), "p50": round(statistics.median(values), 4),
            "p99": round(p99, 4), "max": round(values[-1], 4)}


def _waits(db: Path) -> dict:
    """Queue delay and its reasons, summed over the trace's finished requests; the steps'
    durations against the default target step time (the fitted budgets aim under it)."""
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT queue_delay_s, wait_reasons FROM requests").fetchall()
    totals: dict[str, float] = {}
    for _delay, reasons in rows:
        for name, seconds in (reasons or {}).items():
            totals[name] = totals.get(name, 0.0) + seconds
    queued = sum(d or 0.0 for d, _ in rows)
    steps = con.execute("SELECT duration_s FROM steps").fetchall()
    # measured / predicted of the steps the start-up law predicted (none before it existed)
    ratios = _law_ratios(con)
    con.close()
    return {"requests": len(rows), "queue_delay_total_s": round(queued, 3),
            "by_reason_s": {k: round(v, 3) for k, v in sorted(totals.items())},
            "step_s": _dist([d for (d,) in steps]), "steps": len(steps),
            "steps_over_target": sum(1 for (d,) in steps if d > TARGET_STEP_S),
            "measured_over_predicted": _dist(ratios)}


def _law_ratios(con) -> list[float]:
    """Each step's measured engine-clock span over the step law's prediction, where the
    trace has one (steps.predicted_step_s: schema 2 and fitted budgets)."""
    columns = {c for (c,) in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'steps'"
    ).fetchall()}
    if "predicted_step_s" not in columns:
        return []
    rows = con.execute("SELECT end_time - start_time, predicted_step_s FROM steps"
                       " WHERE predicted_step_s > 0").fetchall()
    return [measured / predicted for measured, predicted in rows]


@contextlib.contextmanager
def _server(root: Path, model: str, out: Path) -> Iterator[str]:
    proc, url = start_server(out / "server.log", model, "--trace-db", str(out / "trace.duckdb"),
                             root=root)
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def measure(root: Path, args: argparse.Namespace, maker, out: Path, label: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with _server(root, args.model, out) as url:
        rounds = []
        for i in range(args.rounds):
            text = maker.make(args.long_tokens, seed=f"{label}:long:{i}")[0]
            rounds.append(asyncio.run(blocked_round(url, text)))
            print(f"  {label} blocked round {i + 1}/{args.rounds}: {rounds[-1]}",
                  file=sys.stderr, flush=True)
        results = replay(url, maker, args, label)
    ok = [r for r in results if r.outcome == "ok"]
    return {
        "blocked": {
            "client_ttft_s": _dist([r["client_ttft_s"] for r in rounds]),
            "server_ttft_s": _dist([r["server_ttft_s"] for r in rounds]),
            "ttft_gap_s": _dist([r["client_ttft_s"] - r["server_ttft_s"] for r in rounds]),
            "client_blocked_s": _dist([r["client_blocked_s"] for r in rounds]),
            "server_queue_delay_s": _dist([r["server_queue_delay_s"] for r in rounds]),
            "rounds": rounds},
        "replay": {
            "ok": len(ok), "sent": len(results),
            "client_ttft_s": _dist([r.ttft_s for r in ok]),
            "server_ttft_s": _dist([r.server_ttft_s for r in ok]),
            "ttft_gap_s": _dist([ttft_gap_s(r) for r in ok]),
            "e2e_gap_s": _dist([e2e_gap_s(r) for r in ok])},
        "trace_waits": _waits(out / "trace.duckdb")}


def _print_side_by_side(results: dict[str, dict]) -> None:
    labels = list(results)
    print(f"{'metric':<34}" + "".join(f"{name:>28}" for name in labels))
    for part in ("blocked", "replay"):
        for key in ("client_ttft_s", "server_ttft_s", "ttft_gap_s", "client_blocked_s",
                    "server_queue_delay_s", "e2e_gap_s"):
            cells = [results[name][part].get(key) for name in labels]
            if all(c is None for c in cells):
                continue
            text = [f"{c['p50']:.3f} / {c['p99']:.3f}" if c and c.get("n") else "-"
                    for c in cells]
            print(f"{part + ' ' + key + ' p50/p99':<34}" + "".join(f"{t:>28}" for t in text))
    for name in labels:
        print(f"trace waits ({name}): {results[name]['trace_waits']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--against", metavar="REF", help="also run on this commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--long-tokens", type=int, default=LONG_TOKENS)
    parser.add_argument("--time-scale", type=float, default=2.0,
                        help="x the trace's inter-arrival times")
    parser.add_argument("--prompt-scale", type=float, default=1.0,
                        help="x the trace's prompt lengths")
    parser.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = parser.parse_args()
    from control.loadtest.prompts import PromptMaker, load_tokenizer

    with tempfile.TemporaryDirectory(prefix="latency_reconcile_") as tmp:
        if args.smoke:
            from bench.random_models import tiny_checkpoint

            vars(args).update(SMOKE, against=None)
            args.model = str(tiny_checkpoint(Path(tmp) / "model"))
        maker = PromptMaker(load_tokenizer(args.model))
        results = {"this tree": measure(ROOT, args, maker, Path(tmp) / "this", "this")}
        if args.against:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                            str(tree), args.against], check=True)
            try:
                results[args.against] = measure(tree, args, maker, Path(tmp) / "ref", "ref")
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False)
    _print_side_by_side(results)
    print(json.dumps({"bench": "latency_reconcile", "smoke": args.smoke, **results}))


if __name__ == "__main__":
    main()
