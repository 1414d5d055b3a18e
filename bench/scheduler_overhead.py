"""Scheduler CPU time per step, and continuous vs static batching in steps.

Part 1: the engine's own time per step (expire + schedule + update + StepRecord; the
simulated executor's time is taken out) with 1..512 running sequences, lanes, fair share,
watermarks and StepRecords on. "decode" keeps N sequences decoding; "arrivals" keeps N
running while requests finish and new ones arrive and prefill every step.

Part 2: steps to finish the same requests with continuous vs static (request-level)
batching, output lengths from the Azure 2023 conversation trace, 1-token prompts so
steps count decode work only. Theory: static needs sum over batches of the batch's
longest output; continuous at best ceil(sum of outputs / max_num_seqs). The share of
theory is the measured ratio over that ideal ratio.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import time

from engine.config import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim.executor import SimulatedExecutor
from engine.sim.workload import TraceScale, load_trace

LANES = (LaneConfig("interactive", 4.0, policy="priority"), LaneConfig("long_context", 2.0),
         LaneConfig("batch", 1.0, preempt_first=True, tenant_fair_share=True))


def _engine(max_num_seqs: int, batching: str = "continuous", blocks: int = 65536) -> Engine:
    live = LiveConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                      prefill_chunk_size=2048, batching=batching, lanes=LANES,
                      max_waiting_requests=100_000, queue_timeout_ms=10**9)
    static = StaticConfig(block_size=16, num_kv_blocks=blocks, max_model_len=32768)
    return Engine(EngineConfig(static, live), SimulatedExecutor(), eos_token_id=2)


def _add(engine: Engine, rid: str, rng: random.Random, prompt: int, out: int) -> None:
    lane = rng.choice(("interactive", "long_context", "batch"))
    engine.add_request(rid, [rng.randrange(3, 32000) for _ in range(prompt)],
                       SamplingParams(max_tokens=out, ignore_eos=True), lane=lane,
                       tenant=rng.choice("abcd"), priority=rng.randrange(3))


def us_per_step(n: int, arrivals: bool, steps: int = 200, seed: int = 0) -> float:
    """Median engine time per step (µs) at n running sequences, executor time excluded."""
    rng = random.Random(seed)
    engine = _engine(max_num_seqs=max(n, 1))
    life = 64 if arrivals else 30_000  # with arrivals, requests finish and are replaced
    for i in range(n):
        _add(engine, f"w{i}", rng, 32, rng.randrange(1, life) if arrivals else life)
    while engine.scheduler.lanes.num_waiting:  # warm up: everyone admitted and decoding
        engine.step()
    samples, next_id = [], n
    for _ in range(steps):
        if arrivals:
            while len(engine.requests) < n:
                _add(engine, f"w{next_id}", rng, 32, rng.randrange(1, life))
                next_id += 1
        t0 = time.perf_counter()
        out = engine.step()
        elapsed = time.perf_counter() - t0 - out.record.execute_s
        samples.append(elapsed * 1e6)
    return statistics.median(samples)


def steps_to_finish(outputs: list[int], batching: str, max_num_seqs: int) -> int:
    engine = _engine(max_num_seqs, batching=batching)
    for i, out in enumerate(outputs):
        engine.add_request(f"r{i}", [7], SamplingParams(max_tokens=out, ignore_eos=True),
                           lane="batch")
    return len(engine.run_until_done())


def cont_vs_static(num_requests: int, max_num_seqs: int) -> dict[str, float]:
    outputs = [r.output_tokens for r in load_trace(limit=num_requests, scale=TraceScale())]
    static_theory = sum(max(outputs[i:i + max_num_seqs])
                        for i in range(0, len(outputs), max_num_seqs))
    cont_theory = math.ceil(sum(outputs) / max_num_seqs)
    measured = {m: steps_to_finish(outputs, m, max_num_seqs) for m in ("static", "continuous")}
    ratio = measured["static"] / measured["continuous"]
    theory = static_theory / cont_theory
    return {"static_steps": measured["static"], "continuous_steps": measured["continuous"],
            "static_theory": static_theory, "continuous_theory": cont_theory,
            "ratio": ratio, "theory_ratio": theory, "share_of_theory": ratio / theory}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,16,64,256,512")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; simulated executor (zero model cost)")
    print(f"{'running':>8} {'decode us/step':>15} {'arrivals us/step':>17} {'us/seq':>8}")
    decode, mixed = {}, {}
    for n in sizes:
        decode[n] = us_per_step(n, arrivals=False, steps=args.steps)
        mixed[n] = us_per_step(n, arrivals=True, steps=args.steps)
        print(f"{n:>8} {decode[n]:>15.1f} {mixed[n]:>17.1f} {decode[n] / n:>8.2f}")
    cvs = cont_vs_static(args.requests, args.max_num_seqs)
    print(f"continuous vs static on {args.requests} trace output lengths, max_num_seqs="
          f"{args.max_num_seqs}: static {cvs['static_steps']} steps (theory "
          f"{cvs['static_theory']}), continuous {cvs['continuous_steps']} (ideal "
          f"{cvs['continuous_theory']}); ratio {cvs['ratio']:.2f} vs {cvs['theory_ratio']:.2f}"
          f" in theory = {cvs['share_of_theory']:.1%}")
    print(json.dumps({
        "us_per_step": {str(n): round(v, 1) for n, v in decode.items()},
        "us_per_step_with_arrivals": {str(n): round(v, 1) for n, v in mixed.items()},
        "cont_vs_static": round(cvs["ratio"], 3),
        "share_of_theory": round(cvs["share_of_theory"], 3),
    }))


if __name__ == "__main__":
    main()
