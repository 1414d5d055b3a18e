"""Engine CPU time per step on the simulated executor: the measurement behind
`python -m bench.scheduler_overhead`, in a file of its own so that `--against REF` can run
the very same code against another tree.

It imports only engine APIs that exist both before and after the issue-16 refactor
(Engine, the four config dataclasses, SamplingParams, the simulated executor,
Engine.step/add_request/stats), and nothing from bench/: scheduler_overhead copies this file
into a temporary folder and runs it there with PYTHONPATH=<tree>, so `engine` can only come
from that tree. As a script it prints one JSON line:

    python step_cost.py --sizes 1,16 --steps 200   # {"decode": {"1": µs, ...}, "arrivals": ...}
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from engine.config import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams

try:  # engine/sim/executor.py since the issue-16 move; engine/sim_executor.py before it
    from engine.sim.executor import SimulatedExecutor  # (0237bc9): --against runs both trees
except ImportError:
    from engine.sim_executor import SimulatedExecutor

LANES = (LaneConfig("interactive", 4.0, policy="priority"), LaneConfig("long_context", 2.0),
         LaneConfig("batch", 1.0, preempt_first=True, tenant_fair_share=True))


class TimedExecutor(SimulatedExecutor):
    """The simulated executor, timing its own calls: the engine's time per step is the
    step's wall time minus this, whatever the engine records about itself."""

    def __init__(self, **kwargs) -> None:
        # NOTE: the shadow KV (a test aid) touches every context token each step and slows
        # the engine's own time too (cache effects): off here; older trees lack the field.
        if "shadow_kv" in getattr(SimulatedExecutor, "__dataclass_fields__", {}):
            kwargs.setdefault("shadow_kv", False)
        super().__init__(**kwargs)
        self.last_s = 0.0  # seconds spent in execute() since the driver last reset it
        self.calls = 0

    def execute(self, *args, **kwargs):
        started = time.perf_counter()
        sampled = super().execute(*args, **kwargs)
        self.last_s += time.perf_counter() - started
        self.calls += 1
        return sampled


def build_engine(max_num_seqs: int, batching: str = "continuous", blocks: int = 65536,
                 executor: TimedExecutor | None = None) -> Engine:
    """Three lanes (weights 4/2/1, one with tenant fair share), block size 16, budgets large
    enough that only max_num_seqs limits a step, timeouts that never fire."""
    live = LiveConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                      prefill_chunk_size=2048, batching=batching, lanes=LANES,
                      max_waiting_requests=100_000, queue_timeout_ms=10**9)
    static = StaticConfig(block_size=16, num_kv_blocks=blocks, max_model_len=32768)
    return Engine(EngineConfig(static, live), executor or TimedExecutor(), eos_token_id=2)


def add_random(engine: Engine, rid: str, rng: random.Random, prompt: int, out: int) -> None:
    """One request of `prompt` random tokens and exactly `out` output tokens, in a random
    lane, tenant a-d, priority 0-2."""
    lane = rng.choice(("interactive", "long_context", "batch"))
    engine.add_request(rid, [rng.randrange(3, 32000) for _ in range(prompt)],
                       SamplingParams(max_tokens=out, ignore_eos=True), lane=lane,
                       tenant=rng.choice("abcd"), priority=rng.randrange(3))


def us_per_step(n: int, arrivals: bool, steps: int = 200, seed: int = 0,
                kv_events: bool = False) -> float:
    """Median engine time per step (µs) with n running sequences of 32-token prompts,
    executor time excluded. arrivals=False: all n decode for the whole run; True: outputs
    of 1..63 tokens, so requests finish every step and are replaced (they prefill).
    `kv_events`: the block manager publishes KV events (a fleet's precise routing)."""
    rng = random.Random(seed)
    executor = TimedExecutor()
    engine = build_engine(max_num_seqs=max(n, 1), executor=executor)
    if kv_events:  # imported here: --against runs this file on trees without it
        from engine.kv.events import KVEventLog

        engine.block_manager.publish_events(KVEventLog())
    life = 64 if arrivals else 30_000
    for i in range(n):
        add_random(engine, f"w{i}", rng, 32, rng.randrange(1, life) if arrivals else life)
    while engine.stats()["waiting"]:  # warm up: everyone admitted and decoding
        engine.step()
    samples, next_id = [], n
    for _ in range(steps):
        if arrivals:
            unfinished = engine.stats()
            for _ in range(n - unfinished["running"] - unfinished["waiting"]):
                add_random(engine, f"w{next_id}", rng, 32, rng.randrange(1, life))
                next_id += 1
        executor.last_s = 0.0
        started = time.perf_counter()
        engine.step()
        samples.append((time.perf_counter() - started - executor.last_s) * 1e6)
    if n and not executor.calls:  # the engine stopped calling execute(): fail, not mismeasure
        raise RuntimeError("the engine never called SimulatedExecutor.execute")
    return statistics.median(samples)


def main_worker() -> None:
    """Run by scheduler_overhead --against in a subprocess: one JSON line of medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,16,64,256,512")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(json.dumps({mode: {str(n): us_per_step(n, mode == "arrivals", args.steps, args.seed)
                             for n in sizes} for mode in ("decode", "arrivals")}))


if __name__ == "__main__":
    main_worker()
