"""Offline throughput on CPU: our engine (dtype auto and float32) vs transformers `generate`
in static batches and transformers' own continuous batching, side by side in one process.

Workload: the first 64 requests of the Azure LLM 2023 conversation trace, prompt lengths
/ 8 and output lengths / 4 (at least 4 each); prompts are real text cut to the wanted
token count; outputs forced to the trace's length (ignore_eos, greedy). Only the tokens
each request asked for count. Sides (bench/hf_baselines.py has the non-engine ones):

    auto       LLM on load_model(dtype="auto"): on a CPU with AMX or AVX-512-BF16, fp32
               weights plus bf16 copies, which every step uses where the native decode
               layers build, else steps of >= 4 tokens (engine/models/cpu_dtype.py)
    auto_kvf32 `auto` with a float32 KV cache (kv_cache_dtype float32; auto's cache is bf16
               where the native decode layers build): what the bf16 cache is worth
    sampled    `auto` with the sampling users turn on: temperature 0.8, top_p 0.9, top_k 50,
               presence 0.5, frequency 0.3 and repetition 1.1 penalties, a seed per request
               (the same output lengths: ignore_eos); its ratio to `auto` (greedy) is the
               cost of sampling (issue 19's goal: within 10%)
    fp32       LLM on load_model(dtype="float32")
    hf_static  transformers `generate`, static batches of 16, left-padded; a batch runs until
               its longest request ends (the fp32 transformers model of the auto load)
    hf_cb      transformers' ContinuousBatchingManager on the same model: paged cache, each
               request's own max_new_tokens, max_num_seqs requests and 2048 tokens per step
    ref        (--against REF) commit REF's engine, in its default dtype, in a subprocess run
               from a temporary git worktree (loaded once, warmed up, then timed per round)

Each engine side is warmed up on the whole workload and the transformers sides on its
first 4 requests (untimed), then rounds alternate auto auto_kvf32 sampled fp32 hf_static
hf_cb [ref], auto auto_kvf32 ...; every run of an engine side starts on a fresh engine (no prefix
cache carried from the run before: prompts share prefixes within a run only). tokens/s
per side: all tokens over all seconds, and the per-round median [min-max]. Last line:
one JSON object.

    python -m bench.offline_throughput [--requests 64] [--rounds 2] [--model smollm2-135m]
        [--against REF] [--threads N] [--sides auto,sampled]
    python -m bench.offline_throughput --smoke   # the tests' tiny model, 4 requests, 1 round
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from bench import hf_baselines
from bench.random_models import measure_on_model
from engine import LLM, SamplingParams
from engine.models import load_model
from engine.sim.workload import TraceScale, load_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "smollm2-135m"
SMOKE = {"requests": 4, "batch_size": 2, "rounds": 1, "max_num_seqs": 4}
WARMUP_REQUESTS = 4
# Sides warmed up on the whole workload: an engine's first pass meets oneDNN's first-use
# cost for each new GEMM shape (~2.7 s for SmolLM2's 2048-token prefill step), which would
# otherwise land in round 1 only. transformers' sides take minutes a pass: 4 requests.
FULL_WARMUP = {"auto", "auto_kvf32", "fp32"}
# ratio name -> (numerator side, denominator side)
RATIOS = {"auto/hf_static": ("auto", "hf_static"), "auto/hf_cb": ("auto", "hf_cb"),
          "auto/fp32": ("auto", "fp32"), "auto/auto_kvf32": ("auto", "auto_kvf32"),
          "auto/ref": ("auto", "ref"),
          "sampled/auto": ("sampled", "auto")}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "presence_penalty": 0.5,
           "frequency_penalty": 0.3, "repetition_penalty": 1.1}

TEXT = (
    "The history of computing is a story of people trying to make machines do arithmetic"
    " faster and more reliably than humans could. Early mechanical calculators gave way to"
    " electromechanical relays, then vacuum tubes, transistors and integrated circuits."
    " Each step made computers smaller, cheaper and more capable, until they found their"
    " way into offices, homes and pockets. Along the way programmers invented languages,"
    " operating systems, networks and databases, and learned how to build software that"
    " millions of people use every day. "
)


def make_prompts(tokenizer, lengths: list[int]) -> list[list[int]]:
    ids = tokenizer.encode(TEXT * 40, add_special_tokens=False)
    return [ids[(7 * i) % 50:(7 * i) % 50 + n] for i, n in enumerate(lengths)]


def workload(tokenizer, requests: int) -> tuple[TraceScale, list[list[int]], list[int]]:
    """The first `requests` conversation requests, scaled: (the scale, prompt token ids,
    forced output lengths)."""
    scale = TraceScale(prompt_div=8, output_div=4, min_tokens=4)
    trace = load_trace(limit=requests, scale=scale)
    return (scale, make_prompts(tokenizer, [t.prompt_tokens for t in trace]),
            [t.output_tokens for t in trace])


def run_ours(make_llm, prompts: list[list[int]], outputs: list[int],
             sampled: bool = False) -> tuple[float, int]:
    """Greedy, or (`sampled`) with SAMPLED's settings and a seed per request, on the engine
    `make_llm()` returns (built untimed). This bench's sides build a fresh one a run, so a
    run shares prefixes among its own prompts only, never with the run before (whose
    blocks would stay in the prefix cache); serving_path and malloc_tuning pass one for all."""
    if sampled:
        params = [SamplingParams(max_tokens=n, ignore_eos=True, seed=i, **SAMPLED)
                  for i, n in enumerate(outputs)]
    else:
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                  for n in outputs]
    llm = make_llm()
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(r.token_ids) for r in results] == outputs
    return elapsed, sum(outputs)


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"offline_throughput: git {' '.join(args)} failed: "
                         f"{done.stderr.strip()}")
    return done.stdout.strip()


def worktree(stack: ExitStack, ref: str) -> Path:
    """A detached worktree of `ref` in a temporary folder, removed when `stack` closes."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-against-")))
    tree = tmp / "tree"
    git("worktree", "add", "--detach", "--quiet", str(tree), ref)
    stack.callback(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    return tree


def build_sides(model: str, args, stack: ExitStack) -> tuple[dict, list[list[int]], list[int]]:
    """{side: () -> (seconds, tokens)} over the workload, each already warmed up."""
    auto = load_model(model, dtype="auto", keep_reference=True)
    fp32 = load_model(model, dtype="float32")
    reference = auto.reference.eval()
    llms = {name: (lambda m=m, kv=kv: LLM(m, max_num_seqs=args.max_num_seqs,
                                          max_num_batched_tokens=2048, kv_cache_dtype=kv))
            for name, m, kv in (("auto", auto, "auto"), ("auto_kvf32", auto, "float32"),
                                ("fp32", fp32, "auto"))}
    scale, prompts, outputs = workload(auto.tokenizer, args.requests)
    pad_id = auto.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else auto.eos_token_ids[0]
    label = ("SmolLM2-135M-Instruct (GGUF Q4_1 dequantised)" if model == DEFAULT_MODEL
             else f"{model} ({auto.architecture})")
    print(f"{label} on {platform.machine()}, {torch.get_num_threads()} torch threads;"
          f" {len(outputs)} trace requests, {scale.describe()}; {sum(outputs)} useful output"
          f" tokens per run\n  auto: {auto.dtype_plan.describe()}")
    runners = {
        "auto": lambda p, o: run_ours(llms["auto"], p, o),
        "auto_kvf32": lambda p, o: run_ours(llms["auto_kvf32"], p, o),
        "sampled": lambda p, o: run_ours(llms["auto"], p, o, sampled=True),
        "fp32": lambda p, o: run_ours(llms["fp32"], p, o),
        "hf_static": lambda p, o: hf_baselines.run_static(reference, pad_id, p, o,
                                                          args.batch_size),
        "hf_cb": lambda p, o: hf_baselines.run_hf_cb(reference, p, o, args.max_num_seqs),
    }
    sides = {}
    for name, runner in runners.items():
        if args.sides and name not in args.sides:
            continue
        try:  # warm-up, untimed; transformers' CB is new API: a failure drops the side only
            if name in FULL_WARMUP:
                runner(prompts, outputs)
            else:
                runner(prompts[:WARMUP_REQUESTS], outputs[:WARMUP_REQUESTS])
        except Exception as exc:
            if name != "hf_cb":
                raise
            print(f"  hf_cb left out: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        sides[name] = (lambda r=runner: r(prompts, outputs))
    if args.against:
        started = time.perf_counter()
        ref = hf_baselines.RefEngine(worktree(stack, args.against), model, prompts, outputs,
                                     args.max_num_seqs)
        stack.callback(ref.close)
        print(f"  ref: {args.against} ({git('rev-parse', '--short', args.against)}), its"
              f" default dtype {ref.ready}; loaded in {time.perf_counter() - started:.0f} s")
        sides["ref"] = ref.run
    return sides, prompts, outputs


def measure(model: str, args) -> dict[str, list[tuple[float, int]]]:
    """Rounds of every side in turn; {side: [(seconds, tokens) per round]}."""
    with ExitStack() as stack:
        sides, _, _ = build_sides(model, args, stack)
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name, run in sides.items():
                secs, toks = run()
                runs[name].append((secs, toks))
                print(f"round {r + 1} {name:>10}: {toks} tokens in {secs:.1f}s ="
                      f" {toks / secs:.1f} tok/s", flush=True)
    return runs


def summarise(runs: dict[str, list[tuple[float, int]]]) -> dict:
    """Per side: total tok/s (all tokens / all seconds) and per-round median [min-max];
    the RATIOS of totals whose sides both ran."""
    sides = {}
    for name, rows in runs.items():
        rates = [toks / secs for secs, toks in rows]
        sides[name] = {"tok_s": round(sum(t for _, t in rows) / sum(s for s, _ in rows), 2),
                       "median": round(statistics.median(rates), 2),
                       "range": [round(min(rates), 2), round(max(rates), 2)]}
    ratios = {key: round(sides[a]["tok_s"] / sides[b]["tok_s"], 2)
              for key, (a, b) in RATIOS.items() if a in sides and b in sides}
    return {"sides": sides, "ratios": ratios}


def report(summary: dict, rounds: int) -> None:
    print(f"tokens/s over {rounds} round(s): total [per-round median, min-max]")
    for name, side in summary["sides"].items():
        low, high = side["range"]
        print(f"  {name:>10} {side['tok_s']:9.1f}  [{side['median']:.1f}, {low:.1f}-{high:.1f}]")
    print("  ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary["ratios"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16, help="transformers static batches")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="alias or checkpoint directory")
    ap.add_argument("--against", metavar="REF", help="also time this commit's engine")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    ap.add_argument("--sides", type=lambda s: s.split(","), default=None,
                    help="only these sides, e.g. auto,sampled (default: all)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"the test suite's tiny random model, {SMOKE}")
    args = ap.parse_args()
    unknown = set(args.sides or ()) - {"auto", "auto_kvf32", "sampled", "fp32", "hf_static",
                                       "hf_cb"}
    if unknown:
        ap.error(f"--sides: unknown {sorted(unknown)}; the sides are auto, auto_kvf32,"
                 " sampled, fp32, hf_static, hf_cb (ref: --against)")
    if args.threads:
        torch.set_num_threads(args.threads)
    runs = measure_on_model(args, SMOKE, measure)
    summary = summarise(runs)
    report(summary, args.rounds)
    print(json.dumps({"smoke": args.smoke, "requests": args.requests, "rounds": args.rounds,
                      "against": args.against, **summary}))


if __name__ == "__main__":
    main()
