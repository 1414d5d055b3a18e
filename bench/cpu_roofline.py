"""CPU roofline: the machine's measured ceilings beside where the engine's step time goes.

1. Ceilings. GEMM GFLOP/s of F.linear in fp32 and bf16 at the model's projection shapes
   (fused qkv and gate_up, unfused q/k/v and gate/up, o, down, lm_head; plus whatever shapes
   the loaded model really has) for 1, 4, 16, 64, 128, 256 rows, weights hot in cache, fp32
   and bf16 alternating (A B A B) per cell; and weight streaming: one batch-1 GEMV pass over
   the model's own linear weights (every layer, then lm_head) in each dtype, in GB/s.
2. The step. Real `ModelRunner.execute` on a `SchedulerOutput` of fake requests (decodes at
   a fixed context, batch 1, 16, 64, 128, and one prefill chunk): median wall time without
   the profiler, then torch.profiler's op self-times split into projections, attention,
   sampling and other (bench/roofline_profile.py: `categorise`).
3. The roofline: each step's FLOPs (2 x weights touched per row, plus attention) over its
   time, against the ideal time at the measured ceilings, per dtype: max(GEMM time at the
   measured rate of each shape, streaming time of the weights).

Tables go to stderr; the last stdout line is one JSON object.

    python -m bench.cpu_roofline [--model smollm2-135m] [--dtype auto|float32|bfloat16]
    python -m bench.cpu_roofline --smoke   # the tests' tiny model, tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench import roofline_steps as steps
from bench.random_models import run_bench
from engine.execution.model_runner import ModelRunner
from engine.models import load_model
from engine.models.cpu_dtype import cpu_info

DEFAULT_MODEL = "smollm2-135m"
BLOCK_SIZE = 16  # tokens per KV block: StaticConfig's default, what the server runs
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SMOKE = {"rows": "1,4,16", "batches": "1,4", "context": 32, "prefill": 16, "pairs": 2,
         "steps": 3, "profile_steps": 2, "sample_s": 0.002}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def cpu_features() -> dict:
    """CPU model, the bf16 matrix extensions torch's oneDNN can use, and torch's threads."""
    name, flags = cpu_info()  # flags unknown where /proc/cpuinfo is not: reported absent
    return {"model": name or platform.processor(), "amx_bf16": "amx_bf16" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "avx512f": "avx512f" in flags,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}


def seconds_per_call(fn, sample_s: float, reps: int | None = None) -> tuple[float, int]:
    """(seconds per call of fn(), reps): one sample of `reps` calls; when reps is None it is
    chosen so that a sample lasts about sample_s (at least one call)."""
    if reps is None:
        fn()  # warm: oneDNN builds its kernel for the shape on the first call
        started = time.perf_counter()
        fn()
        reps = max(1, round(sample_s / max(time.perf_counter() - started, 1e-7)))
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps, reps


def alternate(fns: dict[str, object], pairs: int, sample_s: float) -> dict[str, list[float]]:
    """Seconds per call of each fn, sampled A B A B ... `pairs` times (one process)."""
    reps: dict[str, int | None] = dict.fromkeys(fns)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(pairs):
        for key, fn in fns.items():
            secs, reps[key] = seconds_per_call(fn, sample_s, reps[key])
            samples[key].append(secs)
    return samples


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def gemm_ceilings(shapes: dict[tuple[int, int], str], rows: list[int], big_rows: list[int],
                  pairs: int, sample_s: float) -> dict:
    """GFLOP/s per dtype per shape 'IxO' per row count: {dtype: {shape: {rows: summary}}}.
    big_rows (the prefill chunk) are measured for every shape except the vocabulary's."""
    result: dict[str, dict] = {k: {} for k in DTYPES}
    vocab_out = max(out for _, out in shapes)
    gen = torch.Generator().manual_seed(0)
    for (d_in, d_out), label in sorted(shapes.items()):
        weight = torch.randn(d_out, d_in, generator=gen) * d_in**-0.5
        weights = {k: weight.to(dt) for k, dt in DTYPES.items()}
        key = f"{d_in}x{d_out}"
        for k in DTYPES:
            result[k][key] = {"label": label}
        for n in rows + ([] if d_out == vocab_out else big_rows):
            x = torch.randn(n, d_in, generator=gen)
            xs = {k: x.to(dt) for k, dt in DTYPES.items()}
            fns = {k: (lambda x=xs[k], w=weights[k]: F.linear(x, w)) for k in DTYPES}
            with torch.inference_mode():
                samples = alternate(fns, pairs, sample_s)
            flops = 2 * n * d_in * d_out
            for k, secs in samples.items():  # GFLOP/s: the fastest sample is the max rate
                result[k][key][str(n)] = summary([flops / s / 1e9 for s in secs])
        log(f"  ceilings {label:>22} {key:>10}: " + "  ".join(
            f"{n}:{result['fp32'][key][str(n)]['max']:.0f}/"
            f"{result['bf16'][key][str(n)]['max']:.0f}" for n in rows))
    return result


