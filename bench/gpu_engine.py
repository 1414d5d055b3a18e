"""Engine throughput on a GPU against transformers `generate`, on random-weight models.

Workload (nano-vllm's benchmark shape): 256 sequences, prompt lengths and output lengths
uniform in 100..1024, prompt tokens uniform in 0..9999, ignore_eos, greedy, bf16, seed 0.
Models: SmolLM2-135M's shape and a ~1.2B Llama (bench/random_models.py), both built from a
configuration with random weights; transformers' model and ours share the weights.

Ours: LLM(max_num_seqs=256, max_num_batched_tokens=16384, block size 16), Triton attention
(BATCHPILOT_ATTENTION as set, default auto = Triton on CUDA), after a warm-up that compiles
the kernel variants. transformers: `generate` on the whole batch at once, left-padded, SDPA
attention, min_new_tokens = max_new_tokens = the longest output (static batching: it runs
until the longest request ends). Tokens/s counts the tokens each request asked for, on both
sides. Runs alternate ours, transformers per round (--rounds). Prints one JSON line last.

    python -m bench.gpu_engine [--models smollm2-135m,llama-1b] [--num-seqs 256]
    python -m bench.gpu_engine --smoke   # CPU, 2 layers, 2 sequences of 8 + 8 tokens: checks
                                         # the script end to end; its figures mean nothing
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

from bench.random_models import MODEL_SPECS, adopt, build_hf_model, num_parameters

# --smoke: a CPU run of every step at tiny sizes; the model keeps its attention shape but
# has 2 layers and a 10240-token vocabulary (prompt ids are < 10000)
SMOKE = {"device": "cpu", "num_seqs": 2, "max_len": 8, "rounds": 1}
SMOKE_MODEL = {"num_hidden_layers": 2, "vocab_size": 10240}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def workload(num_seqs: int, seed: int, hi: int = 1024):
    """Prompts (token ids) and output lengths, lengths uniform in 100..hi (min(100, hi) ..)."""
    rng = random.Random(seed)
    lo = min(100, hi)
    prompts = [[rng.randint(0, 9999) for _ in range(rng.randint(lo, hi))] for _ in range(num_seqs)]
    outputs = [rng.randint(lo, hi) for _ in range(num_seqs)]
    return prompts, outputs


def run_ours(llm, prompts, outputs) -> float:
    from engine import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]
    sync()
    started = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    sync()
    elapsed = time.perf_counter() - started
    got = [len(r.token_ids) for r in results]
    if got != list(outputs):
        raise AssertionError(f"engine produced {sum(got)} tokens, {sum(outputs)} asked")
    return elapsed


def warm_up(llm, vocab: int) -> None:
    """Compile the kernel variants a run meets: prefill tiles of 16..128 rows, the decode
    kernel, and split-K (one long sequence decoding alone)."""
    for length in (2, 5, 12, 30, 100, 600):
        run_ours(llm, [[(7 * i) % vocab for i in range(length)]], [3])


def run_transformers(model, prompts, outputs, batch_size: int, device: str) -> float:
    sync()
    started = time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        batch, outs = prompts[b:b + batch_size], outputs[b:b + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch],
                            device=device)
        new = max(outs)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
    sync()
    return time.perf_counter() - started


def bench_model(name: str, args) -> dict:
    from engine import LLM

    dtype = getattr(torch, args.dtype)
    hf = build_hf_model(name, dtype, args.device, seed=args.seed,
                        **(SMOKE_MODEL if args.smoke else {}))
    loaded = adopt(hf, dtype, args.device, name)
    prompts, outputs = workload(args.num_seqs, args.seed, args.max_len)
    max_len = max(len(p) for p in prompts) + max(outputs)
    blocks = args.num_seqs * -(-max_len // 16) + 64  # every sequence at full length at once
    llm = LLM(loaded, max_num_seqs=args.num_seqs, max_num_batched_tokens=16384,
              max_model_len=max(4096, max_len), num_kv_blocks=blocks, block_size=16)
    backend = loaded.model.model.layers[0].self_attn.attn.backend.name
    if backend == "auto":  # auto = Triton for CUDA tensors, the reference for CPU ones
        backend = "triton (auto)" if args.device == "cuda" else "reference (auto)"
    warm_up(llm, hf.config.vocab_size)
    ours_s, hf_s = [], []
    for _ in range(args.rounds):  # A B A B: ours, then transformers
        ours_s.append(run_ours(llm, prompts, outputs))
        hf_s.append(run_transformers(hf, prompts, outputs, args.hf_batch_size or args.num_seqs,
                                     args.device))
    tokens = sum(outputs)
    ours_tps, hf_tps = tokens * len(ours_s) / sum(ours_s), tokens * len(hf_s) / sum(hf_s)
    result = {"model": name, "layers": hf.config.num_hidden_layers,
              "parameters": num_parameters(hf), "attention_backend": backend,
              "num_seqs": args.num_seqs, "output_tokens": tokens,
              "prompt_tokens": sum(len(p) for p in prompts), "rounds": args.rounds,
              "ours_s": ours_s, "transformers_s": hf_s, "ours_tok_per_s": ours_tps,
              "transformers_tok_per_s": hf_tps, "ratio": ours_tps / hf_tps}
    del llm, loaded, hf
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,llama-1b",
                        help=f"comma-separated, from {sorted(MODEL_SPECS)}")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hf-batch-size", type=int, help="transformers batch (default: all)")
    parser.add_argument("--max-len", type=int, default=1024, help="longest prompt and output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, help="also write the JSON result here")
    parser.add_argument("--smoke", action="store_true",
                        help=f"tiny run on CPU ({SMOKE}, {SMOKE_MODEL}); figures not "
                        "meaningful")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu_engine needs a CUDA GPU and torch.cuda.is_available() is False "
              "(--smoke runs a dry run of the script on CPU)", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    result = {"bench": "gpu_engine", "device": device_name, "dtype": args.dtype,
              "figures_meaningful": args.device == "cuda" and not args.smoke, "models": []}
    for name in args.models.split(","):
        r = bench_model(name.strip(), args)
        result["models"].append(r)
        print(f"{r['model']:14} {r['parameters'] / 1e6:7.0f}M params  {r['output_tokens']} "
              f"output tokens  ours {r['ours_tok_per_s']:8.0f} tok/s ({r['attention_backend']})"
              f"  transformers {r['transformers_tok_per_s']:8.0f} tok/s  ratio "
              f"{r['ratio']:.2f}x", flush=True)
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
