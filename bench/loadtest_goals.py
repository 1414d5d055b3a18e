"""The load tester's two goals on CPU with the default model (SmolLM2-135M), one run:

1. mixed scenario at the highest load tried: continuous batching goodput >= 2x static;
2. chat with long prompts mixed in: p99 ITL with chunked prefill <= 1/2 of without.

Loads are relative to measured capacity, so the goals keep their meaning as the engine
gets faster: first each scenario runs once with every request sent at once under its
first config (continuous batching; chunked prefill), and its completed requests per
second are that config's capacity; then each goal runs at `--loads` (mixed) or
`--itl-load` (chat) times it. `--rates` gives fixed req/s instead (the old behaviour).

Starts `batchpilot serve --model smollm2-135m` on 127.0.0.1 (a free port), runs
`batchpilot loadtest --compare ...` for each goal (configs alternate, `--rounds`), stops
the server. Prints both side-by-side tables, then one JSON line with the ratios.

    python -m bench.loadtest_goals [--loads 0.6,1.2] [--itl-load 0.8] [--rounds 1]
                                   [--rates 0.5,1] [--out bench/loadtest_out]
    python -m bench.loadtest_goals --smoke   # the tests' tiny model, 4 requests per config at
                                             # 1x capacity, output in a temporary folder
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "playbooks" / "scenarios"
# chunked prefill needs no large budget; without chunking a prompt runs whole in one step,
# so the budget must cover max_model_len (the server refuses less)
CHUNKING = ["chunked:chunked_prefill=true,prefill_chunk_size=32,max_batched_tokens=64",
            "unchunked:chunked_prefill=false,max_batched_tokens=8192"]
# the same budgets for both: only the batching mode differs
BATCHING = ["continuous:batching=continuous,prefill_chunk_size=128,max_batched_tokens=256",
            "static:batching=static,prefill_chunk_size=128,max_batched_tokens=256"]
SMOKE = {"loads": "1", "itl_load": 1.0, "rounds": 1, "requests": 4}
BURST_RATE = 1000.0  # req/s: every request sent at once, for the capacity run


def start_server(log_path: Path, model: str = "smollm2-135m", *extra: str,
                 root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    """`batchpilot serve --model MODEL [EXTRA...]` on 127.0.0.1, a free port: (process,
    its URL). `root`: the source tree the server runs from (another commit's worktree)."""
    cmd = [sys.executable, "-m", "control.cli.main", "serve", "--model", model,
           "--host", "127.0.0.1", "--port", "0", "--log-level", "warning", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("batchpilot: ready"):
                return proc, line.rsplit(" at ", 1)[1].strip()
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not get ready:\n{log_path.read_text()}")


@contextlib.contextmanager
def served(args: argparse.Namespace, smoke: dict, prefix: str) -> Iterator[tuple[str, Path]]:
    """A server for the load tests and their output folder, as (url, out): args.model, or
    with args.smoke the tests' tiny model, the `smoke` settings and a temporary folder.
    The server drains and stops when the block ends."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        if args.smoke:
            from bench.random_models import tiny_checkpoint

            vars(args).update(smoke, out=tmp)
            args.model = args.tokenizer = str(tiny_checkpoint(Path(tmp) / "model"))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        proc, url = start_server(out / "server.log", args.model)
        try:
            yield url, out
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def batchpilot(argv: list[str]) -> str:
    """`batchpilot ARGV` in this process (a subprocess would pay its imports and tokenizer
    load, seconds, per run) -> what it printed; RuntimeError if it failed."""
    from control.cli.main import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"batchpilot {' '.join(argv)} failed ({code})")
    return printed.getvalue()


def loadtest(url: str, scenario: str | Path, compare: list[str], rounds: int, out: Path,
             rate: float | None, requests: int | None = None,
             tokenizer: str | None = None) -> list[dict]:
    """`batchpilot loadtest [--compare ...]`: one summary per config. `scenario`: a name in
    playbooks/scenarios or a path; rate (req/s) and requests override the scenario's;
    tokenizer: for a server whose model is not an alias."""
    cmd = ["loadtest", "--scenario", str(SCENARIOS / scenario), "--url", url, "--rounds",
           str(rounds), "--json", "--out", str(out), "--db", str(out / "loadtest.duckdb")]
    for spec in compare:
        cmd += ["--compare", spec]
    if rate is not None:
        cmd += ["--rate", str(rate)]
    if requests is not None:
        cmd += ["--requests", str(requests)]
    if tokenizer is not None:
        cmd += ["--tokenizer", tokenizer]
    return json.loads(batchpilot(cmd))


def capacity_rps(url: str, scenario: str, config: str, out: Path, args) -> float:
    """Completed requests per second of `scenario` under `config` with every request
    sent at once (the scenario's own concurrency limit still holds)."""
    name, _, changes = config.partition(":")
    batchpilot(["ctl", "set", "--url", url, "--reason",
                f"bench.loadtest_goals: capacity under {name}", *changes.split(",")])
    s = loadtest(url, scenario, [], 1, out, BURST_RATE, args.requests, args.tokenizer)
    rps = s[0]["request_rps"]
    print(f"{scenario} capacity under {config.split(':')[0]}: {rps:.3f} req/s"
          f" ({s[0]['ok']}/{s[0]['requests']} ok in {s[0]['duration_s']:.0f} s)", flush=True)
    return rps


def itl_goal(url: str, args, out: Path) -> dict:
    scenario, rate, capacity = "chat-long-prompts.yaml", args.itl_rate, None
    if rate is None and args.itl_load is not None:
        capacity = capacity_rps(url, scenario, CHUNKING[0], out / "chunking-capacity", args)
        rate = args.itl_load * capacity
    s = loadtest(url, scenario, CHUNKING, args.rounds, out / "chunking", rate, args.requests,
                 args.tokenizer)
    chunked, unchunked = s[0]["itl"]["p99"], s[1]["itl"]["p99"]
    print(f"chat with long prompts{_at(rate, capacity)}: p99 ITL chunked {chunked:.3f} s,"
          f" unchunked {unchunked:.3f} s", flush=True)
    return {"rate_rps": rate, "capacity_rps": capacity, "load": args.itl_load if capacity
            else None, "chunked_p99_s": chunked, "unchunked_p99_s": unchunked,
            "ratio": chunked / unchunked if unchunked else None}


def goodput_goal(url: str, args, out: Path) -> dict:
    """Per load (x capacity) or rate of the mixed scenario: continuous and static goodput
    (req/s) and their ratio, keyed by the load (or the rate, with --rates)."""
    goodput, capacity = {}, None
    if args.rates is not None:
        points = [(r, float(r)) for r in args.rates.split(",")]
    else:
        capacity = capacity_rps(url, "mixed.yaml", BATCHING[0], out / "mixed-capacity", args)
        points = [(f"{float(x):g}x", float(x) * capacity) for x in args.loads.split(",")]
    for key, rate in points:
        s = loadtest(url, "mixed.yaml", BATCHING, args.rounds, out / f"mixed-{key}", rate,
                     args.requests, args.tokenizer)
        cont, stat = s[0]["goodput_rps"], s[1]["goodput_rps"]
        ratio = cont / stat if stat else None
        goodput[key] = {"rate_rps": rate, "capacity_rps": capacity, "continuous": cont,
                        "static": stat, "ratio": ratio}
        print(f"mixed{_at(rate, capacity)}: goodput continuous {cont:.3f}, static"
              f" {stat:.3f} req/s, ratio {ratio}", flush=True)
    return goodput


def _at(rate: float | None, capacity: float | None) -> str:
    if rate is None:
        return ""
    load = f" = {rate / capacity:.2g}x capacity" if capacity else ""
    return f" @ {rate:.3g} req/s{load}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", default="0.6,1.2",
                        help="mixed scenario loads, x the capacity of continuous batching")
    parser.add_argument("--itl-load", type=float, default=0.8,
                        help="chat-long-prompts load, x the capacity with chunked prefill")
    parser.add_argument("--rates", help="fixed mixed scenario rates (req/s) instead of loads")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "loadtest_out"))
    parser.add_argument("--only", choices=["goodput", "itl"], help="measure one goal only")
    parser.add_argument("--model", default="smollm2-135m", help="alias or checkpoint directory")
    parser.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    parser.set_defaults(requests=None, itl_rate=None, tokenizer=None)  # the scenarios' own
    args = parser.parse_args()
    result: dict = {"bench": "loadtest_goals", "smoke": args.smoke, "goodput": {}, "itl": {}}
    with served(args, SMOKE, "bench-loadtest-") as (url, out):
        if args.only != "itl":
            result["goodput"] = goodput_goal(url, args, out)
        if args.only != "goodput":
            result["itl"] = itl_goal(url, args, out)
    if result["goodput"]:
        top = max(result["goodput"].values(), key=lambda g: g["rate_rps"])
        result["goal_goodput_2x"] = bool(top["ratio"] and top["ratio"] >= 2.0)
    if result["itl"]:
        result["goal_itl_half"] = bool(result["itl"]["ratio"] is not None
                                       and result["itl"]["ratio"] <= 0.5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
