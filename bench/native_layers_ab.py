"""Native decode layers A/B: whole engine decode steps, torch layers vs the native kernel.

Sides, each ModelRunner.execute of the same decode step (SmolLM2-135M loaded with dtype
auto: fp32 weights plus bf16 copies), alternating A B C D A B C D ... in one process:

    torch_fp32    the model's torch layers on the fp32 weights
    torch_bf16    the torch layers on the bf16 copies (oneDNN; AMX from 4 rows)
    native_fp32   kernels/cpu_layers.c on the fp32 weights
    native_bf16   kernels/cpu_layers.c on the bf16 copies (fp32 activations)

per step of N decodes at --context tokens, N in --rows. lm_head and sampling run as the
engine runs them (on the bf16 copy where the side's layers use bf16). The two questions
it answers: up to how many rows the native layers beat torch (NATIVE_MAX_ROWS), and
whether bf16 weights beat fp32 at 1-3 rows once the GEMV streams them at full speed (the
dtype auto policy, engine/models/cpu_dtype.py).

Every figure is ms per step: median [min-max] over --pairs rounds; ratios are of medians.
The last stdout line is one JSON object.

    python -m bench.native_layers_ab [--rows 1,2,4,8,12,16,24,32] [--pairs 7] [--threads 2]
    python -m bench.native_layers_ab --smoke     # the tests' tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from tqdm import tqdm

from bench import roofline_steps as steps
from bench.random_models import measure_on_model
from engine.model_runner import ModelRunner
from engine.models import load_model
from kernels import cpu_layers, cpu_native

SIDES = {"torch_fp32": (False, None), "torch_bf16": (False, 1),
         "native_fp32": (True, None), "native_bf16": (True, 1)}  # (native, bf16_min_rows)
BLOCK_SIZE = 16
SMOKE = {"rows": "1,3", "pairs": 2, "context": 20, "steps": 2}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def time_side(runner: ModelRunner, out, native: bool, min_rows: int | None,
              steps_per_sample: int) -> float:
    """ms per step, the mean of `steps_per_sample` steps after one untimed step."""
    model = runner.model
    saved = cpu_layers.NATIVE_LAYERS, cpu_layers.NATIVE_MAX_ROWS, model.bf16_min_rows
    cpu_layers.NATIVE_LAYERS, cpu_layers.NATIVE_MAX_ROWS = native, cpu_layers.MAX_ROWS
    model.bf16_min_rows = min_rows
    try:
        runner.execute(out)
        started = time.perf_counter()
        for _ in range(steps_per_sample):
            runner.execute(out)
        return (time.perf_counter() - started) / steps_per_sample * 1e3
    finally:
        cpu_layers.NATIVE_LAYERS, cpu_layers.NATIVE_MAX_ROWS, model.bf16_min_rows = saved


def measure(model_name: str, args: argparse.Namespace) -> dict:
    loaded = load_model(model_name, dtype="auto")
    if loaded.model.bf16_min_rows is None:
        loaded.model.keep_bf16_copies(1)  # a CPU without native bf16: still both sides
    rows = [int(r) for r in args.rows.split(",")]
    if max(rows) > cpu_layers.MAX_ROWS:
        raise SystemExit(f"--rows: at most {cpu_layers.MAX_ROWS} (the kernel's MAX_ROWS)")
    runner = ModelRunner(loaded, steps.blocks_needed(max(rows), args.context, 0, BLOCK_SIZE),
                         BLOCK_SIZE)
    vocab = loaded.hf_config.vocab_size
    results = {}
    log(f"ms per decode step at context {args.context}, median [min-max] of {args.pairs}"
        f" rounds, sides alternating; {torch.get_num_threads()} threads")
    for n in tqdm(rows, desc="step sizes", file=sys.stderr, disable=args.smoke):
        out = steps.build_step(steps.StepShape(f"decode x{n}", n, args.context, 0), vocab,
                               BLOCK_SIZE, 0.0)
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.pairs):
            for side, (native, min_rows) in SIDES.items():
                samples[side].append(time_side(runner, out, native, min_rows, args.steps))
        row = {side: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for side, v in samples.items()}
        best_torch = min(row["torch_fp32"]["median"], row["torch_bf16"]["median"])
        row["native_bf16_vs_best_torch"] = best_torch / row["native_bf16"]["median"]
        row["native_bf16_vs_native_fp32"] = (row["native_fp32"]["median"]
                                             / row["native_bf16"]["median"])
        results[n] = row
        log(f"  x{n:<3}" + "  ".join(
            f"{side} {r['median']:6.1f} [{r['min']:.1f}-{r['max']:.1f}]"
            for side, r in row.items() if isinstance(r, dict))
            + f"  native_bf16 vs best torch {row['native_bf16_vs_best_torch']:.2f}x")
    return {"model": model_name, "context": args.context, "threads": torch.get_num_threads(),
            "steps": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or checkpoint directory")
    ap.add_argument("--rows", default="1,2,4,8,12,16,24,32", help="decodes per step")
    ap.add_argument("--context", type=int, default=128, help="tokens of context per decode")
    ap.add_argument("--pairs", type=int, default=7, help="rounds of all sides per step size")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per sample")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    ap.add_argument("--smoke", action="store_true", help=f"the tests' tiny model, {SMOKE}")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if cpu_native.load() is None:
        raise SystemExit(f"the native kernels are unavailable: {cpu_native.unavailable_reason()}")
    started = time.perf_counter()
    result = measure_on_model(args, SMOKE, measure)
    print(json.dumps({"bench": "native_layers_ab", "smoke": args.smoke, **result,
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
