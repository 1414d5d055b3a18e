"""What the serving path keeps of the engine's throughput (issue 32's last goal: >= 80%):
the same requests through `LLM` offline and through `make run`'s server at saturation,
side by side in one run.

Workload: bench.offline_throughput's (the first `--requests` Azure conversation requests,
prompts / 8, outputs / 4, prompts as token ids, greedy, lengths forced with ignore_eos).

    offline  LLM(MODEL) with its defaults, every request submitted at once (`generate`);
             one LLM for the whole run, as the server is one engine: both keep the
             prompts' blocks in their prefix cache from the warm-up on, so both sides
             compute the same (a fresh LLM a round gave the server a head start)
    server   `batchpilot serve --model MODEL --trace-db F` (make run's server: its default
             config, step policy, SLO shedding and trace), in its own process; the client
             sends every request at once over HTTP (/v1/completions, token-id prompts,
             stream) and counts the tokens that arrive. The client is bench.stream_client,
             which only keeps bytes while streams run and parses them after the last one
             ends: the server's clients are not on its machine in a deployment, and here
             every core-millisecond a client takes stalls the engine's OpenMP barrier
    server_httpx  the same server through an httpx client that parses each SSE line as
             it arrives (~0.25 s of CPU a round on the 2 cores), for what a Python
             client beside the server costs; reported, not the goal's figure

Both sides are warmed up on the whole workload first (untimed), then rounds alternate
offline server offline server ... Output tok/s per side: tokens / seconds from the first
request to the last token, per round; the ratio server/offline of the per-round medians
is the figure, with its spread. A request the server refused (429: SLO shedding) or
failed is counted and reported; the round's tokens are then fewer than the offline
side's, and the ratio says so rather than hiding it. Last line: one JSON object.

    python -m bench.serving_path [--requests 64] [--rounds 3] [--model smollm2-135m]
                                 [--no-httpx]
    python -m bench.serving_path --smoke     # the tests' tiny model, 8 requests, 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.loadtest_goals import start_server
from bench.offline_throughput import DEFAULT_MODEL, run_ours, workload
from bench.random_models import run_bench
from bench.stream_client import stream_all
from engine import LLM
from engine.models import load_model

# Smoke rounds last tens of milliseconds on the tiny model, so one scheduling stall (CI runs
# two smokes at a time on 2 cores) can swing a round's rate tenfold: three rounds and their
# medians keep the plumbing check from reading noise as a result.
SMOKE = {"requests": 8, "rounds": 3}


def request_body(prompt: list[int], n: int) -> dict:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def serve_lean(url: str, prompts: list[list[int]], outputs: list[int],
                     ) -> tuple[float, int, dict[str, int]]:
    """serve_all's figures through bench.stream_client: the streams are parsed after the
    last one closed, so the client holds no core while the server works."""
    bodies = [request_body(p, n) for p, n in zip(prompts, outputs, strict=True)]
    start, replies = await stream_all(url, "/v1/completions", bodies)
    problems = {"refused": sum(r.status == 429 for r in replies),
                "failed": sum(r.status not in (200, 429) or r.errored() for r in replies)}
    seconds = max(r.closed_at for r in replies) - start  # both time.monotonic
    return seconds, sum(r.completion_tokens() for r in replies), problems


async def serve_all(url: str, prompts: list[list[int]], outputs: list[int],
                    ) -> tuple[float, int, dict[str, int]]:
    """Every request at once, streamed: (seconds first send -> last token, tokens that
    arrived, {"refused": n, "failed": n})."""
    problems = {"refused": 0, "failed": 0}

    async def one(client: httpx.AsyncClient, prompt: list[int], n: int) -> int:
        got = 0
        async with client.stream("POST", f"{url}/v1/completions",
                                 json=request_body(prompt, n)) as resp:
            if resp.status_code != 200:
                problems["refused" if resp.status_code == 429 else "failed"] += 1
                await resp.aread()
                return 0
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if any(c.get("finish_reason") == "error"
                           for c in chunk.get("choices") or ()):
                        problems["failed"] += 1
                    if chunk.get("usage"):  # the last chunk: the tokens it generated
                        got = chunk["usage"]["completion_tokens"]
        return got

    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client, p, n) for p, n in zip(prompts, outputs,
                                                                          strict=True)))
        return time.perf_counter() - start, sum(counts), problems


def measure(model: str, args: argparse.Namespace) -> dict:
    loaded = load_model(model, dtype="auto")
    scale, prompts, outputs = workload(loaded.tokenizer, args.requests)
    print(f"{model}: {len(outputs)} requests, {scale.describe()}, {sum(outputs)} output"
          " tokens a run", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serving-path-") as tmp:
        proc, url = start_server(Path(tmp) / "server.log", model,
                                 "--trace-db", str(Path(tmp) / "trace.duckdb"))
        try:
            llm = LLM(loaded)
            return rounds(args, url, lambda: llm, prompts, outputs)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def rounds(args: argparse.Namespace, url: str, make_llm, prompts: list[list[int]],
           outputs: list[int]) -> dict:
    sides = {"offline": lambda: (*run_ours(make_llm, prompts, outputs), {}),
             "server": lambda: asyncio.run(serve_lean(url, prompts, outputs))}
    if args.httpx:
        sides["server_httpx"] = lambda: asyncio.run(serve_all(url, prompts, outputs))
    for run in sides.values():  # warm-up, untimed: first-use costs of each step shape
        run()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    tokens_of: dict[str, list[int]] = {name: [] for name in sides}
    problems = {"refused": 0, "failed": 0}
    for r in range(args.rounds):
        for name, run in sides.items():
            seconds, tokens, trouble = run()
            for key, n in trouble.items():
                problems[key] += n
            rates[name].append(tokens / seconds)
            tokens_of[name].append(tokens)
            print(f"round {r + 1} {name:>8}: {tokens} tokens in {seconds:.2f} s ="
                  f" {tokens / seconds:.1f} tok/s", flush=True)
    per_round = [s / o for s, o in zip(rates["server"], rates["offline"], strict=True)]
    out = {name: {"median_tok_s": round(statistics.median(v), 2),
                  "range": [round(min(v), 2), round(max(v), 2)]} for name, v in rates.items()}
    ratio = out["server"]["median_tok_s"] / out["offline"]["median_tok_s"]
    print(f"server/offline output tok/s: {ratio:.2f} (per round {min(per_round):.2f}-"
          f"{max(per_round):.2f}); refused {problems['refused']}, failed {problems['failed']}")
    extra = {}
    if "server_httpx" in rates:
        extra["server_httpx_over_offline"] = round(
            out["server_httpx"]["median_tok_s"] / out["offline"]["median_tok_s"], 3)
        print("the same server through httpx, parsing as the chunks arrive:"
              f" {extra['server_httpx_over_offline']:.2f}")
    return {"model": "tiny" if args.smoke else args.model, "requests": len(prompts),
            "rounds": args.rounds, **out, "server_over_offline": round(ratio, 3), **extra,
            "per_round_ratio": [round(x, 3) for x in per_round], "tokens": tokens_of,
            **problems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="alias or checkpoint directory")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    ap.add_argument("--no-httpx", dest="httpx", action="store_false",
                    help="leave out the server_httpx side")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    run_bench("serving_path", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
