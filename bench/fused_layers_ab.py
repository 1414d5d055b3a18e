"""Fused work between projections A/B: engine steps the native decode layers do not take,
torch ops vs kernels/cpu_elementwise.c, alternating A B A B in one process.

Sides, each ModelRunner.execute of the same step (SmolLM2-135M, dtype auto; the steps run
on the bf16 copies as served):

    torch   the model's torch layers (~18 ops a layer)
    fused   torch's projections, each stretch between two of them one native call
            (engine/models/fused_layers.py; what dtype auto runs)

per step shape: decodes of --context tokens at each count in --decodes (above the native
decode layers' NATIVE_MAX_ROWS, which would take the smaller ones), one prefill chunk of
--prefill tokens, that chunk with 16 decodes, and --prefill tokens as --prompts whole
prompts (as in the offline workload's big prefill steps). Every figure is ms per step: median
[min-max] over --pairs rounds; ratios are of medians. The last stdout line is one JSON
object.

    python -m bench.fused_layers_ab [--decodes 32,64,128] [--prefill 1024] [--prompts 11]
    python -m bench.fused_layers_ab --smoke     # the tests' tiny model, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from tqdm import tqdm

from bench import roofline_steps as steps
from bench.random_models import run_native_bench, step_ab_parser
from engine.execution.model_runner import ModelRunner
from engine.models import load_model
from kernels import cpu_elementwise

BLOCK_SIZE = 16
SMOKE = {"decodes": "20", "prefill": 24, "prompts": 3, "pairs": 2, "context": 20, "steps": 2}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def time_side(runner: ModelRunner, out, fused: bool, steps_per_sample: int) -> float:
    """ms per step, the mean of `steps_per_sample` steps after one untimed step."""
    saved = cpu_elementwise.NATIVE_ELEMENTWISE
    cpu_elementwise.NATIVE_ELEMENTWISE = fused
    try:
        return steps.ms_per_step(runner, out, steps_per_sample)
    finally:
        cpu_elementwise.NATIVE_ELEMENTWISE = saved


def shapes(args: argparse.Namespace) -> list[steps.StepShape]:
    found = [steps.StepShape(f"decode x{n}", int(n), args.context, 0)
             for n in args.decodes.split(",")]
    return [*found, steps.StepShape(f"prefill {args.prefill}", 0, 0, args.prefill),
            steps.StepShape(f"prefill {args.prefill} + 16 decodes", 16, args.context,
                            args.prefill),
            steps.StepShape(f"prefill {args.prefill} in {args.prompts} prompts", 0, 0,
                            args.prefill, args.prompts)]


def measure(model_name: str, args: argparse.Namespace) -> dict:
    loaded = load_model(model_name, dtype="auto")
    todo = shapes(args)
    blocks = max(steps.blocks_needed(s.decodes, s.context, s.prefill, BLOCK_SIZE, s.prompts)
                 for s in todo)
    runner = ModelRunner(loaded, blocks, BLOCK_SIZE)
    vocab = loaded.hf_config.vocab_size
    results = {}
    log(f"ms per step, median [min-max] of {args.pairs} rounds, sides alternating;"
        f" {torch.get_num_threads()} threads; {loaded.dtype_plan.describe()}")
    for shape in tqdm(todo, desc="step shapes", file=sys.stderr, disable=args.smoke):
        out = steps.build_step(shape, vocab, BLOCK_SIZE, 0.0)
        samples: dict[str, list[float]] = {"torch": [], "fused": []}
        for _ in range(args.pairs):
            for side in samples:
                samples[side].append(time_side(runner, out, side == "fused", args.steps))
        row = {side: {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for side, v in samples.items()}
        row["speedup"] = row["torch"]["median"] / row["fused"]["median"]
        results[shape.name] = row
        log(f"  {shape.name:<30}" + "  ".join(
            f"{side} {row[side]['median']:7.1f} [{row[side]['min']:.1f}-{row[side]['max']:.1f}]"
            for side in samples) + f"  fused {row['speedup']:.2f}x")
    return {"model": model_name, "context": args.context, "threads": torch.get_num_threads(),
            "steps": results}


def main() -> None:
    ap = step_ab_parser(__doc__, SMOKE, pairs=7, steps=2)
    ap.add_argument("--decodes", default="32,64,128", help="decode counts per step")
    ap.add_argument("--prefill", type=int, default=1024, help="tokens of the prefill chunk")
    ap.add_argument("--prompts", type=int, default=11,
                    help="prompts sharing --prefill tokens in the last shape (the offline"
                         " workload's big prefill steps hold ~90-token prompts)")
    run_native_bench("fused_layers_ab", ap.parse_args(), SMOKE, measure)


if __name__ == "__main__":
    main()
