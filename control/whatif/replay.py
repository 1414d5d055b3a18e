"""Replay a window's recorded requests through the real Engine (its Scheduler, BlockManager,
admission and timeouts) on a virtual clock advanced by the fitted step time.

    prediction = replay(window, config, model)   # -> Prediction: records, KV peak, ...

What the trace cannot know is assumed, the same way for every config (docs/whatif.md):
- lengths: a request that ended on its own (stop, length, error) produces exactly its
  recorded output (ignore_eos, max_tokens = that length). One the client cancelled is
  cancelled at its recorded time if still unfinished; it wanted more than it had got
  then: it asks for the median output of its lane's finished requests, and at least one
  token more than it had (so the recorded config reproduces the cancel, and a faster one
  shows the tokens it would have delivered by then). One that timed out or was rejected
  never showed its length: it asks for that median too (at least what it had produced); a
  `too_long` rejection asks for enough to be too long again.
- arrival: at its recorded arrival; it reaches the engine after its recorded tokenize time.
  Lane, tenant, priority and deadline as recorded; a lane the proposed config removes:
  routed as the server would route it.
- prefix cache: a request that found c cached prompt tokens shares its first c tokens with
  the other hits of its tenant (one synthetic prefix per tenant); the first of them in the
  window computes it (the window starts cold). Other prompts are unique.
- the engine starts empty at the window's start: requests still running from before it
  are not replayed (EngineFacts.running_at_start says how many there were).
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from control.whatif.calibrate import FEATURES, StepTimeModel
from control.whatif.lean import LeanExecutor, ReplayEngine, ReplayStep
from control.whatif.window import RecordedRequest, Window
from engine.calibration.step_law import StepLaw
from engine.config import EngineConfig
from engine.engine import Engine
from engine.records import RequestRecord
from engine.request import SamplingParams
from engine.sim.executor import FakeClock

TOKEN_SPAN = 1 << 24  # synthetic token ids per request (prompts are unique ranges)
IDLE_TICK_S = 0.001  # a step that could run nothing: let time (and timeouts) move on
# NOTE: recorded times and the replay's clock sums differ in the last bits: an event due
# within this of now is due (else a cancel recorded between two steps lands one late)
DUE_SLACK_S = 1e-6


@dataclass
class Prediction:
    label: str
    records: list[RequestRecord]  # every replayed request, rejected ones included
    steps: int
    kv_total_blocks: int
    kv_peak_blocks: int
    preempted: int
    sim_seconds: float
    beyond_seen_steps: int  # steps larger than any the step-time law was fitted on
    largest_step: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


def output_lengths(requests: list[RecordedRequest], max_model_len: int) -> list[int]:
    """max_tokens of each replayed request (see the module docstring)."""
    done: dict[str, list[int]] = {}
    for r in requests:
        if r.outcome == "finished":
            done.setdefault(r.lane, []).append(r.num_output_tokens)
    every = [n for lane in done.values() for n in lane] or [16]
    out = []
    for r in requests:
        if r.outcome in ("finished", "error"):
            out.append(max(r.num_output_tokens, 1))
        elif r.outcome == "cancelled":  # it wanted more than it got when cancelled
            median = int(statistics.median(done.get(r.lane) or every))
            out.append(max(median, r.num_output_tokens + 1))
        elif r.finish_detail == "too_long":
            out.append(max(max_model_len - r.num_prompt_tokens + 1, 1))
        else:
            median = int(statistics.median(done.get(r.lane) or every))
            out.append(max(median, r.num_output_tokens, 1))
    return out


def _prompt(i: int, r: RecordedRequest, tenants: dict[str, int]) -> list[int]:
    """Unique tokens, the first num_cached_tokens of them the tenant's shared prefix."""
    shared = min(r.num_cached_tokens, r.num_prompt_tokens)
    prefix_base = -(tenants.setdefault(r.tenant, len(tenants)) + 1) * TOKEN_SPAN
    base = (i + 1) * TOKEN_SPAN
    return (list(range(prefix_base, prefix_base + shared))
            + list(range(base + shared, base + r.num_prompt_tokens)))


def replay_plan(window: Window, config: EngineConfig
                ) -> tuple[list[int], list[tuple[float, int]], list[tuple[float, int]]]:
    """What every replay of the window follows: each request's max_tokens, when each
    reaches the engine ((arrival + tokenize time, index), in order) and when a cancelled
    one is cancelled ((recorded end, index), a heap)."""
    reqs = window.requests
    entries = sorted((r.arrival_time + r.tokenize_s, i) for i, r in enumerate(reqs))
    cancels = [(r.finished_time, i) for i, r in enumerate(reqs)
               if r.outcome == "cancelled" and r.finished_time is not None]
    heapq.heapify(cancels)
    return output_lengths(reqs, config.static.max_model_len), entries, cancels


