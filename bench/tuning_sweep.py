"""The tuning guide's worked example (playbooks/tuning.md): load-test sweeps on the
bundled model, one knob at a time, each config against the same requests in one run.

1. max_num_seqs 4 / 16 / 64 on the `chat` scenario;
2. the token budget (max_num_batched_tokens, chunk = half of it) 128 / 256 / 512 on
   `mixed`.

Starts `batchpilot serve --model smollm2-135m` (127.0.0.1, a free port), runs `batchpilot
loadtest --compare ...` per sweep, prints each side-by-side summary, then one JSON line.

    python bench/tuning_sweep.py [--requests 30] [--out bench/tuning_out]
"""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path

from loadtest_goals import ROOT, loadtest, start_server

SWEEPS = {
    "max_num_seqs": ("chat.yaml", ["seqs4:max_num_seqs=4", "seqs16:max_num_seqs=16",
                                   "seqs64:max_num_seqs=64"]),
    "token_budget": ("mixed.yaml", [
        "budget128:max_batched_tokens=128,prefill_chunk_size=64",
        "budget256:max_batched_tokens=256,prefill_chunk_size=128",
        "budget512:max_batched_tokens=512,prefill_chunk_size=256"]),
}
KEYS = ("goodput_rps", "request_rps", "output_tps")


def row(summary: dict) -> dict:
    out = {k: summary[k] for k in KEYS}
    for metric in ("ttft", "tpot", "itl", "e2e"):
        out[f"{metric}_p50"] = summary[metric]["p50"]
        out[f"{metric}_p99"] = summary[metric]["p99"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "tuning_out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(out / "server.log")
    result: dict = {"bench": "tuning_sweep", "requests": args.requests}
    try:
        for name, (scenario, configs) in SWEEPS.items():
            summaries = loadtest(url, scenario, configs, 1, out / name, None,
                                 requests=args.requests)
            result[name] = {c.split(":")[0]: row(s) for c, s in
                            zip(configs, summaries, strict=True)}
            print(json.dumps({name: result[name]}, indent=1), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
