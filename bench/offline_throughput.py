"""Offline throughput on CPU: our engine vs transformers `generate` with static batches.

Workload: the first 64 requests of the Azure LLM 2023 conversation trace, prompt lengths
/ 8 and output lengths / 4 (at least 4 each); prompts are real text cut to the wanted
token count; outputs forced to the trace's length (ignore_eos, greedy). transformers runs
static batches of 16 (left-padded; a batch runs until its longest request ends). Only the
tokens each request asked for count. Runs alternate A B A B; totals over all runs.

Last line: one JSON object with each side's useful output tokens/s and the ratio.

    python -m bench.offline_throughput [--requests 64] [--rounds 2] [--model smollm2-135m]
    python -m bench.offline_throughput --smoke   # the tests' tiny model, 4 requests, 1 round
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from engine.models import load_model
from engine.sim.workload import TraceScale, load_trace

DEFAULT_MODEL = "smollm2-135m"
SMOKE = {"requests": 4, "batch_size": 2, "rounds": 1, "max_num_seqs": 4}

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


def run_ours(llm: LLM, prompts: list[list[int]], outputs: list[int]) -> tuple[float, int]:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(r.token_ids) for r in results] == outputs
    return elapsed, sum(outputs)


def run_transformers(model, pad_id: int, prompts: list[list[int]], outputs: list[int],
                     batch_size: int) -> tuple[float, int]:
    start = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch, outs = prompts[b:b + batch_size], outputs[b:b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        new = max(outs)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - start, sum(outputs)


def measure(model: str, args) -> dict:
    """A B A B ... over the trace's first args.requests requests; totals per side."""
    scale = TraceScale(prompt_div=8, output_div=4, min_tokens=4)
    trace = load_trace(limit=args.requests, scale=scale)
    loaded = load_model(model, keep_reference=True)
    reference = loaded.reference.eval()
    llm = LLM(loaded, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=2048)
    prompts = make_prompts(loaded.tokenizer, [t.prompt_tokens for t in trace])
    outputs = [t.output_tokens for t in trace]
    pad_id = loaded.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else loaded.eos_token_ids[0]
    label = ("SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to fp32)" if model == DEFAULT_MODEL
             else f"{model} ({loaded.architecture}, {loaded.dtype})")
    print(f"{label} on {platform.machine()},"
          f" {torch.get_num_threads()} torch threads; {len(trace)} trace requests, "
          f"{scale.describe()}; {sum(outputs)} useful output tokens per run")
    totals = {"batchpilot": [0.0, 0], "transformers": [0.0, 0]}
    for r in range(args.rounds):
        for name in ("batchpilot", "transformers"):
            if name == "batchpilot":
                secs, toks = run_ours(llm, prompts, outputs)
            else:
                secs, toks = run_transformers(reference, pad_id, prompts, outputs,
                                              args.batch_size)
            totals[name][0] += secs
            totals[name][1] += toks
            print(f"round {r + 1} {name:>12}: {toks} tokens in {secs:.1f}s ="
                  f" {toks / secs:.1f} tok/s", flush=True)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="alias or checkpoint directory")
    ap.add_argument("--smoke", action="store_true",
                    help=f"the test suite's tiny random model, {SMOKE}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tiny-") as tmp:
        model = args.model
        if args.smoke:
            from bench.random_models import tiny_checkpoint

            vars(args).update(SMOKE)
            model = str(tiny_checkpoint(Path(tmp)))
        totals = measure(model, args)
    ours = totals["batchpilot"][1] / totals["batchpilot"][0]
    theirs = totals["transformers"][1] / totals["transformers"][0]
    print(json.dumps({"smoke": args.smoke, "batchpilot_tok_s": round(ours, 2),
                      "transformers_tok_s": round(theirs, 2), "ratio": round(ours / theirs, 2)}))


if __name__ == "__main__":
    main()