def add_recorded(engine: Engine, i: int, r: RecordedRequest, prompt: list[int],
                 max_tokens: int, lanes: set[str]) -> None:
    """Recorded request `i` into the replaying engine as `w{i}`: its recorded lane (the
    engine routes it when the config lacks that lane), tenant, priority, deadline,
    arrival and whether it was a client's resend; `max_tokens` forced (ignore_eos)."""
    engine.add_request(
        f"w{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                        ignore_eos=True),
        tenant=r.tenant, lane=r.lane if r.lane in lanes else None, priority=r.priority,
        deadline=r.deadline, arrival_time=r.arrival_time, resent=r.resent)


class _Preempted(Exception):
    """A replay without prefix caching preempted: the recompute could hit its own blocks."""


def replay(window: Window, config: EngineConfig, model: StepTimeModel, label: str = "",
           progress: bool = False, *, lean: bool = True) -> Prediction:
    """Deterministic: the same window, config and model give the same prediction.
    `lean=False` steps through `Engine.step` (telemetry and all): the same result, slower.
    """
    started = time.perf_counter()
    # NOTE: a replay makes ~10^2 short-lived objects a step and no garbage cycles; the cyclic
    # collector's passes over the window's 10^5 live objects are pure cost (about a tenth of
    # a day's replay), so it pauses while one runs
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _replay(window, config, model, label, progress, lean, started)
    finally:
        if collecting:
            gc.enable()


def _replay(window: Window, config: EngineConfig, model: StepTimeModel, label: str,
            progress: bool, lean: bool, started: float) -> Prediction:
    if config.static.enable_prefix_caching and not any(
            r.num_cached_tokens for r in window.requests):
        # NOTE: replayed prompts are unique unless the trace shows hits, so the prefix cache
        # can only serve a preempted request its own blocks back; without a preemption a
        # replay is the same with the cache off, and skips hashing every block (a third
        # of a replay's time). At the first preemption it starts over with the cache on.
        static = dataclasses.replace(config.static, enable_prefix_caching=False)
        try:
            return _run(window, EngineConfig(static, config.live), model, label, progress,
                        lean, started, stop_on_preempt=True)
        except _Preempted:
            pass
    return _run(window, config, model, label, progress, lean, started)


def _engine(config: EngineConfig, executor: LeanExecutor, clock: FakeClock, lean: bool,
            law: StepLaw | None = None) -> tuple[Engine, Callable[[], ReplayStep]]:
    """The engine, and its step as the replay reads it (light, or through Engine.step);
    `law`: the server's start-up step law, if it had one (engine/scheduling/step_time.py)."""
    if lean:
        light = ReplayEngine(config, executor, clock=clock, step_law=law)
        return light, light.replay_step
    engine = Engine(config, executor, clock=clock, step_law=law)

    def full_step() -> ReplayStep:
        out = engine.step()
        rec = out.record
        if rec is None:
            return ReplayStep(False, 0, 0, 0, out.finished)
        return ReplayStep(True, rec.tokens_used, len(rec.decisions.preempted),
                          rec.kv_blocks_used, out.finished)

    return engine, full_step


def _run(window: Window, config: EngineConfig, model: StepTimeModel, label: str,
         progress: bool, lean: bool, started: float, stop_on_preempt: bool = False,
         ) -> Prediction:
    clock = FakeClock(window.since)
    executor = LeanExecutor(model, clock)
    engine, step = _engine(config, executor, clock, lean, window.step_law)
    reqs = window.requests
    lengths, entries, cancels = replay_plan(window, config)
    lanes, tenants = set(config.live.lane_names), {}
    records: list[RequestRecord] = []
    kv_peak = preempted = nxt = 0
    gap_s = model.gap_s
    bar = tqdm(total=len(reqs), desc=f"whatif {label}".strip(), unit="req",
               disable=not progress)
    busy = engine.has_unfinished_requests
    while nxt < len(entries) or busy():
        if not busy():
            clock.now = max(clock.now, entries[nxt][0])
        due = clock.now + DUE_SLACK_S
        while nxt < len(entries) and entries[nxt][0] <= due:
            i = entries[nxt][1]
            r = reqs[i]
            add_recorded(engine, i, r, _prompt(i, r, tenants), lengths[i], lanes)
            nxt += 1
        while cancels and cancels[0][0] <= due:
            engine.abort(f"w{heapq.heappop(cancels)[1]}")
        done = step()
        if done.ran:
            kv_peak = max(kv_peak, done.kv_used)
            if done.preempted and stop_on_preempt:
                bar.close()
                raise _Preempted
            preempted += done.preempted
            clock.now += gap_s if done.tokens else IDLE_TICK_S
        records.extend(done.finished)
        bar.update(len(done.finished))
    bar.close()
    order = {f"w{i}": i for i in range(len(reqs))}
    records.sort(key=lambda rec: order[rec.request_id])
    largest = dict(zip(FEATURES[1:], executor.largest[1:], strict=True))
    return Prediction(label, records, executor.steps, config.static.num_kv_blocks, kv_peak,
                      preempted, clock.now - window.since, executor.beyond_seen, largest,
                      time.perf_counter() - started)
