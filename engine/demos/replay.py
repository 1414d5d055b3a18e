"""A simulated workload from the Azure trace (`python -m engine.demos.replay`).

Replays the first requests of the bundled trace through the engine with the simulated
executor (no model; per-token costs roughly those of a small model on a CPU), and prints
per-lane latency percentiles. Simulated time, so it finishes in seconds.
"""

from __future__ import annotations

import argparse
import random

from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.stats import format_latency_table, latency_table
from engine.sim.workload import TraceScale, load_trace

TENANTS = ("acme", "globex", "initech")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--batching", choices=("continuous", "static"), default="continuous")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    scale = TraceScale(prompt_div=4, output_div=4, time_div=1.5, min_tokens=4)
    trace = load_trace(limit=args.requests, scale=scale)
    clock = FakeClock()
    executor = SimulatedExecutor(clock=clock, step_cost_s=0.02, prefill_token_cost_s=2e-4,
                                 decode_token_cost_s=1e-3)
    live = LiveConfig(max_num_seqs=64, max_num_batched_tokens=1024, prefill_chunk_size=512,
                      long_context_threshold=512, batching=args.batching)
    engine = Engine(EngineConfig(StaticConfig(num_kv_blocks=2048, max_model_len=8192), live),
                    executor, clock=clock, eos_token_id=executor.eos_token_id)
    rng = random.Random(args.seed)

    def route(i, item):
        lane = "batch" if rng.random() < 0.2 else None  # others routed by prompt length
        return {"tenant": rng.choice(TENANTS), "lane": lane}

    print(f"batchpilot demo: {len(trace)} requests of the Azure LLM 2023 conversation trace,"
          f" {scale.describe()}")
    print(f"simulated executor: 20 ms/step + 0.2 ms/prompt token + 1 ms/decode token;"
          f" {args.batching} batching, max_num_seqs={live.max_num_seqs},"
          f" max_num_batched_tokens={live.max_num_batched_tokens}")
    result = simulate(engine, clock, trace, route=route, seed=args.seed, progress=True)
    print()
    print(format_latency_table(latency_table(result.records, by="lane"), by="lane"))
    print()
    outcomes: dict[str, int] = {}
    for rec in result.records:
        outcomes[rec.finish_reason] = outcomes.get(rec.finish_reason, 0) + 1
    print(f"outcomes: {outcomes}, rejected: {len(result.rejected)}")
    print(f"{result.steps} steps over {result.sim_seconds:.1f} simulated seconds;"
          f" {result.output_tokens / result.sim_seconds:.1f} output tokens/s")


if __name__ == "__main__":
    main()
