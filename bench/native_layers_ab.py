"""Native decode layers A/B: whole engine decode steps, torch layers vs the native kernel.

Sides, each ModelRunner.execute of the same decode step (SmolLM2-135M loaded with dtype
auto: fp32 weights plus bf16 copies), alternating A B C D A B C D ... in one process:

    torch_fp32    the model's torch layers on the fp32 weights
    torch_bf16    the torch layers on the bf16 copies (oneDNN; AMX from 4 rows)
    native_fp32   kernels/cpu_layers.c on the fp32 weights
    native_bf16   kernels/cpu_layers.c on the bf16 copies (fp32 activations)
    native_gguf   kernels/cpu_layers.c on the GGUF's own blocks (SmolLM2: Q4_1 layers, a
                  Q8_0 lm_head; engine/models/gguf_blocks.py), where the model has them
                  (the smoke run rounds the tiny model to Q4_1 blocks first)
    native_tiles  the same layers multiplying on the Q4_1 blocks' AMX tiles (inputs rounded
                  to bf16), where the model has them (else it runs as native_gguf)

per step of N decodes at --context tokens, N in --rows. lm_head and sampling run as the
engine runs them (on the bf16 copy where the side's layers use bf16, on the head's blocks
on the gguf side). The questions it answers: up to how many rows the native layers beat
torch (NATIVE_MAX_ROWS, NATIVE_GGUF_MAX_ROWS), and which weights they should read (the
dtype auto policy, engine/models/cpu_dtype.py).

Every figure is ms per step: median [min-max] over --pairs rounds; ratios are of medians.
The last stdout line is one JSON object.

    python -m bench.native_layers_ab [--rows 1,2,4,8,12,16,24,32] [--pairs 7] [--threads 2]
    python -m bench.native_layers_ab --smoke     # the tests' tiny model, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from tqdm import tqdm

from bench import roofline_steps as steps
from bench.quantized_models import as_if_from_gguf, blocks_set_aside
from bench.random_models import run_native_bench, step_ab_parser
from engine.execution.model_runner import ModelRunner
from engine.models import load_model
from kernels import cpu_layers

# side -> (native, bf16_min_rows, on the GGUF blocks, on their AMX tiles)
SIDES = {"torch_fp32": (False, None, False, False), "torch_bf16": (False, 1, False, False),
         "native_fp32": (True, None, False, False), "native_bf16": (True, 1, False, False),
         "native_gguf": (True, 1, True, False),  # bf16: lm_head where head blocks do not run
         "native_tiles": (True, 1, True, True)}
BLOCK_SIZE = 16
SMOKE = {"rows": "1,3", "pairs": 2, "context": 20, "steps": 2}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def time_side(runner: ModelRunner, out, side: tuple, steps_per_sample: int) -> float:
    """ms per step, the mean of `steps_per_sample` steps after one untimed step."""
    native, min_rows, gguf, tiles = side
    model = runner.model
    saved = (cpu_layers.NATIVE_LAYERS, cpu_layers.NATIVE_MAX_ROWS,
             cpu_layers.NATIVE_GGUF_MAX_ROWS, cpu_layers.NATIVE_TILES_MIN_ROWS,
             cpu_layers.NATIVE_TILES_MAX_ROWS, model.bf16_min_rows)
    cpu_layers.NATIVE_LAYERS, model.bf16_min_rows = native, min_rows
    cpu_layers.NATIVE_MAX_ROWS = cpu_layers.NATIVE_GGUF_MAX_ROWS = cpu_layers.MAX_ROWS
    cpu_layers.NATIVE_TILES_MAX_ROWS = cpu_layers.MAX_ROWS
    cpu_layers.NATIVE_TILES_MIN_ROWS = 1 if tiles else cpu_layers.MAX_ROWS + 1
    try:
        with blocks_set_aside(model, aside=not gguf):
            return steps.ms_per_step(runner, out, steps_per_sample)
    finally:
        (cpu_layers.NATIVE_LAYERS, cpu_layers.NATIVE_MAX_ROWS,
         cpu_layers.NATIVE_GGUF_MAX_ROWS, cpu_layers.NATIVE_TILES_MIN_ROWS,
         cpu_layers.NATIVE_TILES_MAX_ROWS, model.bf16_min_rows) = saved


def measure(model_name: str, args: argparse.Namespace) -> dict:
    loaded = load_model(model_name, dtype="auto")
    if args.smoke:  # the tiny model as if from a GGUF: rounded to Q4_1 blocks
        as_if_from_gguf(loaded.model)
    if loaded.model.bf16_min_rows is None:
        loaded.model.keep_bf16_copies(1)  # a CPU without native bf16: still both sides
    sides = {name: side for name, side in SIDES.items()
             if not side[2] or loaded.model.gguf_layers_type is not None}
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
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.pairs):
            for name, side in sides.items():
                samples[name].append(time_side(runner, out, side, args.steps))
        row = {side: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for side, v in samples.items()}
        best_torch = min(row["torch_fp32"]["median"], row["torch_bf16"]["median"])
        row["native_bf16_vs_best_torch"] = best_torch / row["native_bf16"]["median"]
        row["native_bf16_vs_native_fp32"] = (row["native_fp32"]["median"]
                                             / row["native_bf16"]["median"])
        if "native_gguf" in row:
            row["native_gguf_vs_native_bf16"] = (row["native_bf16"]["median"]
                                                 / row["native_gguf"]["median"])
            row["native_gguf_vs_best_torch"] = best_torch / row["native_gguf"]["median"]
            row["native_tiles_vs_native_gguf"] = (row["native_gguf"]["median"]
                                                  / row["native_tiles"]["median"])
            row["native_tiles_vs_best_torch"] = best_torch / row["native_tiles"]["median"]
        results[n] = row
        log(f"  x{n:<3}" + "  ".join(
            f"{side} {r['median']:6.1f} [{r['min']:.1f}-{r['max']:.1f}]"
            for side, r in row.items() if isinstance(r, dict))
            + f"  native_bf16 vs best torch {row['native_bf16_vs_best_torch']:.2f}x"
            + (f", native_gguf vs native_bf16 {row['native_gguf_vs_native_bf16']:.2f}x,"
               f" native_tiles vs native_gguf {row['native_tiles_vs_native_gguf']:.2f}x and"
               f" vs best torch {row['native_tiles_vs_best_torch']:.2f}x"
               if "native_gguf" in row else ""))
    return {"model": model_name, "context": args.context, "threads": torch.get_num_threads(),
            "steps": results}


def main() -> None:
    ap = step_ab_parser(__doc__, SMOKE, pairs=7, steps=3)
    ap.add_argument("--rows", default="1,2,4,8,12,16,24,32", help="decodes per step")
    run_native_bench("native_layers_ab", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
