"""Triton attention kernels on a GPU: decode bandwidth, prefill TFLOP/s, side by side with
torch SDPA on the same data laid out contiguously.

Workload: GQA with 32 query / 8 KV heads, head_dim 128, bf16, block size 16, block tables in
random order. Decode: batch 1, 16, 64 x context 1k, 4k, 16k, one query per sequence, through
the backend's paged_attention (decode kernel, plus the split-K reduce where the heuristic
splits). Achieved bandwidth = bytes of K, V and Q read and of the output written / kernel
time, as a fraction of the device's peak (looked up by name; --peak-tbps overrides). SDPA
gets q [B, 32, 1, 128] and K/V [B, 8, ctx, 128] contiguous (enable_gqa, torch's choice of
backend). Prefill: 4 prompts of 4096 tokens (causal; SDPA is_causal) and 8 chunks of 1024
over 3072 cached tokens (SDPA with a lower-right causal mask where torch supports it);
FLOPs = 4 * head_dim * num_heads * (query, visible key) pairs. Times are medians of
triton.testing.do_bench (L2 flushed before each run). Also a sweep of decode launch shapes
at batch 64, context 4k. Prints a table, then one JSON line.

    python -m bench.kernel_speed [--peak-tbps 4.8] [--json out.json]
    python -m bench.kernel_speed --smoke   # CPU, Triton's interpreter, tiny sizes: checks the
                                           # script end to end; its figures mean nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Peak HBM bandwidth (TB/s) by device-name substring, first match wins (GH200 before H200).
PEAK_TBPS = [("GH200", 4.0), ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0),
             ("H100", 3.35), ("B200", 8.0), ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935),
             ("A100", 1.555), ("L40S", 0.864), ("L4", 0.3), ("A10G", 0.6), ("A10", 0.6),
             ("RTX 4090", 1.008)]
GOAL = {"batch": 64, "context": 4096, "fraction": 0.7}  # the decode target (H200)
SHAPE = (32, 8, 128)  # query heads, KV heads, head_dim
TINY_SHAPE = (8, 2, 64)


def peak_tbps(device_name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((tbps for key, tbps in PEAK_TBPS if key in device_name), None)


def make_timer(interpreted: bool):
    """Milliseconds per call: do_bench medians on a GPU, a rough wall clock when interpreted."""
    if interpreted:
        def wall_ms(fn) -> float:
            fn()
            started = time.perf_counter()
            fn()
            return (time.perf_counter() - started) * 1e3
        return wall_ms
    import triton.testing

    return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_sdpa(torch, timer, call) -> tuple[float, str]:
    """(ms, backend) of the fastest SDPA backend among flash, cuDNN and memory-efficient that
    accepts the call; torch's default choice if none does (math, slow with GQA)."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    best: tuple[float, str] | None = None
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION):
        try:
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")
                call()  # raises when this backend cannot take the inputs
                ms = timer(call)
        except RuntimeError:
            continue
        if best is None or ms < best[0]:
            best = (ms, backend.name.lower())
    return best or (timer(call), "default")


