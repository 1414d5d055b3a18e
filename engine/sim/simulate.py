"""Replay a trace through an engine on simulated time (a FakeClock the executor advances).

Requests arrive at their trace times; while the engine is idle the clock jumps to the
next arrival. With `retry`, a refused request comes back as its client would send it again
(`retry(decision, sends so far)`: seconds until the next send, or None: the refusal
stands): the new send is request `req-{i}.{n}`, and `first_arrival` keeps when its first
send arrived (what its user waits from). Used by the demo and the benchmarks;
deterministic for a given seed.
"""

from __future__ import annotations

import heapq
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
    rejected: list[AdmissionDecision] = field(default_factory=list)  # final refusals
    retried: list[AdmissionDecision] = field(default_factory=list)  # refusals sent again
    first_arrival: dict[str, float] = field(default_factory=dict)  # resent id -> first send
    steps: int = 0
    sim_seconds: float = 0.0
    output_tokens: int = 0


Router = Callable[[int, TraceRequest], dict]  # -> add_request keyword arguments
Retry = Callable[[AdmissionDecision, int], float | None]  # (refusal, sends) -> delay or None


@dataclass(order=True)
class _Send:
    at: float  # engine clock
    index: int  # in the trace (whose arrival time is the first send's)
    sends: int = 1  # this one included


def simulate(engine: Engine, clock: FakeClock, trace: list[TraceRequest],
             route: Router | None = None, seed: int = 0, progress: bool = False,
             on_step: Callable[[StepOutput], None] | None = None,
             retry: Retry | None = None) -> SimulationResult:
    rng = random.Random(seed)
    result = SimulationResult()
    start = clock.now
    next_index = 0
    resends: list[_Send] = []  # a heap by time
    bar = tqdm(total=len(trace), desc="simulating", unit="req", disable=not progress)
    while next_index < len(trace) or resends or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            due = [start + trace[next_index].arrival_s] if next_index < len(trace) else []
            clock.now = max(clock.now, min(due + [s.at for s in resends[:1]]))
        sends = []
        for i, _ in list(iter_due(trace, next_index, clock.now - start)):
            next_index = i + 1
            sends.append(_Send(start + trace[i].arrival_s, i))
        while resends and resends[0].at <= clock.now + 1e-9:
            sends.append(heapq.heappop(resends))
        for send in sends:
            decision = _add(engine, trace, send, route, rng)
            if send.sends > 1:
                result.first_arrival[decision.request_id] = start + trace[send.index].arrival_s
            if decision.accepted:
                continue
            delay = retry(decision, send.sends) if retry is not None else None
            if delay is None:
                result.rejected.append(decision)
                bar.update(1)
            else:
                result.retried.append(decision)
                heapq.heappush(resends, _Send(clock.now + delay, send.index, send.sends + 1))
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


def _add(engine: Engine, trace: list[TraceRequest], send: _Send, route: Router | None,
         rng: random.Random) -> AdmissionDecision:
    item = trace[send.index]
    kwargs = route(send.index, item) if route else {}
    rid = f"req-{send.index}" if send.sends == 1 else f"req-{send.index}.{send.sends - 1}"
    return engine.add_request(rid, synthetic_prompt(item.prompt_tokens, rng),
                              forced_params(item.output_tokens), arrival_time=send.at,
                              resent=send.sends > 1, **kwargs)
