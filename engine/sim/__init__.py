"""Simulation: the real Scheduler and BlockManager on a virtual clock, without a model.

    executor.py  SimulatedExecutor (tokens from a cost model, no weights) and FakeClock
    shadow_kv.py the executor's shadow KV: each step's slots written and read back
    step_cost.py CpuLikeStepCost: step times shaped like the CPU engine's (attention, noise)
    simulate.py  replay timed arrivals through an Engine on the virtual clock
    workload.py  the bundled Azure LLM 2023 trace (data/) and synthetic prompts
    stats.py     percentiles and per-lane latency tables of finished requests
    faults.py    FaultyExecutor: fails chosen steps (by step, request or batch) for tests
"""
