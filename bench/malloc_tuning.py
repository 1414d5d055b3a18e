"""glibc's malloc thresholds (engine/execution/native_heap.py) on and off, as a server runs: one LLM
serving offline_throughput's workload again and again (prefix caching off, so every round
computes the same), each side in processes of its own, sides alternating A B A B.

The setting is process-wide and permanent, so the sides cannot share a process: each round
starts a process per side (BATCHPILOT_MALLOC_TUNING=1 / 0), which loads the model, serves
one untimed warm-up round and --runs timed ones. Per side: output tok/s (median and range
over all timed runs) and the minor page faults of a run (getrusage); the ratio on / off of
the medians. The last stdout line is one JSON object.

    python -m bench.malloc_tuning [--rounds 3] [--runs 3] [--requests 64] [--threads 2]
    python -m bench.malloc_tuning --smoke     # the tests' tiny model, seconds
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from bench.random_models import model_bench_parser, run_bench

ROOT = Path(__file__).resolve().parents[1]
SMOKE = {"rounds": 1, "runs": 2, "requests": 8}
SIDES = {"on": "1", "off": "0"}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def serve_rounds(model: str, requests: int, runs: int, threads: int) -> list[dict]:
    """In this process: `runs` timed generate rounds on one LLM -> [{tok_s, faults}]."""
    import torch

    from bench.offline_throughput import run_ours, workload
    from engine.llm import LLM
    from engine.models import load_model

    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model, dtype="auto")
    _, prompts, outputs = workload(loaded.tokenizer, requests)
    llm = LLM(loaded, max_num_seqs=64, max_num_batched_tokens=2048,
              enable_prefix_caching=False)
    run_ours(lambda: llm, prompts, outputs)  # warm-up, untimed
    rounds = []
    for _ in range(runs):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds, tokens = run_ours(lambda: llm, prompts, outputs)
        rounds.append({"tok_s": tokens / seconds,
                       "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults})
    return rounds


def side_process(model: str, args, tuning: str) -> list[dict]:
    """serve_rounds in a fresh interpreter with BATCHPILOT_MALLOC_TUNING=tuning."""
    code = ("import json, sys; from bench.malloc_tuning import serve_rounds; "
            f"print(json.dumps(serve_rounds({model!r}, {args.requests}, {args.runs}, "
            f"{args.threads})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, "BATCHPILOT_MALLOC_TUNING": tuning})
    if done.returncode != 0:
        raise SystemExit(f"side BATCHPILOT_MALLOC_TUNING={tuning} failed:\n"
                         f"{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model: str, args) -> dict:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side, tuning in SIDES.items():
            got = side_process(model, args, tuning)
            runs[side] += got
            log(f"round {r + 1} {side:>3}: " + "  ".join(
                f"{g['tok_s']:.1f} tok/s ({g['faults']} faults)" for g in got))
    sides = {}
    for side, got in runs.items():
        rates = [g["tok_s"] for g in got]
        sides[side] = {"tok_s_median": round(statistics.median(rates), 1),
                       "tok_s_range": [round(min(rates), 1), round(max(rates), 1)],
                       "faults_median": statistics.median(g["faults"] for g in got),
                       "runs": len(got)}
        log(f"{side:>4}: {sides[side]['tok_s_median']} tok/s {sides[side]['tok_s_range']},"
            f" {sides[side]['faults_median']:.0f} minor faults a run")
    ratio = sides["on"]["tok_s_median"] / sides["off"]["tok_s_median"]
    log(f"ratio on / off: {ratio:.2f}x")
    return {"model": model, "requests": args.requests, "sides": sides,
            "ratio_on_off": round(ratio, 3)}


def main() -> None:
    ap = model_bench_parser(__doc__, SMOKE, threads=2)
    ap.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    ap.add_argument("--runs", type=int, default=3, help="timed generate rounds per process")
    ap.add_argument("--requests", type=int, default=64)
    run_bench("malloc_tuning", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
