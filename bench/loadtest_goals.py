"""The load tester's two goals on CPU with the default model (SmolLM2-135M), one run:

1. mixed scenario at the highest rate tried: continuous batching goodput >= 2x static;
2. chat with long prompts mixed in: p99 ITL with chunked prefill <= 1/2 of without.

Starts `batchpilot serve --model smollm2-135m` on 127.0.0.1 (a free port), runs
`batchpilot loadtest --compare ...` for each goal (configs alternate, `--rounds`), stops
the server. Prints both side-by-side tables, then one JSON line with the ratios.

    python -m bench.loadtest_goals [--rates 0.5,1] [--rounds 1] [--out bench/loadtest_out]
    python -m bench.loadtest_goals --smoke   # the tests' tiny model, 4 requests per config at
                                             # 20 req/s, output in a temporary folder
"""

from __future__ import annotations

import argparse
import contextlib
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
SMOKE = {"rates": "20", "rounds": 1, "requests": 4, "itl_rate": 20.0}


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


def loadtest(url: str, scenario: str, compare: list[str], rounds: int, out: Path,
             rate: float | None, requests: int | None = None,
             tokenizer: str | None = None) -> list[dict]:
    """`batchpilot loadtest --compare ...`: one summary per config. rate (req/s) and
    requests override the scenario's; tokenizer: for a server whose model is not an alias."""
    cmd = [sys.executable, "-m", "control.cli.main", "loadtest", "--scenario",
           str(SCENARIOS / scenario), "--url", url, "--rounds", str(rounds), "--json",
           "--out", str(out), "--db", str(out / "loadtest.duckdb")]
    for spec in compare:
        cmd += ["--compare", spec]
    if rate is not None:
        cmd += ["--rate", str(rate)]
    if requests is not None:
        cmd += ["--requests", str(requests)]
    if tokenizer is not None:
        cmd += ["--tokenizer", tokenizer]
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loadtest failed ({done.returncode})")
    return json.loads(done.stdout)


def itl_goal(url: str, args, out: Path) -> dict:
    s = loadtest(url, "chat-long-prompts.yaml", CHUNKING, args.rounds, out / "chunking",
                 args.itl_rate, args.requests, args.tokenizer)
    chunked, unchunked = s[0]["itl"]["p99"], s[1]["itl"]["p99"]
    print(f"chat with long prompts: p99 ITL chunked {chunked:.3f} s, unchunked"
          f" {unchunked:.3f} s", flush=True)
    return {"chunked_p99_s": chunked, "unchunked_p99_s": unchunked,
            "ratio": chunked / unchunked if unchunked else None}


def goodput_goal(url: str, args, out: Path) -> dict:
    """Per rate of the mixed scenario: continuous and static goodput (req/s) and their ratio."""
    goodput = {}
    for rate in [float(r) for r in args.rates.split(",")]:
        s = loadtest(url, "mixed.yaml", BATCHING, args.rounds, out / f"mixed-{rate:g}", rate,
                     args.requests, args.tokenizer)
        cont, stat = s[0]["goodput_rps"], s[1]["goodput_rps"]
        ratio = cont / stat if stat else None
        goodput[f"{rate:g}"] = {"continuous": cont, "static": stat, "ratio": ratio}
        print(f"mixed @ {rate:g} req/s: goodput continuous {cont:.3f}, static"
              f" {stat:.3f} req/s, ratio {ratio}", flush=True)
    return goodput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="0.5,1", help="mixed scenario rates (req/s)")
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
        top = result["goodput"][max(result["goodput"], key=float)]
        result["goal_goodput_2x"] = bool(top["ratio"] and top["ratio"] >= 2.0)
    if result["itl"]:
        result["goal_itl_half"] = bool(result["itl"]["ratio"] is not None
                                       and result["itl"]["ratio"] <= 0.5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
