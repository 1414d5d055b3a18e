"""Replay a trace through an engine on simulated time (a FakeClock the executor advances).

Requests arrive at their trace times; while the engine is idle the clock jumps to the
next arrival. Used by the demo and the benchmarks; deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from engine.engine import Engine
from engine.records import AdmissionDecision, RequestRecord, StepOutput
from engine.sim.executor import FakeClock
from engine.sim.workload import TraceRequest, forced_params, iter_due, synthetic_prompt


@dataclass
class SimulationResult:
    records: list[RequestRecord] = field(default_factory=list)
    rejected: list[AdmissionDecision] = field(default_factory=list)
    steps: int = 0
    sim_seconds: float = 0.0
    output_tokens: int = 0


Router = Callable[[int, TraceRequest], dict]  # -> add_request keyword arguments


def simulate(engine: Engine, clock: FakeClock, trace: list[TraceRequest],
             route: Router | None = None, seed: int = 0, progress: bool = False,
             on_step: Callable[[StepOutput], None] | None = None) -> SimulationResult:
    rng = random.Random(seed)
    result = SimulationResult()
    start = clock.now
    next_index = 0
    bar = tqdm(total=len(trace), desc="simulating", unit="req", disable=not progress)
    while next_index < len(trace) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and next_index < len(trace):
            clock.now = max(clock.now, start + trace[next_index].arrival_s)
        for i, item in list(iter_due(trace, next_index, clock.now - start)):
            next_index = i + 1
            kwargs = route(i, item) if route else {}
            decision = engine.add_request(
                f"req-{i}", synthetic_prompt(item.prompt_tokens, rng),
                forced_params(item.output_tokens), arrival_time=start + item.arrival_s,
                **kwargs)
            if not decision.accepted:
                result.rejected.append(decision)
                bar.update(1)
        out = engine.step()
        if out.record is not None:
            if out.record.tokens_used == 0:
                clock.advance(0.001)  # nothing could run: let time (and timeouts) move on
            result.steps += 1
            result.output_tokens += sum(len(d.new_token_ids) for d in out.deltas)
        finished = [r for r in out.finished if r.status != "REJECTED"]
        result.records.extend(finished)
        bar.update(len(finished))
        if on_step is not None:
            on_step(out)
    bar.close()
    result.sim_seconds = clock.now - start
    return result
