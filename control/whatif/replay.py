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

import heapq
import statistics
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from control.whatif.calibrate import StepTimeModel
from control.whatif.window import RecordedRequest, Window
from engine.config import EngineConfig
from engine.engine import Engine
from engine.records import RequestRecord, SchedulerOutput
from engine.request import SamplingParams
from engine.sim.executor import FakeClock

TOKEN_SPAN = 1 << 24  # synthetic token ids per request (prompts are unique ranges)
IDLE_TICK_S = 0.001  # a step that could run nothing: let time (and timeouts) move on
# NOTE: recorded times and the replay's clock sums differ in the last bits: an event due
# within this of now is due (else a cancel recorded between two steps lands one late)
DUE_SLACK_S = 1e-6


@dataclass
class ModelledExecutor:
    """Advances the clock by the fitted time of each step; samples token 7 (every replayed
    request ignores EOS). Records the largest step and how many lay beyond the fit."""

    model: StepTimeModel
    clock: FakeClock
    steps: int = 0
    beyond_seen: int = 0
    largest: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0, 0.0)

    def execute(self, out: SchedulerOutput) -> list[int]:
        context = sum(r.num_computed_tokens + 1 for r in out.decodes)
        row = (1.0, out.num_prefill_tokens, out.num_decode_tokens, context, out.num_seqs)
        self.steps += 1
        self.beyond_seen += self.model.beyond_seen(row)
        self.largest = tuple(max(a, b) for a, b in zip(self.largest, row, strict=True))
        self.clock.advance(self.model.step_s(*row[1:]))
        return [7] * len(out.sample_requests())


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


def replay(window: Window, config: EngineConfig, model: StepTimeModel, label: str = "",
           progress: bool = False) -> Prediction:
    """Deterministic: the same window, config and model give the same prediction."""
    started = time.perf_counter()
    clock = FakeClock(window.since)
    executor = ModelledExecutor(model, clock)
    engine = Engine(config, executor, clock=clock)
    reqs = window.requests
    lengths = output_lengths(reqs, config.static.max_model_len)
    entries = sorted((r.arrival_time + r.tokenize_s, i) for i, r in enumerate(reqs))
    cancels = [(r.finished_time, i) for i, r in enumerate(reqs)
               if r.outcome == "cancelled" and r.finished_time is not None]
    heapq.heapify(cancels)
    lanes, tenants = set(config.live.lane_names), {}
    records: list[RequestRecord] = []
    kv_peak = preempted = 0
    nxt = 0
    bar = tqdm(total=len(reqs), desc=f"whatif {label}".strip(), unit="req",
               disable=not progress)
    while nxt < len(entries) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            clock.now = max(clock.now, entries[nxt][0])
        while nxt < len(entries) and entries[nxt][0] <= clock.now + DUE_SLACK_S:
            i = entries[nxt][1]
            r = reqs[i]
            engine.add_request(
                f"w{i}", _prompt(i, r, tenants),
                SamplingParams(max_tokens=lengths[i], temperature=0.0, ignore_eos=True),
                tenant=r.tenant, lane=r.lane if r.lane in lanes else None,
                priority=r.priority, deadline=r.deadline, arrival_time=r.arrival_time)
            nxt += 1
        while cancels and cancels[0][0] <= clock.now + DUE_SLACK_S:
            engine.abort(f"w{heapq.heappop(cancels)[1]}")
        out = engine.step()
        if out.record is not None:
            kv_peak = max(kv_peak, out.record.kv_blocks_used)
            preempted += len(out.record.stats.preempted)
            clock.advance(model.gap_s if out.record.tokens_used else IDLE_TICK_S)
        records.extend(out.finished)
        bar.update(len(out.finished))
    bar.close()
    order = {f"w{i}": i for i in range(len(reqs))}
    records.sort(key=lambda rec: order[rec.request_id])
    largest = dict(zip(("prefill_tokens", "decode_tokens", "decode_context_tokens",
                        "num_seqs"), executor.largest[1:], strict=True))
    return Prediction(label, records, executor.steps, config.static.num_kv_blocks, kv_peak,
                      preempted, clock.now - window.since, executor.beyond_seen, largest,
                      time.perf_counter() - started)
