"""Random workloads against the whole engine core, checked after every step.

Hypothesis draws arrivals (prompt and output lengths, lanes including a tenant-fair one,
tenants, priorities, deadlines), cancels of waiting and running requests, small KV
pools that force preemption, and live-config swaps mid-run (budgets, watermarks,
policies, batching modes, chunk sizes, lane settings, removing a lane). After every step:

- the step stayed within the token budget and max_num_seqs of the config it ran under,
  and `check_integrity()` holds (see `Driver`);
- the step's KV reads back right: the simulated executor writes each computed token into
  its slot through the block table and reads every sequence's context back (shadow KV,
  engine/sim/shadow_kv.py), so a wrong block table, prefix hit or skipped chunk fails it;
- each accepted request ends exactly once, with the tokens an undisturbed run gives;
- fair share, as a bound on bypass (`FairShareWatch`).
Every accepted request must finish within a step cap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import hypothesis.strategies as st
from engine_helpers import Driver, make_engine, prompt
from hypothesis import HealthCheck, event, given, settings

from engine.config import LaneConfig, LiveConfig
from engine.config.schema import LANE_POLICIES
from engine.engine import Engine
from engine.kv.events import KVEventLog
from engine.records import StepOutput
from engine.request import SamplingParams

LANE_NAMES = ("interactive", "batch", "fair")
TENANTS = ("t0", "t1", "t2")
REJECT_REASONS = {"queue_full", "deadline", "kv_reject_watermark", "too_long", "unknown_lane"}
SYSTEM_PROMPT = prompt(1234, 64)


@st.composite
def lane_configs(draw, names=LANE_NAMES) -> tuple[LaneConfig, ...]:
    return tuple(LaneConfig(
        name,
        weight=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])),
        max_running=draw(st.none() | st.integers(1, 4)),
        max_waiting=draw(st.none() | st.integers(2, 12)),
        policy=draw(st.sampled_from(LANE_POLICIES)),
        tenant_fair_share=name == "fair" or draw(st.booleans()),
        queue_timeout_ms=draw(st.none() | st.integers(50, 3000)),
        preempt_first=name == "batch",
        batching=draw(st.sampled_from([None, None, None, "continuous", "static"])),
        preempt_to_start=name != "batch" and draw(st.booleans()),
    ) for name in names)


@st.composite
def live_configs(draw, engine: Engine, names=LANE_NAMES) -> LiveConfig:
    static = engine.static
    chunked = draw(st.sampled_from([True, True, True, False]))
    if chunked:
        budget = draw(st.integers(16, 2 * static.max_model_len))
    else:
        budget = draw(st.integers(static.max_model_len, 2 * static.max_model_len))
    high = draw(st.sampled_from([0.5, 0.7, 0.88, 0.95]))
    return LiveConfig(
        max_num_seqs=draw(st.integers(1, min(12, static.num_kv_blocks))),
        max_num_batched_tokens=budget,
        prefill_chunk_size=draw(st.integers(1, static.max_model_len)),
        chunked_prefill=chunked,
        max_waiting_requests=draw(st.integers(1, 40)),
        queue_timeout_ms=draw(st.integers(100, 5000)),
        kv_cache_high_watermark=high,
        kv_cache_reject_watermark=draw(st.sampled_from([v for v in (0.9, 0.97, 1.0)
                                                        if v > high])),
        schedule_policy=draw(st.sampled_from(["decode_first", "mixed"])),
        batching=draw(st.sampled_from(["continuous", "continuous", "static"])),
        lanes=draw(lane_configs(names)),
        default_lane="interactive",
        long_context_lane=None,
    )


@dataclass
class _Window:
    charged: int = 0  # tokens lane A was charged in the window
    others: dict[str, int] = field(default_factory=dict)  # lane -> tokens since it queued


class FairShareWatch:
    """Every lane with work gets its share: a bound on how far others may bypass it.

    Take a lane A that is the only lane with queued work; the window lasts while A stays
    queued and eligible (below its max_running, its static batch open) and starts no new
    prefill (in the step it does, the order of picks is not visible, so the window just
    ends). A lane B that starts queueing in the window joins no earlier than A's
    virtual time, its virtual time only grows after that, and B starts a new prefill only
    while its virtual time is at most A's. So whenever B starts one, the tokens B was
    charged since it first queued in the window are at most w_B / w_A times what A was
    charged, plus one chunk (the pick itself).
    A config change starts the watch afresh (weights and lanes may differ). A lane the KV
    high watermark holds back while a `preempt_to_start` lane starts one is not eligible
    in that step: that lane goes ahead by design (engine/scheduling/preemption.py).
    """

    def __init__(self):
        self.windows: dict[str, _Window] = {}
        self.bypass_checked = 0  # checks made when another lane started a new prefill

    def reset(self) -> None:
        self.windows.clear()

    def before_step(self, engine: Engine) -> None:
        sched, live = engine.scheduler, engine.live_config
        self.running = {r.request_id for r in sched.running}
        self.lane_of = {rid: r.lane for rid, r in engine.requests.items()}
        self.waiting = {q.name: {r.request_id for r in q.waiting_requests()} for q in sched.lanes}
        self.weights = {q.name: q.config.weight for q in sched.lanes}
        self.preempt_to_start = {q.name for q in sched.lanes if q.config.preempt_to_start}
        self.eligible = {q.name: not (
            (q.config.max_running is not None and q.num_running >= q.config.max_running)
            or (live.lane_batching(q.config) == "static" and q.batch_closed))
            for q in sched.lanes}
        chunk = live.prefill_chunk_size if live.chunked_prefill else engine.static.max_model_len
        self.chunk = min(chunk, live.max_num_batched_tokens)

    def after_step(self, out: StepOutput) -> None:
        rec = out.record
        if rec is None:
            return self.reset()
        timed_out = {r.request_id for r in out.finished if r.status == "TIMEOUT"}
        # queued when the step charged its lanes: still waiting, or just preempted
        queued = {name for name, ids in self.waiting.items() if ids - timed_out}
        queued |= {self.lane_of[rid] for rid in rec.decisions.preempted}
        new_tokens: dict[str, int] = defaultdict(int)
        for rid, kind, n in rec.scheduled:
            if kind == "prefill" and rid not in self.running:
                new_tokens[self.lane_of[rid]] += n
        kv_bypass = bool(self.preempt_to_start & new_tokens.keys())
        reasons = rec.decisions.waiting_reason_by_lane
        for lane in self.waiting:
            window = self.windows.get(lane)
            if lane not in queued or not self.eligible[lane] or (
                    kv_bypass and reasons.get(lane) == "kv_high_watermark"):
                self.windows.pop(lane, None)
                continue
            if window is None:
                if queued != {lane}:
                    continue
                window = self.windows[lane] = _Window()
            window.charged += rec.decisions.tokens_by_lane.get(lane, 0)
            for other, tokens in rec.decisions.tokens_by_lane.items():
                if other != lane and (other in window.others or other in queued):
                    window.others[other] = window.others.get(other, 0) + tokens
            if new_tokens.get(lane):  # served; others may start after A's queue ran dry
                del self.windows[lane]
                continue
            for other in new_tokens.keys() - {lane}:
                self.bypass_checked += 1
                bound = self.weights[other] * window.charged / self.weights[lane] + self.chunk
                assert window.others[other] <= bound + 1e-6, (
                    f"lane {lane!r} queued since its window began, yet {other!r} ran"
                    f" {window.others[other]} tokens (bound {bound:.1f}) by step {rec.step_id}")


def _arrival(data, d: Driver, n: int, lane_names: tuple[str, ...]) -> None:
    engine = d.engine
    max_len = engine.static.max_model_len
    length = data.draw(st.integers(1, 16) | st.integers(1, max_len), label="prompt_len")
    tokens = prompt(data.draw(st.integers(0, 5), label="seed"), length)
    if data.draw(st.booleans(), label="shared_prefix"):
        tokens = SYSTEM_PROMPT[:data.draw(st.integers(1, 64))] + tokens
    params = SamplingParams(max_tokens=data.draw(st.integers(1, 60), label="max_tokens"),
                            ignore_eos=data.draw(st.booleans(), label="ignore_eos"))
    deadline = data.draw(st.none() | st.floats(-0.05, 2.0), label="deadline_in")
    decision = d.add(f"q{n}", tokens, params,
                     lane=data.draw(st.sampled_from(lane_names + ("batch",)), label="lane"),
                     tenant=data.draw(st.sampled_from(TENANTS), label="tenant"),
                     priority=data.draw(st.integers(0, 3), label="priority"),
                     deadline=None if deadline is None else engine.clock() + deadline)
    assert decision.accepted or decision.reason in REJECT_REASONS, decision
    assert decision.accepted == (f"q{n}" in engine.requests)


def _swap_config(data, d: Driver, watch: FairShareWatch) -> None:
    engine = d.engine
    drop_batch = data.draw(st.integers(0, 3), label="drop_batch") == 0
    names = ("interactive", "fair") if drop_batch else LANE_NAMES
    new = data.draw(live_configs(engine, names), label="new_config")
    moves = None
    if drop_batch and "batch" in engine.live_config.lane_names:
        if any(r.lane == "batch" for r in engine.requests.values()):
            before = engine.live_config
            try:
                d.update_config(new)
            except ValueError as exc:
                assert "'batch'" in str(exc)
            else:
                raise AssertionError("removed a lane that still had requests")
            assert engine.live_config is before
        moves = {"batch": data.draw(st.sampled_from(["interactive", "fair"]), label="move")}
    installed = d.update_config(new, moves)
    assert installed.version == max(d.configs)
    watch.reset()


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_workloads_keep_every_contract(data):
    block_size = data.draw(st.sampled_from([8, 16]), label="block_size")
    max_model_len = data.draw(st.sampled_from([64, 128, 256]), label="max_model_len")
    full = max_model_len // block_size  # blocks of one request of max_model_len
    engine, clock = make_engine(
        LiveConfig(max_num_seqs=1, max_num_batched_tokens=64, prefill_chunk_size=1),
        block_size=block_size, max_model_len=max_model_len,
        # from pools that cannot hold the longest request to a few of them: preemption
        num_kv_blocks=data.draw(st.integers(max(4, full // 2), 3 * full), label="num_kv_blocks"),
        eos_every=data.draw(st.sampled_from([None, 7, 23]), label="eos_every"),
        step_cost_s=1e-3, prefill_token_cost_s=1e-5, decode_token_cost_s=1e-5)
    # KV events on a ring small enough that a reader reading every step still keeps up,
    # and one read every few steps falls behind (gap -> snapshot): engine/kv/events.py
    engine.block_manager.publish_events(KVEventLog(capacity=data.draw(
        st.sampled_from([1, 4, 64]), label="kv_event_ring")))
    d = Driver(engine)
    d.kv_read_every = data.draw(st.sampled_from([1, 3]), label="kv_read_every")
    d.update_config(data.draw(live_configs(engine), label="initial_config"))
    watch = FairShareWatch()
    n = 0
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        lane_names = engine.live_config.lane_names
        for _ in range(data.draw(st.integers(0, 3) | st.just(8), label="arrivals")):
            n += 1
            _arrival(data, d, n, lane_names)
        if engine.requests and data.draw(st.integers(0, 5), label="cancel") == 0:
            victim = data.draw(st.sampled_from(sorted(engine.requests)), label="victim")
            assert d.abort(victim)
            assert engine.get_request(victim) is None and not d.abort(victim)
        version = engine.live_config.version
        if data.draw(st.integers(0, 7), label="swap") == 0:
            _swap_config(data, d, watch)
        clock.advance(data.draw(st.sampled_from([0.0, 0.001, 0.01, 0.1]), label="idle_s"))
        watch.before_step(engine)
        out = d.step()
        watch.after_step(out)
        if out.record is not None and engine.live_config.version != version:
            assert out.record.config_version == engine.live_config.version
    for _ in range(20_000):  # drain, still checking every step
        if not engine.has_unfinished_requests():
            break
        watch.before_step(engine)
        watch.after_step(d.step())
    else:
        raise AssertionError(f"unfinished after the step cap: {sorted(engine.requests)}")
    d.check_all_finished()
    assert engine.block_manager.num_used == 0
    shadow = engine.executor.shadow  # every step read its sequences' contexts back
    assert shadow is not None and shadow.tokens_read >= sum(r.tokens_used for r in d.records())
    _record_events(d, watch)


def _record_events(d: Driver, watch: FairShareWatch) -> None:
    """What the example exercised (`pytest --hypothesis-show-statistics`)."""
    records = d.records()
    for reason in sorted({log.finish_reason for log in d.logs.values()}):
        event(f"finished: {reason}")
    for decision in d.decisions.values():
        if not decision.accepted:
            event(f"rejected: {decision.reason}")
    if any(r.decisions.preempted for r in records):
        event("preemption")
    if any(r.prefix_hit_tokens for r in records):
        event("prefix hit")
    if len(d.configs) > 2:
        event("config swapped mid-run")
    if watch.bypass_checked:
        event("fair share: bypass bounded")


@st.composite
def phases(draw) -> list[tuple[str, int, int, int, int]]:
    """Bursts into one lane each: (lane, requests, prompt_len, max_tokens, steps to run)."""
    return draw(st.lists(st.tuples(st.sampled_from(("a", "b", "c")), st.integers(0, 12),
                                   st.integers(1, 300), st.integers(1, 200),
                                   st.integers(0, 30)), min_size=1, max_size=8))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.tuples(*[st.sampled_from([0.5, 1.0, 2.0, 4.0])] * 3),
       budget=st.integers(16, 256), chunk=st.integers(8, 256),
       policy=st.sampled_from(["decode_first", "mixed"]), bursts=phases())
def test_backlogged_lanes_are_not_bypassed_beyond_their_share(weights, budget, chunk, policy,
                                                              bursts):
    # Plenty of KV and no timeouts: only fair share decides who starts next. Long decodes
    # in one lane while others queue are what make lanes' virtual times drift apart.
    lanes = tuple(LaneConfig(name, weight=w) for name, w in zip("abc", weights, strict=True))
    live = LiveConfig(max_num_seqs=64, max_num_batched_tokens=budget, prefill_chunk_size=chunk,
                      queue_timeout_ms=10**9, lanes=lanes, default_lane="a",
                      long_context_lane=None)
    engine, _ = make_engine(live, num_kv_blocks=4096, max_model_len=512)
    d = Driver(engine)
    watch = FairShareWatch()
    n = 0
    for lane, count, prompt_len, max_tokens, steps in bursts:
        for _ in range(count):
            n += 1
            d.add(f"{lane}{n}", prompt(n, prompt_len),
                  SamplingParams(max_tokens=max_tokens, ignore_eos=True), lane=lane)
        for _ in range(steps):
            watch.before_step(engine)
            watch.after_step(d.step())
    while engine.has_unfinished_requests():
        watch.before_step(engine)
        watch.after_step(d.step())
    d.check_all_finished()
    if watch.bypass_checked:
        event("fair share: bypass bounded")