def streaming(weights: list[torch.Tensor], pairs: int, sample_s: float) -> dict:
    """Batch-1 GEMV over every weight in turn (the model's decode order), per dtype:
    bytes per pass, ms per pass (the floor of a single-stream step's projections), GB/s."""
    sets = {k: [w if w.dtype == dt else w.to(dt) for w in weights] for k, dt in DTYPES.items()}
    inputs = {k: {w.shape[1]: torch.randn(1, w.shape[1]).to(dt) for w in weights}
              for k, dt in DTYPES.items()}

    def one_pass(k: str) -> None:
        for w in sets[k]:
            F.linear(inputs[k][w.shape[1]], w)

    with torch.inference_mode():
        samples = alternate({k: (lambda k=k: one_pass(k)) for k in DTYPES}, pairs, sample_s)
    out = {}
    for k, secs in samples.items():
        nbytes = sum(w.numel() * w.element_size() for w in sets[k])
        out[k] = {"bytes": nbytes, "ms_per_pass": summary([s * 1e3 for s in secs]),
                  "gb_s": summary([nbytes / s / 1e9 for s in secs])}
    return out


def load(model: str, dtype: str):
    """load_model with --dtype: float32/bfloat16 as torch dtypes; auto asks the loader for
    "auto" where it takes that, else its default (this bench must run on any tree)."""
    params = inspect.signature(load_model).parameters
    if "dtype" not in params:
        return load_model(model)
    if dtype != "auto":
        return load_model(model, dtype=getattr(torch, dtype))
    try:
        return load_model(model, dtype="auto")
    except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0]
        log(f"load_model(dtype='auto') not supported here ({reason}); using its default")
        return load_model(model)


def parse_ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"{text=} must be a comma-separated list of integers >= 1")
    return values


def measure(model: str, args: argparse.Namespace) -> dict:
    rows, batches = parse_ints(args.rows), parse_ints(args.batches)
    cpu = cpu_features()
    log(f"CPU: {cpu['model']}; amx_bf16={cpu['amx_bf16']} avx512_bf16={cpu['avx512_bf16']}"
        f" onednn_bf16={cpu['onednn_bf16']}; torch {cpu['torch']},"
        f" {cpu['torch_threads']} threads")
    loaded = load(model, args.dtype)
    started = time.perf_counter()
    info = steps.model_info(loaded)
    log(f"model {model}: {info['architecture']}, LoadedModel.dtype={info['dtype']},"
        f" linear weights {info['weight_dtypes']}, {info['params']:,} parameters")
    log(f"ceilings: GEMM GFLOP/s fp32/bf16 by rows, best of {args.pairs} A/B pairs"
        " (weights hot in cache)")
    gemm = gemm_ceilings(steps.projection_shapes(loaded.model), rows, [args.prefill],
                         args.pairs, args.sample_s)
    stream = streaming([w for _, w in steps.linear_weights(loaded.model)], args.pairs,
                       args.sample_s * 10)
    for k, s in stream.items():
        log(f"  weight streaming {k}: {s['bytes'] / 1e6:.0f} MB per pass, best"
            f" {s['ms_per_pass']['min']:.2f} ms = {s['gb_s']['max']:.1f} GB/s"
            f" (median {s['gb_s']['median']:.1f}, worst {s['gb_s']['min']:.1f})")
    log(f"ceilings measured in {time.perf_counter() - started:.0f} s")
    blocks = steps.blocks_needed(max(batches), args.context, args.prefill, BLOCK_SIZE)
    runner = ModelRunner(loaded, blocks, BLOCK_SIZE)
    configs = [steps.StepShape(f"decode x{b}", b, args.context, 0) for b in batches]
    configs.append(steps.StepShape(f"prefill {args.prefill}", 0, 0, args.prefill))
    results = {}
    log(steps.TABLE_HEADER)
    for shape in configs:
        row = steps.measure_step(runner, shape, args.steps, args.profile_steps,
                                 args.temperature)
        row.update(steps.roofline(loaded.model, shape, row, gemm, stream))
        results[shape.name] = row
        log(steps.format_row(shape.name, row))
    log(steps.TABLE_LEGEND)
    return {"model": model, **info, "cpu": cpu, "context": args.context,
            "gemm_gflops": gemm, "streaming": stream, "steps": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="alias or checkpoint directory")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="weights/activations, passed to load_model (auto: the loader's choice)")
    ap.add_argument("--rows", default="1,4,16,64,128,256", help="GEMM rows for the ceilings")
    ap.add_argument("--batches", default="1,16,64,128", help="decode batch sizes profiled")
    ap.add_argument("--context", type=int, default=128, help="tokens of context per decode")
    ap.add_argument("--prefill", type=int, default=512, help="tokens of the prefill chunk")
    ap.add_argument("--pairs", type=int, default=5, help="A/B samples per ceiling cell")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per batch")
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps per batch")
    ap.add_argument("--sample-s", type=float, default=0.01, help="seconds per GEMM sample")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as offline")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    ap.add_argument("--json", type=Path, help="also write the result to this file")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = ap.parse_args()
    result = run_bench("cpu_roofline", args, SMOKE, measure)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
