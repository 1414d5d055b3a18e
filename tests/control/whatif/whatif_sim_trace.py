"""Traces recorded from a simulated engine whose step time follows a known law.

    law = record(path, LiveConfig(max_num_seqs=16, ...))   # writes path; returns the law

The SimulatedExecutor advances a FakeClock by fixed + prefill * tokens + decode * tokens
per step, so the trace's steps follow that law exactly and the requests' latencies are
what that engine did: what a what-if replay of the recorded config must reproduce. With
`cost_model` (engine/sim/step_cost.py) the steps cost what a CPU step costs instead:
attention quadratic in a prompt's length, per-sequence costs, noise; not the fit's law.
Requests: seeded Poisson arrivals, prompts 20..300 tokens, outputs 4..60 (ignore_eos),
two tenants; tenant "rag" shares a 64-token prompt prefix (prefix-cache hits); or `jobs`,
a workload of the caller's in the same form.
"""

from __future__ import annotations

import random

from control.metrics.observer import Observer
from control.trace.writer import TraceSettings, TraceWriter
from engine.calibration.step_law import StepLaw
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.config.patch import apply_patch, diff
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.step_cost import CpuLikeStepCost

START = 1_700_000_000.0
LAW = (0.004, 0.0001, 0.0008)  # fixed s, s per prefill token, s per decode token
STATIC = StaticConfig(num_kv_blocks=400, block_size=16, max_model_len=2048)


def workload(n: int, rate_per_s: float, seed: int) -> list[tuple[float, int, int, str]]:
    """(arrival s from START, prompt tokens, output tokens, tenant)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        out.append((t, rng.randint(20, 300), rng.randint(4, 60), rng.choice(["chat", "rag"])))
    return out


def phased_workload(seed: int, cycles: int = 2, phase_s: float = 40.0,
                    ) -> list[tuple[float, int, int, str]]:
    """A workload whose contexts change over the window, as a day's do: `cycles` times a
    chat phase (4/s, prompts 20..300, outputs 16..100) then a documents phase (0.5/s,
    prompts 1000..1800, outputs 100..250), each `phase_s` long; Poisson arrivals, seeded.
    Tenants "chat" and "docs" (no shared prefix). Same form as `workload`."""
    rng = random.Random(seed)
    phases = ((4.0, (20, 300), (16, 100), "chat"), (0.5, (1000, 1800), (100, 250), "docs"))
    out, begin = [], 0.0
    for _ in range(cycles):
        for rate, prompts, outputs, tenant in phases:
            t = begin + rng.expovariate(rate)
            while t < begin + phase_s:
                out.append((t, rng.randint(*prompts), rng.randint(*outputs), tenant))
                t += rng.expovariate(rate)
            begin += phase_s
    return out


def record(path: str, live: LiveConfig, n: int = 150, rate_per_s: float = 8.0,
           seed: int = 0, cancel_every: int = 0, start: float = START,
           static: StaticConfig = STATIC, step_law: StepLaw | None = None,
           cost_model: CpuLikeStepCost | None = None,
           jobs: list[tuple[float, int, int, str]] | None = None,
           resent_every: int = 0,
           change_at: tuple[int, dict] | None = None) -> tuple[float, float, float]:
    """Run the workload through a simulated engine into a trace at `path` (writer
    stopped). `cancel_every`: every k-th request is aborted 0.3 s after it arrives;
    `start`: the epoch second the clock starts at (a live window: a recent one);
    `step_law`: the scheduler holds steps to static.target_step_ms by it, and the run's
    settings say so (as a server with fitted budgets writes them); `cost_model`: the steps
    cost what it says instead of LAW (engine/sim/step_cost.py: not the fit's linear law);
    `resent_every`: every k-th request is a client's resend (Engine.add_request resent);
    `change_at`: (k, live patch) applied before request k arrives, recorded as the
    control API records a change."""
    clock = FakeClock(start)
    executor = SimulatedExecutor(clock=clock, step_cost_s=LAW[0], prefill_token_cost_s=LAW[1],
                                 decode_token_cost_s=LAW[2], cost_model=cost_model,
                                 shadow_kv=False)
    engine = Engine(EngineConfig(static, live), executor, clock=clock, step_law=step_law)
    writer = TraceWriter(TraceSettings(path), "run1", "sim").start()
    if step_law is not None:
        writer.note_run(step_law=step_law.to_dict(), target_step_ms=static.target_step_ms)
    observer = Observer(None, writer, kv_snapshot_every=50)
    rng = random.Random(seed + 1)
    shared = [rng.randrange(3, 30000) for _ in range(64)]
    jobs = workload(n, rate_per_s, seed) if jobs is None else jobs
    cancels: list[tuple[float, str]] = []
    i = 0
    while i < len(jobs) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            clock.now = max(clock.now, start + jobs[i][0])
        while i < len(jobs) and start + jobs[i][0] <= clock.now:
            if change_at is not None and i == change_at[0]:
                _change(engine, writer, clock(), change_at[1])
            arrival, prompt_len, out_len, tenant = jobs[i]
            prompt = [rng.randrange(3, 30000) for _ in range(prompt_len)]
            if tenant == "rag":
                prompt = shared + prompt
            engine.add_request(f"r{i}", prompt, SamplingParams(
                max_tokens=out_len, temperature=0.0, ignore_eos=True), tenant=tenant,
                arrival_time=start + arrival,
                resent=bool(resent_every) and i % resent_every == resent_every - 1)
            if cancel_every and i % cancel_every == cancel_every - 1:
                cancels.append((start + arrival + 0.3, f"r{i}"))
            i += 1
        for when, rid in [c for c in cancels if c[0] <= clock.now]:
            engine.abort(rid)
            cancels.remove((when, rid))
        out = engine.step()
        observer.on_step(engine, out)
        if out.record is not None and out.record.tokens_used == 0:
            clock.advance(0.001)
    assert writer.sync(30)
    observer.stop()
    writer.stop()
    return LAW


def _change(engine: Engine, writer: TraceWriter, now: float, patch: dict) -> None:
    before = engine.live_config
    after = engine.update_config(apply_patch(before, engine.static, patch))
    writer.submit_config_change(now, after.version, "api", "tester", diff(before, after))


def read_trace_window(path: str, since: float | None = None, until: float | None = None):
    """The trace at `path` (whole, or [since, until]) as a what-if Window
    (control/whatif/window.py)."""
    from control.trace.store import open_read_only
    from control.whatif.window import read_window

    con = open_read_only(path)
    try:
        return read_window(con, since, until)
    finally:
        con.close()
