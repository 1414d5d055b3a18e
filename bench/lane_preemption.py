"""Interactive TTFT under a batch flood, with the interactive lane's `preempt_to_start` on
and off, side by side on the simulated engine (virtual clock: deterministic, seconds).

Workload (per seed): at t=0 a flood of batch requests (lane `batch`, preempt_first) whose
KV needs are several times the pool, so the batch lane alone keeps usage above the high
watermark until it drains; interactive requests (lane `interactive`) arrive as a Poisson
stream meanwhile. The two configs differ only in `lanes.interactive.preempt_to_start`.
Executor cost: 5 ms per step + 0.05 ms per prompt token + 0.2 ms per decode token. For
each seed the same trace runs with the setting on, then off (A B A B ...); the ratios are
off / on for interactive TTFT p99 (> 1: on is better) and on / off for the time the batch
work takes to complete (> 1: on costs the batch lane that much). Interactive requests
refused at admission (KV above the reject watermark) are counted apart: their TTFT is not
in the percentiles, which flatters "off".

    python -m bench.lane_preemption [--seeds 5] [--batch 96] [--interactive 150]
    python -m bench.lane_preemption --smoke   # 2 seeds, 12 batch, 20 interactive
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from engine.config import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import SimulationResult, simulate
from engine.sim.stats import percentile
from engine.sim.workload import TraceRequest

NUM_KV_BLOCKS = 256  # x 16 tokens: 4096 tokens of KV
BATCH_SHAPE = (256, 256)  # prompt, output tokens: 32 blocks each when done
CHAT_SHAPE = (64, 16)
CHAT_RATE = 8.0  # interactive arrivals per simulated second
SMOKE = {"seeds": 2, "batch": 12, "interactive": 20}


def workload(seed: int, num_batch: int, num_chat: int) -> tuple[list[TraceRequest], set[int]]:
    """The trace (arrival order) and the indices of its interactive requests."""
    rng = random.Random(seed)
    items = [(0.0, "batch")] * num_batch
    t = 0.0
    for _ in range(num_chat):
        t += rng.expovariate(CHAT_RATE)
        items.append((t, "interactive"))
    items.sort(key=lambda x: x[0])
    trace, chat = [], set()
    for i, (arrival, lane) in enumerate(items):
        prompt, output = CHAT_SHAPE if lane == "interactive" else BATCH_SHAPE
        trace.append(TraceRequest(arrival, prompt, output))
        if lane == "interactive":
            chat.add(i)
    return trace, chat


def run(trace: list[TraceRequest], chat: set[int], on: bool, seed: int) -> dict:
    lanes = (LaneConfig("interactive", weight=4.0, policy="priority", preempt_to_start=on),
             LaneConfig("batch", weight=1.0, preempt_first=True))
    live = LiveConfig(max_num_seqs=64, max_num_batched_tokens=1024, prefill_chunk_size=512,
                      lanes=lanes, default_lane="interactive", long_context_lane=None)
    clock = FakeClock()
    executor = SimulatedExecutor(clock=clock, step_cost_s=0.005, prefill_token_cost_s=5e-5,
                                 decode_token_cost_s=2e-4)
    engine = Engine(EngineConfig(StaticConfig(num_kv_blocks=NUM_KV_BLOCKS, max_model_len=2048),
                                 live), executor, clock=clock, eos_token_id=executor.eos_token_id)
    preempted: list[str] = []

    def route(i: int, item: TraceRequest) -> dict:
        return {"lane": "interactive" if i in chat else "batch"}

    def on_step(out) -> None:
        if out.record is not None:
            preempted.extend(out.record.decisions.preempted)

    result = simulate(engine, clock, trace, route=route, seed=seed, on_step=on_step)
    return summary(result, preempted)


def summary(result: SimulationResult, preempted: list[str]) -> dict:
    by_lane: dict[str, list] = {"interactive": [], "batch": []}
    for rec in result.records:
        by_lane[rec.lane].append(rec)
    chat, batch = by_lane["interactive"], by_lane["batch"]
    ttft = [r.ttft_s for r in chat if r.ttft_s is not None]
    done = [r for r in batch if r.finish_reason == "length"]
    return {
        "chat_ttft_p50_s": round(percentile(ttft, 50), 4),
        "chat_ttft_p99_s": round(percentile(ttft, 99), 4),
        "chat_done": sum(r.finish_reason == "length" for r in chat),
        "chat_timeouts": sum(r.finish_reason == "timeout" for r in chat),
        "rejected": len(result.rejected),
        "batch_done": len(done),
        "batch_makespan_s": round(max((r.finished_time - r.arrival_time for r in done),
                                      default=float("nan")), 3),
        "preemptions": len(preempted),
        "sim_seconds": round(result.sim_seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=96, help="batch requests at t=0")
    parser.add_argument("--interactive", type=int, default=150, help="interactive arrivals")
    parser.add_argument("--smoke", action="store_true", help=f"tiny: {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.batch, args.interactive = (SMOKE["seeds"], SMOKE["batch"],
                                                    SMOKE["interactive"])
    print(f"lane_preemption: {args.batch} batch requests {BATCH_SHAPE} at t=0,"
          f" {args.interactive} interactive {CHAT_SHAPE} at {CHAT_RATE:g}/s (Poisson),"
          f" KV {NUM_KV_BLOCKS} blocks x 16; preempt_to_start on vs off, {args.seeds} seeds",
          flush=True)
    rows = []
    for seed in range(args.seeds):
        trace, chat = workload(seed, args.batch, args.interactive)
        on, off = run(trace, chat, True, seed), run(trace, chat, False, seed)
        ttft_ratio = off["chat_ttft_p99_s"] / on["chat_ttft_p99_s"]
        makespan_ratio = on["batch_makespan_s"] / off["batch_makespan_s"]
        rows.append({"seed": seed, "on": on, "off": off,
                     "ttft_p99_off_over_on": round(ttft_ratio, 2),
                     "batch_makespan_on_over_off": round(makespan_ratio, 3)})
        print(f"seed {seed}: TTFT p99 on {on['chat_ttft_p99_s']:.3f}s off"
              f" {off['chat_ttft_p99_s']:.3f}s (x{ttft_ratio:.1f}); batch done"
              f" {on['batch_done']}/{off['batch_done']} of {args.batch}, makespan on/off"
              f" {makespan_ratio:.3f}; preemptions {on['preemptions']}/{off['preemptions']};"
              f" rejected {on['rejected']}/{off['rejected']}", flush=True)
    ttft = [r["ttft_p99_off_over_on"] for r in rows]
    makespan = [r["batch_makespan_on_over_off"] for r in rows]
    print(json.dumps({
        "bench": "lane_preemption", "smoke": args.smoke, "seeds": args.seeds,
        "batch": args.batch, "interactive": args.interactive,
        "ttft_p99_off_over_on": {"median": statistics.median(ttft), "min": min(ttft),
                                 "max": max(ttft)},
        "batch_makespan_on_over_off": {"median": statistics.median(makespan),
                                       "min": min(makespan), "max": max(makespan)},
        "runs": rows,
    }))


if __name__ == "__main__":
    main()
