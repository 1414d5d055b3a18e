"""Our CPU engine beside Intel's own serving engine on this machine: OpenVINO GenAI's
ContinuousBatchingPipeline (batched) and LLMPipeline (one stream), same requests, alternating.

Workload (bench.offline_throughput's): the first 64 Azure conversation requests, prompts /8,
outputs /4, forced lengths, greedy, the same token ids on both sides; both schedulers get
max_num_seqs 64 and 2048 tokens a step. Sides:

    ours        LLM on load_model(dtype="auto"), a fresh engine per run (no prefix cache
                carried between runs)
    openvino    ContinuousBatchingPipeline (bench/openvino_peer.py: its own venv, the same
                weights exported fp16 by optimum-cli; its defaults otherwise, e.g. its
                compressed KV cache) in a driver process with --threads inference threads

Single stream: one request (the workload's first prompt) decoding --single-tokens tokens;
decode tok/s = (tokens - 1) / (time to all tokens - time to the first), on our LLM with
max_num_seqs 1 and OpenVINO's LLMPipeline.

Rounds alternate ours, openvino, ours single, openvino single (A B A B); figures are
tok/s medians [min-max] over rounds and ratios ours / openvino of the medians, then the
ratio of each round's pair, as median [min-max] ("paired"): this VM's speed drifts by ~5%
between phases of a run, and a round's two sides ran seconds apart. Both sides are warmed
up on the whole workload first (untimed). Last stdout line: one JSON object.

    python -m bench.cpu_peers --setup        # once (minutes): the peer venv and the export
    python -m bench.cpu_peers [--rounds 3] [--threads 2]
    python -m bench.cpu_peers --smoke        # the tests' tiny model; the peer only where set up

Without the peer set up, ours runs alone and the JSON says why the peer is missing ("peer":
{"skipped": reason}): it is not a project dependency, so CI's smoke runs that way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench import openvino_peer
from bench.offline_throughput import run_ours, workload
from bench.random_models import measure_on_model
from engine import LLM, SamplingParams
from engine.models import load_model

DEFAULT_MODEL = "smollm2-135m"
SMOKE = {"requests": 4, "rounds": 1, "single_tokens": 48}
MAX_NUM_SEQS, STEP_TOKENS = 64, 2048


def ours_single(loaded, prompt: list[int], tokens: int) -> dict:
    """One request alone: the time to its first token, then to all `tokens`."""
    llm = LLM(loaded, max_num_seqs=1)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    ttft = time.perf_counter() - start
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    llm = LLM(loaded, max_num_seqs=1)  # fresh: no prefix cache from the run above
    start = time.perf_counter()
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(out.token_ids) == tokens
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "ttft_s": ttft}


def decode_rate(run: dict) -> float | None:
    """Decode tok/s of a single-stream run: the tokens after the first over their time;
    None when the run took no longer than its first token alone did (a tiny model on a
    busy machine: nothing to measure)."""
    decode_s = run["seconds"] - run["ttft_s"]
    return (run["tokens"] - 1) / decode_s if decode_s > 0 else None


def measure(model: str, args) -> dict:
    loaded = load_model(model, dtype="auto")
    _, prompts, outputs = workload(loaded.tokenizer, args.requests)
    make_llm = lambda: LLM(loaded, max_num_seqs=MAX_NUM_SEQS,  # noqa: E731
                           max_num_batched_tokens=STEP_TOKENS)
    print(f"{len(prompts)} requests, {sum(map(len, prompts))} prompt and {sum(outputs)}"
          f" output tokens a run; {torch.get_num_threads()} threads", flush=True)
    peer, skipped = None, openvino_peer.missing_reason()
    if skipped is None:
        peer = openvino_peer.OpenVinoPeer(openvino_peer.exported(model), args.threads or
                                          torch.get_num_threads(), prompts, outputs,
                                          MAX_NUM_SEQS, STEP_TOKENS)
        print(f"openvino_genai {peer.version} ready", flush=True)
    else:
        print(f"openvino left out: {skipped}", flush=True)
    run_ours(make_llm, prompts, outputs)  # warm-up, untimed
    ours_single(loaded, prompts[0], args.single_tokens)
    runs: dict[str, list[float]] = {"ours": [], "openvino": [], "ours_single": [],
                                    "openvino_single": []}
    paired: dict[str, list[float]] = {}  # "ours/openvino": each round's ratio
    try:
        for r in range(args.rounds):
            secs, toks = run_ours(make_llm, prompts, outputs)
            runs["ours"].append(toks / secs)
            if peer is not None:
                got = peer.batched()
                runs["openvino"].append(got["tokens"] / got["seconds"])
            rates = {"ours_single": decode_rate(ours_single(loaded, prompts[0],
                                                            args.single_tokens))}
            if peer is not None:
                rates["openvino_single"] = decode_rate(peer.single(prompts[0],
                                                                   args.single_tokens))
            for name, rate in rates.items():
                if rate is not None:
                    runs[name].append(rate)
            if peer is not None:
                add_pairs(paired, {"ours": runs["ours"][-1],
                                   "openvino": runs["openvino"][-1], **rates})
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s"
                                                 for k, v in runs.items() if v), flush=True)
    finally:
        if peer is not None:
            peer.close()
    return summarise(runs, skipped, paired)


PAIRS = (("ours", "openvino"), ("ours_single", "openvino_single"))


def add_pairs(paired: dict[str, list[float]], round_rates: dict[str, float | None]) -> None:
    """Append this round's ours / peer ratio of each pair whose two rates it has."""
    for ours, theirs in PAIRS:
        a, b = round_rates.get(ours), round_rates.get(theirs)
        if a is not None and b:
            paired.setdefault(f"{ours}/{theirs}", []).append(a / b)


def summarise(runs: dict[str, list[float]], skipped: str | None,
              paired: dict[str, list[float]] | None = None) -> dict:
    sides = {name: {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                    "max": round(max(v), 1), "n": len(v)} for name, v in runs.items() if v}
    ratios = {}
    for ours, theirs in PAIRS:
        if ours in sides and theirs in sides:
            ratios[f"{ours}/{theirs}"] = round(sides[ours]["median"]
                                               / sides[theirs]["median"], 2)
    by_round = {name: {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
                       "max": round(max(v), 3), "n": len(v)}
                for name, v in (paired or {}).items() if v}
    for name, side in sides.items():
        print(f"  {name:>16} {side['median']:8.1f} tok/s [{side['min']:.1f}-{side['max']:.1f}]")
    print("  ratios: " + (", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) or
                          "none (the peer did not run)"))
    if by_round:
        print("  paired, by round: " + ", ".join(
            f"{k} {v['median']:.2f}x [{v['min']:.2f}-{v['max']:.2f}]"
            for k, v in by_round.items()))
    return {"sides": sides, "ratios": ratios, "paired": by_round,
            "peer": {"skipped": skipped} if skipped else {"name": "openvino_genai"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true",
                    help="create the peer venv and export the model, then exit")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="alias or checkpoint directory")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--single-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="inference threads, both sides")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = ap.parse_args()
    if args.setup:
        openvino_peer.setup_venv()
        print(f"exported: {openvino_peer.exported(args.model)}")
        return
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result = measure_on_model(args, SMOKE, measure)
    print(json.dumps({"bench": "cpu_peers", "smoke": args.smoke, "requests": args.requests,
                      "rounds": args.rounds, "threads": args.threads, **result,
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