def dense_kv(batch, ctx: int):
    """[B, kvh, ctx, d] contiguous K and V of a batch whose sequences all have ctx tokens."""
    blocks = batch.block_tables[:, : -(-ctx // batch.k_cache.shape[1])].long()  # [B, nb]
    out = []
    for cache in (batch.k_cache, batch.v_cache):
        rows = cache[blocks].flatten(1, 2)[:, :ctx]  # [B, ctx, kvh, d]
        out.append(rows.transpose(1, 2).contiguous())
    return out


def bench_decode(torch, ops, timer, shape, batch_size, ctx, peak) -> dict:
    from bench.paged_inputs import make_paged_batch

    nh, kvh, d = shape
    batch, _, _ = make_paged_batch([(ctx, 1)] * batch_size, nh, kvh, d, ops.dtype, ops.device)
    scale = d**-0.5
    out = ops.paged_attention(*batch, scale, 1, ctx)
    k, v = dense_kv(batch, ctx)
    q = batch.q.unsqueeze(2)  # [B, nh, 1, d]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    error = (out.float() - ref[:, :, 0].float()).abs().max().item()
    ms = timer(lambda: ops.paged_attention(*batch, scale, 1, ctx))
    sdpa_ms, sdpa_backend = time_sdpa(torch, timer, lambda: (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)))
    item = batch.q.element_size()
    nbytes = 2 * batch_size * ctx * kvh * d * item + 2 * batch_size * nh * d * item
    tbps = nbytes / (ms * 1e-3) / 1e12
    splits = ops.choose_num_splits(batch_size, kvh, ctx, ops.num_sms(batch.q.device))
    return {"batch": batch_size, "context": ctx, "splits": splits, "ms": ms, "tb_per_s": tbps,
            "fraction_of_peak": tbps / peak if peak else None, "sdpa_ms": sdpa_ms,
            "sdpa_backend": sdpa_backend, "speedup_vs_sdpa": sdpa_ms / ms,
            "max_abs_diff_vs_sdpa": error}


def bench_prefill(torch, ops, timer, shape, num_seqs, ctx, q_len) -> dict:
    from bench.paged_inputs import make_paged_batch

    nh, kvh, d = shape
    batch, _, _ = make_paged_batch([(ctx, q_len)] * num_seqs, nh, kvh, d, ops.dtype,
                                   ops.device)
    scale = d**-0.5
    ms = timer(lambda: ops.paged_attention(*batch, scale, q_len, ctx))
    pairs = num_seqs * (q_len * (ctx - q_len) + q_len * (q_len + 1) // 2)
    flops = 4 * d * nh * pairs
    k, v = dense_kv(batch, ctx)
    q = batch.q.view(num_seqs, q_len, nh, d).transpose(1, 2)  # [B, nh, q_len, d]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if q_len == ctx:
        sdpa_ms, sdpa_backend = time_sdpa(torch, timer, lambda: sdpa(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True))
    else:  # the chunk's queries are the last q_len positions: a lower-right causal mask
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q_len, ctx)
        sdpa_ms, sdpa_backend = time_sdpa(torch, timer, lambda: sdpa(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=True))
    return {"seqs": num_seqs, "context": ctx, "query_len": q_len, "ms": ms,
            "tflop_per_s": flops / (ms * 1e-3) / 1e12, "sdpa_ms": sdpa_ms,
            "sdpa_backend": sdpa_backend, "sdpa_tflop_per_s": flops / (sdpa_ms * 1e-3) / 1e12,
            "speedup_vs_sdpa": sdpa_ms / ms}


def sweep_decode_tiles(torch, ops, timer, shape, batch_size, ctx) -> list[dict]:
    from bench.paged_inputs import make_paged_batch

    nh, kvh, d = shape
    batch, _, _ = make_paged_batch([(ctx, 1)] * batch_size, nh, kvh, d, ops.dtype, ops.device)
    nbytes = 2 * batch_size * (ctx * kvh + nh) * d * batch.q.element_size()
    results = []
    for block_n, warps, stages in [(64, 4, 2), (64, 4, 3), (32, 4, 3), (128, 4, 2),
                                   (64, 8, 2), (128, 8, 2)]:
        tile = ops.DecodeTile(block_n, warps, stages)
        ms = timer(lambda tile=tile: ops.decode_attention(
            batch.q, *batch[1:5], d**-0.5, query_start_loc=batch.query_start_loc,
            max_context_len=ctx, num_splits=1, tile=tile))
        results.append({"block_n": block_n, "num_warps": warps, "num_stages": stages,
                        "ms": ms, "tb_per_s": nbytes / (ms * 1e-3) / 1e12,
                        "default": tile == ops.default_tile(d)})
    return results


def print_tables(result: dict) -> None:
    peak = result["peak_tbps"]
    print(f"device: {result['device']}, peak {peak or '?'} TB/s, {result['dtype']}, "
          f"heads {result['shape']} (query, kv, head_dim)")
    if not result["figures_meaningful"]:
        print("smoke run in Triton's interpreter: times, bandwidth and speed-ups mean nothing")
    print(f"{'batch':>5} {'context':>7} {'splits':>6} {'ms':>8} {'TB/s':>6} {'of peak':>7} "
          f"{'sdpa ms':>8} {'vs sdpa':>7} {'max diff':>8}  sdpa backend")
    for r in result["decode"]:
        frac = f"{r['fraction_of_peak']:.0%}" if r["fraction_of_peak"] is not None else "?"
        print(f"{r['batch']:>5} {r['context']:>7} {r['splits']:>6} {r['ms']:8.4f} "
              f"{r['tb_per_s']:6.2f} {frac:>7} {r['sdpa_ms']:8.4f} "
              f"{r['speedup_vs_sdpa']:6.2f}x {r['max_abs_diff_vs_sdpa']:8.1e}  {r['sdpa_backend']}")
    print(f"{'seqs':>5} {'context':>7} {'q len':>6} {'ms':>8} {'TFLOP/s':>8} {'sdpa ms':>8} "
          f"{'TFLOP/s':>8} {'vs sdpa':>7}  sdpa backend")
    for r in result["prefill"]:
        print(f"{r['seqs']:>5} {r['context']:>7} {r['query_len']:>6} {r['ms']:8.3f} "
              f"{r['tflop_per_s']:8.1f} {r['sdpa_ms']:8.3f} {r['sdpa_tflop_per_s']:8.1f} "
              f"{r['speedup_vs_sdpa']:6.2f}x  {r['sdpa_backend']}")
    print("decode launch shapes at batch {batch}, context {context}:".format(
        **result["decode_tiles_at"]))
    for r in result["decode_tiles"]:
        print(f"  block_n {r['block_n']:>3}  warps {r['num_warps']}  stages {r['num_stages']}"
              f"  {r['ms']:.4f} ms  {r['tb_per_s']:.2f} TB/s"
              f"{'  (default)' if r['default'] else ''}")


def workload(smoke: bool) -> dict:
    """Shapes and sizes: the real ones, or --smoke's tiny ones (every step still runs)."""
    if smoke:  # about 30 kernel calls, each well under a second in the interpreter
        return {"shape": TINY_SHAPE, "batches": (1, 2), "contexts": (32, 96),
                "prefills": [(2, 64, 64), (2, 64, 16)], "goal": (2, 96)}
    return {"shape": SHAPE, "batches": (1, 16, 64), "contexts": (1024, 4096, 16384),
            "prefills": [(4, 4096, 4096), (8, 4096, 1024)],
            "goal": (GOAL["batch"], GOAL["context"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-tbps", type=float, help="peak memory bandwidth, TB/s")
    parser.add_argument("--json", type=Path, help="also write the JSON result here")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, Triton's interpreter, tiny sizes (figures not meaningful)")
    args = parser.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("bench.kernel_speed needs a CUDA GPU and torch.cuda.is_available() is False; on "
              "CPU the kernels are tested by tests/kernels/test_triton.py (or run this with "
              "--smoke for a dry run of the script itself)", file=sys.stderr)
        return 2
    from kernels import triton_attention, triton_decode, triton_launch

    ops = argparse.Namespace(
        paged_attention=triton_attention.paged_attention,
        decode_attention=triton_decode.decode_attention,
        choose_num_splits=triton_decode.choose_num_splits, num_sms=triton_launch.num_sms,
        DecodeTile=triton_decode.DecodeTile, default_tile=triton_decode.default_tile,
        dtype=torch.bfloat16, device="cpu" if args.smoke else "cuda")
    timer = make_timer(args.smoke)
    w = workload(args.smoke)
    shape, goal = w["shape"], w["goal"]
    # no peak for the interpreter: a fraction of a GPU's bandwidth would be a made-up figure
    name = "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name()
    peak = None if args.smoke else peak_tbps(name, args.peak_tbps)
    result = {"bench": "kernel_speed", "device": name, "figures_meaningful": not args.smoke,
              "peak_tbps": peak, "dtype": "bfloat16", "shape": list(shape), "decode": [],
              "prefill": [], "decode_tiles": []}
    with torch.inference_mode():
        for batch_size in w["batches"]:
            for ctx in w["contexts"]:
                result["decode"].append(
                    bench_decode(torch, ops, timer, shape, batch_size, ctx, peak))
                if not args.smoke:
                    torch.cuda.empty_cache()
        for num_seqs, ctx, q_len in w["prefills"]:
            result["prefill"].append(bench_prefill(torch, ops, timer, shape, num_seqs, ctx, q_len))
        result["decode_tiles"] = sweep_decode_tiles(torch, ops, timer, shape, *goal)
        result["decode_tiles_at"] = {"batch": goal[0], "context": goal[1]}
    at_goal = next(r for r in result["decode"] if (r["batch"], r["context"]) == goal)
    fraction = at_goal["fraction_of_peak"]
    result["goal"] = {**GOAL, "achieved": fraction,
                      "met": None if fraction is None else fraction >= GOAL["fraction"]}
    print_tables(result)
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
