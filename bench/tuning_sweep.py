"""The tuning guide's worked example (playbooks/tuning.md): load-test sweeps on the
bundled model, one knob at a time, each config against the same requests in one run.

1. max_num_seqs 4 / 16 / 64 on the `chat` scenario;
2. the token budget (max_num_batched_tokens, chunk = half of it) 128 / 256 / 512 on
   `mixed`.

Starts `batchpilot serve --model smollm2-135m` (127.0.0.1, a free port), runs `batchpilot
loadtest --compare ...` per sweep, prints each side-by-side summary, then one JSON line.

    python -m bench.tuning_sweep [--requests 30] [--out bench/tuning_out]
    python -m bench.tuning_sweep --smoke   # the tests' tiny model, 2 requests per config at
                                           # 20 req/s, output in a temporary folder
"""

from __future__ import annotations

import argparse
import json

from bench.loadtest_goals import ROOT, loadtest, served

SWEEPS = {
    "max_num_seqs": ("chat.yaml", ["seqs4:max_num_seqs=4", "seqs16:max_num_seqs=16",
                                   "seqs64:max_num_seqs=64"]),
    "token_budget": ("mixed.yaml", [
        "budget128:max_batched_tokens=128,prefill_chunk_size=64",
        "budget256:max_batched_tokens=256,prefill_chunk_size=128",
        "budget512:max_batched_tokens=512,prefill_chunk_size=256"]),
}
KEYS = ("goodput_rps", "request_rps", "output_tps")
SMOKE = {"requests": 2, "rate": 20.0}


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
    parser.add_argument("--model", default="smollm2-135m", help="alias or checkpoint directory")
    parser.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    parser.set_defaults(rate=None, tokenizer=None)  # the scenarios' rates; the model's own
    args = parser.parse_args()
    with served(args, SMOKE, "bench-tuning-") as (url, out):  # --smoke sets args.requests
        result: dict = {"bench": "tuning_sweep", "smoke": args.smoke,
                        "requests": args.requests}
        for name, (scenario, configs) in SWEEPS.items():
            summaries = loadtest(url, scenario, configs, 1, out / name, args.rate,
                                 args.requests, args.tokenizer)
            result[name] = {c.split(":")[0]: row(s) for c, s in
                            zip(configs, summaries, strict=True)}
            print(json.dumps({name: result[name]}, indent=1), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
