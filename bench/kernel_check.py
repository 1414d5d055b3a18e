"""The Triton kernels against the torch reference at real sizes, on a GPU.

Shapes: the benchmark's GQA (32 query / 8 KV heads, d=128), SmolLM2-135M (9/3, d=64) and a
Llama-1B (32/8, d=64); batches of decodes up to 16k context (single pass and split-K), mixed
batches of decodes and prefill chunks over cached prefixes, and KV writes. Each case reports
the largest |triton - reference| and passes under its dtype's tolerance.

    python -m bench.kernel_check [--json out.json]
    python -m bench.kernel_check --interpret   # CPU: the same cases, shrunk, in Triton's
                                               # interpreter
    python -m bench.kernel_check --smoke       # CPU: one case of each kind, shrunk, in the
                                               # interpreter (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TOLERANCE = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}  # max abs error, |out| ~ 1
SHAPES = {"gqa-128": (32, 8, 128), "smollm2": (9, 3, 64), "llama-1b": (32, 8, 64)}
# --smoke: indices into cases(), one of each kind: decode through paged_attention, the decode
# kernel with its split forced, a mixed batch (prefill + decode), and fp32
SMOKE_CASES = (0, 2, 3, 7)


def cases(shrink: int) -> list[tuple[str, str, str, list[tuple[int, int]], dict]]:
    """(name, shape, dtype, seqs [(context_len, q_len)], options); lengths divided by shrink."""
    def s(n: int) -> int:
        return max(1, n // shrink)

    ragged = [(1 + (977 * i) % s(4096), 1) for i in range(64 // min(shrink, 8))]
    mixed = [(1 + (613 * i) % s(3000), 1) for i in range(16 // min(shrink, 4))]
    mixed += [(s(1000) + s(512), s(512)), (s(1000), s(1000)), (42, 37)]
    return [
        ("decode ragged b64", "gqa-128", "bfloat16", ragged, {}),
        ("decode long split-K", "gqa-128", "bfloat16", [(s(16384), 1), (s(9000), 1)], {}),
        ("decode long single pass", "gqa-128", "bfloat16", [(s(16384), 1), (s(9000), 1)],
         {"num_splits": 1}),
        ("mixed", "gqa-128", "bfloat16", mixed, {}),
        ("mixed", "smollm2", "bfloat16", mixed, {}),
        ("mixed block 32", "llama-1b", "bfloat16", mixed, {"block_size": 32}),
        ("mixed", "llama-1b", "float16", mixed, {}),
        ("mixed", "smollm2", "float32", mixed[-6:], {}),
    ]


def run_case(torch, kernels_mod, name, shape, dtype_name, seqs, options, device) -> dict:
    from bench.paged_inputs import make_paged_batch
    from kernels import reference

    dtype = getattr(torch, dtype_name)
    nh, kvh, d = SHAPES[shape]
    batch, max_q, max_ctx = make_paged_batch(seqs, nh, kvh, d, dtype, device,
                                             block_size=options.get("block_size", 16))
    scale = d**-0.5
    if "num_splits" in options:  # decode kernel alone, with the split forced
        out = kernels_mod.triton_decode.decode_attention(
            batch.q, *batch[1:5], scale, query_start_loc=batch.query_start_loc,
            max_context_len=max_ctx, num_splits=options["num_splits"])
    else:
        out = kernels_mod.triton_attention.paged_attention(*batch, scale, max_q, max_ctx)
    expected = reference.paged_attention(*batch, scale)
    error = (out.float() - expected.float()).abs().max().item()
    splits = options.get("num_splits") or kernels_mod.triton_decode.choose_num_splits(
        len(seqs), kvh, max_ctx, kernels_mod.triton_launch.num_sms(batch.q.device))
    return {"case": name, "shape": shape, "dtype": dtype_name, "seqs": len(seqs),
            "tokens": int(batch.q.shape[0]), "max_context_len": max_ctx, "decode_splits": splits,
            "max_abs_error": error, "ok": error <= TOLERANCE[dtype_name]}


def check_write_kv(torch, kernels_mod, device, shrink: int) -> dict:
    from bench.paged_inputs import random_slots
    from kernels import reference

    num_blocks, tokens = max(8, 4096 // shrink), max(8, 2048 // shrink)
    caches = [torch.randn(num_blocks, 16, 8, 128, device=device).to(torch.bfloat16)
              for _ in range(2)]
    expected = [c.clone() for c in caches]
    qkv = torch.randn(tokens, 48, 128, device=device).to(torch.bfloat16)
    k, v = qkv[:, 32:40], qkv[:, 40:48]  # strided views, as a fused projection gives
    slots = random_slots(tokens, num_blocks * 16, device)
    kernels_mod.triton_attention.write_kv(*caches, k, v, slots)
    reference.write_kv(*expected, k, v, slots)
    same = all(torch.equal(a, b) for a, b in zip(caches, expected, strict=True))
    return {"case": "write_kv", "shape": "gqa-128", "dtype": "bfloat16", "tokens": tokens,
            "max_abs_error": 0.0 if same else float("nan"), "ok": same}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interpret", action="store_true",
                        help="run on CPU in Triton's interpreter, at 1/64 of the lengths")
    parser.add_argument("--smoke", action="store_true",
                        help="--interpret with one case of each kind (seconds)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.interpret = args.interpret or args.smoke
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported
    import torch

    from kernels import triton_attention, triton_decode, triton_launch

    kernels_mod = argparse.Namespace(triton_attention=triton_attention,
                                     triton_decode=triton_decode, triton_launch=triton_launch)
    if not args.interpret and not torch.cuda.is_available():
        print("kernel_check: no CUDA device (torch.cuda.is_available() is False); use "
              "--interpret for the CPU version", file=sys.stderr)
        return 2
    device = "cpu" if args.interpret else "cuda"
    shrink = 64 if args.interpret else 1
    results = []
    started = time.perf_counter()
    selected = cases(shrink)
    if args.smoke:
        selected = [selected[i] for i in SMOKE_CASES]
    for name, shape, dtype, seqs, options in selected:
        results.append(run_case(torch, kernels_mod, name, shape, dtype, seqs, options, device))
    results.append(check_write_kv(torch, kernels_mod, device, shrink))
    print(f"{'case':26} {'shape':9} {'dtype':9} {'tokens':>6} {'max ctx':>7} {'splits':>6} "
          f"{'max err':>9}")
    for r in results:
        print(f"{r['case']:26} {r['shape']:9} {r['dtype']:9} {r['tokens']:>6} "
              f"{r.get('max_context_len', ''):>7} {r.get('decode_splits', ''):>6} "
              f"{r['max_abs_error']:9.2e} {'ok' if r['ok'] else 'FAIL'}")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    summary = {"bench": "kernel_check", "device": name, "smoke": args.smoke,
               "ok": all(r["ok"] for r in results), "cases": results,
               "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
