"""Helpers for the engine-core tests: build a simulated engine, drive it step by step and
check, after every step, what a user of the engine relies on:

- the step stayed within the budgets of the config version it ran under;
- `check_integrity()` holds (no block leaked or owned twice);
- every accepted request ends exactly once (one finishing delta, nothing after it, one
  RequestRecord), with the tokens an undisturbed run would have produced.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from engine.config import EngineConfig, LaneConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.records import AdmissionDecision, RequestRecord, StepOutput
from engine.request import Request, RequestStatus, SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor

EOS = 2
START_TIME = 1_000.0


def make_engine(live: LiveConfig | None = None, *, block_size: int = 16,
                num_kv_blocks: int = 256, max_model_len: int = 2048,
                enable_prefix_caching: bool = True, eos_every: int | None = None,
                step_cost_s: float = 0.0, prefill_token_cost_s: float = 0.0,
                decode_token_cost_s: float = 0.0) -> tuple[Engine, FakeClock]:
    """An engine over the simulated executor; executor costs advance the fake clock."""
    clock = FakeClock(START_TIME)
    executor = SimulatedExecutor(eos_token_id=EOS, eos_every=eos_every, step_cost_s=step_cost_s,
                                 prefill_token_cost_s=prefill_token_cost_s,
                                 decode_token_cost_s=decode_token_cost_s, clock=clock)
    static = StaticConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                          max_model_len=max_model_len,
                          enable_prefix_caching=enable_prefix_caching)
    if live is None:
        live = LiveConfig(max_num_seqs=min(64, num_kv_blocks),
                          prefill_chunk_size=min(512, max_model_len))
    engine = Engine(EngineConfig(static, live), executor, clock=clock, eos_token_id=EOS)
    return engine, clock


def lanes(*specs: LaneConfig) -> tuple[LaneConfig, ...]:
    return tuple(specs)


def live_config(lane_configs: tuple[LaneConfig, ...] | None = None, **changes) -> LiveConfig:
    """A LiveConfig without the long-context routing unless the lanes include it."""
    if lane_configs is not None:
        names = [lane.name for lane in lane_configs]
        changes.setdefault("lanes", lane_configs)
        changes.setdefault("default_lane", names[0])
        changes.setdefault("long_context_lane",
                           "long_context" if "long_context" in names else None)
    return LiveConfig(**changes)


def prompt(seed: int, length: int) -> list[int]:
    """Distinct, deterministic prompt tokens (ids >= 3: below are special)."""
    return [3 + (seed * 7919 + i * 104_729) % 30_000 for i in range(length)]


def reference_output(prompt_ids: list[int], params: SamplingParams,
                     executor: SimulatedExecutor | None = None) -> list[int]:
    """What the simulated executor produces for this request run alone, start to end."""
    executor = executor or SimulatedExecutor(eos_token_id=EOS)
    req = Request("ref", list(prompt_ids), params, 0.0, eos_token_id=EOS)
    while True:
        token = executor.next_token(req)
        req.token_ids.append(token)
        if not params.ignore_eos and token == EOS or token in params.stop_token_ids:
            break
        if req.num_output_tokens >= params.max_tokens:
            break
    return req.output_token_ids


@dataclass
class RequestLog:
    prompt: list[int]
    params: SamplingParams
    lane: str
    tokens: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # engine clock when delivered
    finish_reason: str | None = None
    record: RequestRecord | None = None


class Driver:
    """Drives an engine and checks the per-step and per-request contracts as it goes."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.configs: dict[int, LiveConfig] = {engine.live_config.version: engine.live_config}
        self.logs: dict[str, RequestLog] = {}  # accepted requests
        self.decisions: dict[str, AdmissionDecision] = {}
        self.record_counts: Counter[str] = Counter()
        self.outputs: list[StepOutput] = []
        self.allow_step_failures = False  # else a failed (contained) step fails the test
        # KV events (when the engine publishes them): a reader's mirror of the findable
        # blocks, which must equal the pool's after every step
        self.kv_seq, self.kv_mirror = 0, set(engine.block_manager.cached_keys())
        self.kv_snapshots = 0
        self.kv_read_every = 1  # steps between two reads (a slow reader: > 1)

    # ---- actions ---------------------------------------------------------------------
    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None,
            **kwargs) -> AdmissionDecision:
        params = params or SamplingParams(max_tokens=8, ignore_eos=True)
        decision = self.engine.add_request(request_id, prompt_ids, params, **kwargs)
        self.decisions[request_id] = decision
        if decision.accepted:
            assert request_id not in self.logs, f"{request_id} accepted twice"
            self.logs[request_id] = RequestLog(list(prompt_ids), params, decision.lane)
        return decision

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def update_config(self, live: LiveConfig, lane_moves: dict[str, str] | None = None,
                      ) -> LiveConfig:
        installed = self.engine.update_config(live, lane_moves)
        self.configs[installed.version] = installed
        return installed

    def step(self) -> StepOutput:
        out = self.engine.step()
        assert out.failure is None or self.allow_step_failures, out.failure
        self.engine.check_integrity()
        self._check_kv_events()
        self._check_record(out)
        self._check_deltas(out)
        self.outputs.append(out)
        return out

    def run(self, max_steps: int = 2000) -> list[StepOutput]:
        """Step until the engine is empty; fails if it takes more than `max_steps`."""
        outs = []
        for _ in range(max_steps):
            if not self.engine.has_unfinished_requests():
                self.check_all_finished()
                return outs
            outs.append(self.step())
        raise AssertionError(f"still unfinished after {max_steps} steps: "
                             f"{sorted(self.engine.requests)}")

    # ---- checks ----------------------------------------------------------------------
    def _check_kv_events(self) -> None:
        """Follow the KV events as a router would (a gap: take a snapshot), and hold that
        the mirror is exactly the pool's findable blocks."""
        manager = self.engine.block_manager
        if manager.events is None or len(self.outputs) % self.kv_read_every:
            return
        batches = manager.events.since(self.kv_seq)
        if batches is None:
            self.kv_mirror, self.kv_seq = set(manager.cached_keys()), manager.events.seq
            self.kv_snapshots += 1
        for batch in batches or ():
            assert batch.seq == self.kv_seq + 1, (batch.seq, self.kv_seq)
            self.kv_mirror.difference_update(batch.removed)
            self.kv_mirror.update(batch.stored)
            self.kv_seq = batch.seq
        assert self.kv_mirror == set(manager.cached_keys()), "KV events lost a block"

    def _check_record(self, out: StepOutput) -> None:
        rec = out.record
        if rec is None:
            return
        live = self.configs[rec.config_version]
        assert rec.token_budget == live.max_num_batched_tokens
        assert rec.tokens_used <= rec.token_budget, (rec.tokens_used, rec.token_budget)
        assert rec.num_prefill_seqs + rec.num_decode_seqs <= live.max_num_seqs
        assert rec.max_num_seqs == live.max_num_seqs
        assert sum(n for _, _, n in rec.scheduled) == rec.tokens_used
        ids = [rid for rid, _, _ in rec.scheduled]
        assert len(ids) == len(set(ids)), f"a request ran twice in step {rec.step_id}"
        assert all(kind != "decode" or n == 1 for _, kind, n in rec.scheduled)
        assert rec.kv_blocks_used + rec.kv_blocks_free == self.engine.block_manager.num_blocks
        assert sum(rec.decisions.tokens_by_lane.values()) == rec.tokens_used

    def _check_deltas(self, out: StepOutput) -> None:
        for delta in out.deltas:
            log = self.logs.get(delta.request_id)
            assert log is not None, f"delta for a request never accepted: {delta.request_id}"
            assert log.finish_reason is None, (
                f"{delta.request_id} got a delta after finishing ({log.finish_reason})")
            log.tokens.extend(delta.new_token_ids)
            log.token_times.extend([self.engine.clock()] * len(delta.new_token_ids))
            if delta.finished:
                log.finish_reason = delta.finish_reason
        for record in out.finished:
            self.record_counts[record.request_id] += 1
            assert self.record_counts[record.request_id] == 1, (
                f"{record.request_id} has two RequestRecords")
            log = self.logs.get(record.request_id)
            if log is None:  # a rejection: recorded, never accepted
                assert record.status == RequestStatus.REJECTED.name
                assert not self.decisions[record.request_id].accepted
                continue
            assert log.finish_reason == record.finish_reason, (
                record.request_id, log.finish_reason, record.finish_reason)
            assert record.num_output_tokens == len(log.tokens)
            log.record = record

    def check_all_finished(self) -> None:
        """Every accepted request ended once, with the tokens an undisturbed run gives."""
        for request_id, log in self.logs.items():
            assert log.finish_reason is not None, f"{request_id} never finished"
            assert log.record is not None, f"{request_id} has no RequestRecord"
            reference = reference_output(log.prompt, log.params, self.engine.executor)
            if log.finish_reason in ("stop", "length"):
                assert log.tokens == reference, f"{request_id}: tokens differ from a solo run"
            else:  # cancelled or timed out part-way: what it got is a prefix of that
                assert log.tokens == reference[:len(log.tokens)], request_id

    # ---- queries over the steps run so far -------------------------------------------
    def records(self):
        return [o.record for o in self.outputs if o.record is not None]

    def finished_records(self) -> dict[str, RequestRecord]:
        return {r.request_id: r for o in self.outputs for r in o.finished}

    def steps_of(self, request_id: str) -> list[tuple[int, str, int]]:
        """(step id, kind, tokens) for each step that ran the request."""
        return [(rec.step_id, kind, n) for rec in self.records()
                for rid, kind, n in rec.scheduled if rid == request_id]


def warm_engine(lanes: tuple[LaneConfig, ...]) -> tuple[Engine, FakeClock, Driver]:
    """An engine that has measured 1000 tokens/s (every token costs 1 ms of engine time),
    for admission's estimates: one 200-token request has run."""
    engine, clock = make_engine(live_config(lanes), prefill_token_cost_s=1e-3,
                                decode_token_cost_s=1e-3)
    d = Driver(engine)
    d.add("warmup", prompt(0, 200), SamplingParams(max_tokens=4, ignore_eos=True))
    d.run()
    if abs(engine.throughput.tokens_per_s - 1000.0) > 1e-6:
        raise AssertionError(f"warm-up measured {engine.throughput.tokens_per_s} tokens/s")
    return engine, clock, d
