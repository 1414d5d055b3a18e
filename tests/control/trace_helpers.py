"""A small recorded trace for tests: a simulated engine run (no model) written to DuckDB.

    writer = fill_trace(path)   # 8 requests (one cancelled, one too long), a config change
"""

from __future__ import annotations

from control.observer import Observer
from control.trace.writer import TraceSettings, TraceWriter
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim_executor import FakeClock, SimulatedExecutor


def fill_trace(path: str) -> TraceWriter:
    """Run a small simulated workload into a trace at `path`; the writer stays started."""
    clock = FakeClock()
    engine = Engine(EngineConfig(
        StaticConfig(num_kv_blocks=40, block_size=16, max_model_len=1024),
        LiveConfig(max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk_size=64)),
        SimulatedExecutor(clock=clock, step_cost_s=0.01, eos_every=20), clock=clock)
    writer = TraceWriter(TraceSettings(path), "run1", "tiny").start()
    observer = Observer(None, writer, kv_snapshot_every=5)

    def add(i: int) -> None:  # distinct prompts: no prefix-cache hits across requests
        engine.add_request(f"r{i}", list(range(1000 * i + 3, 1000 * i + 100 + i * 20)),
                           SamplingParams(max_tokens=60), tenant="acme" if i % 2 else "zeta")

    for i in range(6):
        add(i)
    engine.add_request("big", list(range(3, 1100)), SamplingParams(max_tokens=10))
    steps = 0
    while engine.has_unfinished_requests():
        observer.on_step(engine, engine.step())
        steps += 1
        if steps == 3:
            engine.abort("r5")  # still queued: cancelled
        elif steps == 10:
            add(6)
            add(7)
        elif steps == 20:
            live = engine.update_config(engine.live_config.replace(max_num_seqs=3))
            writer.submit_config_change(clock(), live.version, "test", "tester",
                                        {"max_num_seqs": [4, 3]})
    assert writer.sync(10)
    return writer
