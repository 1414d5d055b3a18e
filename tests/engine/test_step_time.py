"""Steps held to target_step_ms by the step law (engine/calibration/step_law.py,
engine/scheduling/step_time.py): the law's algebra and fit, and the scheduler's three rules
on the simulated executor."""

from __future__ import annotations

import dataclasses
import random

import pytest
from engine_helpers import EOS, START_TIME, Driver, prompt
from fixtures.law_engine import features_of

from engine.calibration.step_law import (
    StepLaw,
    StepProbe,
    chunk_pairs,
    decodes_alone,
    fit_law,
    law_error_pct,
)
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import Request, SamplingParams
from engine.scheduling.step_time import (
    DECODE_SHARE,
    HEADROOM,
    MAX_SCALE,
    MIN_PROGRESS,
    LawSlowdown,
    StepTime,
)
from engine.sim.executor import FakeClock, SimulatedExecutor

# About this CPU's: 40 ms fixed, 0.8 ms a token, 0.7 us a prefill pair, 7.5 us a decode's
# context token (a 128-token chunk at 0: 0.15 s; at 3,968: 0.50 s).
CPU = StepLaw(0.040, 0.0008, 0.7e-6, 7.5e-6)
TARGET_MS = 250


def test_a_chunk_from_position_0_has_the_pairs_of_a_causal_square():
    assert chunk_pairs(0, 4) == 10  # 1 + 2 + 3 + 4
    assert chunk_pairs(100, 4) == 410


@pytest.mark.parametrize("start", [0, 17, 1000, 4000])
@pytest.mark.parametrize("seconds", [0.001, 0.05, 0.21])
def test_the_affordable_chunk_is_the_largest_that_fits(start, seconds):
    n = CPU.affordable_chunk(start, seconds)
    assert CPU.chunk_s(start, n) <= seconds + 1e-12
    assert CPU.chunk_s(start, n + 1) > seconds


def test_no_time_affords_no_tokens_and_a_law_without_attention_is_linear():
    assert CPU.affordable_chunk(0, 0.0) == CPU.affordable_chunk(0, -1.0) == 0
    assert StepLaw(0.01, 0.001, 0.0, 0.0).affordable_chunk(5000, 0.1) == 100


@pytest.mark.parametrize("start", [0, 1, 50])
def test_a_chunk_priced_by_attention_alone_is_afforded_no_token_too_many(start):
    """Where a token's own cost is nothing beside its attention (a GPU's law's shape), the
    afforded chunk is the quadratic's root to the token: one more would run over."""
    law = StepLaw(0.0, 0.0, 1e-6, 0.0)
    for n in range(1, 200):
        assert law.affordable_chunk(start, law.chunk_s(start, n)) == n
        assert law.affordable_chunk(start, law.chunk_s(start, n + 1) * (1 - 1e-6)) == n


# decodes alone run their own code: a third of the prompt step's fixed cost, each decode
# 1.5x a prompt token (about this CPU's: engine/calibration/step_law.py)
CPU_DECODES = dataclasses.replace(CPU, decode_fixed_s=0.013, decode_row_s=0.0012)
LAW_TERMS = ("fixed_s", "token_s", "prefill_pair_s", "decode_kv_s", "decode_fixed_s",
             "decode_row_s")


def _probes(law: StepLaw, noise: float = 0.0, seed: int = 0) -> list[StepProbe]:
    """The start-up probe's shapes (engine/calibration/probe.py), timed by `law`."""
    rng = random.Random(seed)
    shapes = [(n, 0, chunk_pairs(0, n), 0) for n in (16, 32, 64, 128, 256)]
    shapes += [(64, 0, chunk_pairs(s, 64), 0) for s in (1000, 4000)]
    shapes += [(b, b, 0, b * 256) for b in (1, 4, 16)] + [(16, 16, 0, 16 * 1024)]
    return [StepProbe(*f, law.step_s(*f) * (1 + noise * rng.uniform(-1, 1)), "")
            for f in shapes]


@pytest.mark.parametrize("law", [CPU, CPU_DECODES], ids=["one_law", "decode_steps_own"])
def test_the_fit_recovers_the_law_and_never_goes_negative(law):
    fitted = fit_law(_probes(law))
    for name in LAW_TERMS:
        assert getattr(fitted, name) == pytest.approx(getattr(law, name), rel=1e-6), name
    for seed in range(20):
        noisy = fit_law(_probes(law, noise=0.3, seed=seed))
        assert min(getattr(noisy, name) for name in LAW_TERMS) >= 0


def test_a_step_of_decodes_alone_is_priced_by_its_own_terms():
    """A lone decode costs its own fixed cost, not a prompt step's; a chunk joining the
    decodes makes the step a prompt step, where they are rows like the chunk's."""
    assert CPU_DECODES.step_s(1, 1, 0, 100) == pytest.approx(0.013 + 0.0012 + 100 * 7.5e-6)
    with_chunk = CPU_DECODES.step_s(17, 1, chunk_pairs(0, 16), 100)
    assert with_chunk == pytest.approx(CPU.step_s(17, 1, chunk_pairs(0, 16), 100))
    assert with_chunk == pytest.approx(0.040 + 17 * 0.0008 + chunk_pairs(0, 16) * 0.7e-6
                                       + 100 * 7.5e-6)
    # a law written before the decode-step terms (an old trace's) prices both alike
    old = StepLaw.from_dict({k: v for k, v in CPU_DECODES.to_dict().items()
                             if not k.startswith("decode_fixed") and k != "decode_row_ms"})
    assert old.step_s(16, 16, 0, 1600) == pytest.approx(0.040 + 16 * 0.0008 + 1600 * 7.5e-6)
    assert StepLaw.from_dict(CPU_DECODES.to_dict()) == CPU_DECODES


def test_a_probe_of_one_kind_of_step_prices_the_other_alike():
    prompts_only = [p for p in _probes(CPU_DECODES) if not decodes_alone(p.tokens, p.decodes)]
    fitted = fit_law(prompts_only)
    assert fitted.decode_fixed_s == fitted.fixed_s and fitted.decode_row_s == fitted.token_s


def test_the_laws_error_counts_steps_it_under_predicts():
    """law_max_error_pct (the fit's record in GET /control/config) is the worst miss
    either way: a step that ran twice what the law says is 50% off, not 0%."""
    features = (64, 0, chunk_pairs(0, 64), 0)
    slow = StepProbe(*features, 2 * CPU.step_s(*features), "prefill 64 @0")
    fast = StepProbe(*features, CPU.step_s(*features) / 4, "prefill 64 @0")
    assert law_error_pct(CPU, [slow]) == pytest.approx(50.0)
    assert law_error_pct(CPU, [slow, fast]) == pytest.approx(300.0)


def make_timed_engine(law: StepLaw | None = CPU, **live_changes):
    """Steps held to the fixed target (step_policy fixed): the goodput policy's own sizes
    are tests/engine/test_goodput_policy.py's."""
    live_changes.setdefault("step_policy", "fixed")
    clock = FakeClock(START_TIME)
    executor = SimulatedExecutor(eos_token_id=EOS, clock=clock)
    static = StaticConfig(num_kv_blocks=4096, max_model_len=8192, target_step_ms=TARGET_MS)
    live = LiveConfig(max_num_seqs=64, prefill_chunk_size=128, max_num_batched_tokens=192)
    engine = Engine(EngineConfig(static, live.replace(**live_changes)), executor, clock=clock,
                    eos_token_id=EOS, step_law=law)
    return engine, Driver(engine)


def run_capturing(engine: Engine, driver: Driver, max_steps: int = 3000) -> list:
    """Each step's SchedulerOutput, captured before the update advances its requests."""
    captured, schedule = [], engine.scheduler.schedule

    def capture(now):
        out, stats = schedule(now)
        captured.append((out, CPU.step_s(*features_of(out)), stats))
        return out, stats

    engine.scheduler.schedule = capture
    driver.run(max_steps)
    return captured


def test_chunks_deep_into_a_long_prompt_shrink_to_keep_the_step_under_the_target():
    engine, driver = make_timed_engine()
    driver.add("long", prompt(1, 4000), SamplingParams(max_tokens=2, ignore_eos=True))
    steps = run_capturing(engine, driver)
    driver.check_all_finished()
    chunks = [out.prefills[0].num_tokens for out, _, _ in steps if out.prefills]
    assert chunks[0] == 128 and chunks[-2] < 128  # the budget's chunk, then cut by time
    assert sum(chunks) == 4000
    assert max(t for _, t, _ in steps) <= TARGET_MS / 1000 + 1e-9
    # the scheduler's own prediction (traced as steps.predicted_step_s) is the law's
    assert [out.predicted_s for out, _, _ in steps] == pytest.approx([t for _, t, _ in steps])


def test_without_a_law_chunks_keep_their_size_and_steps_run_over():
    engine, driver = make_timed_engine(law=None)
    driver.add("long", prompt(1, 4000), SamplingParams(max_tokens=2, ignore_eos=True))
    steps = run_capturing(engine, driver)
    chunks = [out.prefills[0].num_tokens for out, _, _ in steps if out.prefills]
    assert set(chunks[:-1]) == {128}
    assert {out.predicted_s for out, _, _ in steps} == {None}
    assert max(t for _, t, _ in steps) > TARGET_MS / 1000  # what the law prevents


def test_a_preemption_victim_takes_its_decode_out_of_the_steps_prediction():
    """A running request preempted for a block after the pass served it (low priority,
    started first) gives back its decode's time with its token: each step's prediction
    (steps.predicted_step_s; what the slowdown and the refit learn from, and what limits
    the step's chunks) is the law's price of the work the step runs, not of work taken
    back."""
    clock = FakeClock(START_TIME)
    static = StaticConfig(num_kv_blocks=16, max_model_len=256, target_step_ms=TARGET_MS)
    live = LiveConfig(max_num_seqs=8, prefill_chunk_size=128, max_num_batched_tokens=192,
                      step_policy="fixed")
    engine = Engine(EngineConfig(static, live), SimulatedExecutor(eos_token_id=EOS, clock=clock),
                    clock=clock, eos_token_id=EOS, step_law=CPU)
    driver = Driver(engine)
    driver.add("victim", prompt(1, 60), SamplingParams(max_tokens=120, ignore_eos=True),
               priority=9)
    driver.step()
    driver.add("needy", prompt(2, 130), SamplingParams(max_tokens=100, ignore_eos=True))
    steps = run_capturing(engine, driver)
    driver.check_all_finished()
    preempted = [out for out, _, stats in steps if stats.preempted == ["victim"]]
    assert preempted and [r.request_id for r in preempted[0].decodes] == ["needy"]
    assert [out.predicted_s for out, _, _ in steps] == pytest.approx([t for _, t, _ in steps])


def test_requests_start_while_the_running_decodes_stay_within_their_share():
    engine, driver = make_timed_engine()
    for i in range(12):
        driver.add(f"r{i}", prompt(i, 1500), SamplingParams(max_tokens=40, ignore_eos=True))
    steps = run_capturing(engine, driver)
    driver.check_all_finished()
    share = DECODE_SHARE * (HEADROOM * TARGET_MS / 1000 - CPU.fixed_s)
    waited = [stats for _, _, stats in steps if stats.waiting_by_reason.get("step_time")]
    assert waited, "the twelve 1.5k prompts never wait for step time"
    one_request = CPU.decode_s(1500 + 40)  # the most one start may overshoot the share by
    for out, _, _ in steps:
        decode_s = sum(CPU.decode_s(r.num_computed_tokens + 1) for r in out.decodes)
        assert decode_s <= share + one_request
    assert max(t for _, t, _ in steps) <= TARGET_MS / 1000 * 1.05


def _running(context: int, count: int = 1) -> list[Request]:
    return [Request(f"r{i}", prompt(i, context), SamplingParams(), START_TIME)
            for i in range(count)]


def test_the_decode_share_is_of_the_time_a_step_has_beside_its_fixed_cost():
    """Ten decodes over 1,360-token contexts take 110 ms: within half the 250 ms target,
    but over half of what is left beside the 40 ms fixed cost (105 ms): nothing starts."""
    step = StepTime.start(CPU, TARGET_MS / 1000)
    running = _running(1360, 10)
    assert 0.105 < CPU.token_s * 10 + CPU.decode_kv_s * 13_600 < 0.125
    assert not step.admits(_running(100)[0], running)
    assert StepTime.start(CPU, TARGET_MS / 1000).admits(_running(100)[0], running[:9])


def test_requests_started_in_a_step_count_against_the_decode_share_of_the_next_start():
    """The running decodes take 96 ms of the 105 ms share; a 3,000-token prompt started in
    this step will decode over 3,000 tokens each step too (23 ms): the next waits."""
    step = StepTime.start(CPU, TARGET_MS / 1000)
    running = _running(1500, 8)
    first, second = _running(3000, 2)
    assert step.admits(first, running)
    step.started(first)
    assert not step.admits(second, running)


def test_one_request_over_the_share_still_starts_alone_and_decodes_every_step():
    engine, driver = make_timed_engine()
    heavy = StepLaw(CPU.fixed_s, CPU.token_s, CPU.prefill_pair_s, 1e-4)  # 0.3 s at 3k
    engine.scheduler.step_law = heavy
    driver.add("big", prompt(1, 3000), SamplingParams(max_tokens=5, ignore_eos=True))
    driver.add("next", prompt(2, 100), SamplingParams(max_tokens=5, ignore_eos=True))
    driver.run(3000)
    driver.check_all_finished()
    big = [kind for _, kind, _ in driver.steps_of("big")]
    first_decode = big.index("decode")
    assert big[first_decode:] == ["decode"] * 4  # every step, though each is over target


def test_a_started_prompt_always_advances_even_with_no_time_left():
    engine, driver = make_timed_engine()
    slow = StepLaw(0.3, CPU.token_s, CPU.prefill_pair_s, CPU.decode_kv_s)  # fixed > target
    engine.scheduler.step_law = slow
    driver.add("p", prompt(1, 100), SamplingParams(max_tokens=1, ignore_eos=True))
    driver.run(100)
    driver.check_all_finished()
    chunks = [n for _, kind, n in driver.steps_of("p") if kind == "prefill"]
    assert chunks and all(n == MIN_PROGRESS for n in chunks[:-1])


def test_the_law_scale_follows_slow_steps_but_never_loosens_the_law():
    scale = LawSlowdown()
    for _ in range(200):
        scale.observe(0.1, 0.2)  # served steps run twice what the law says
    assert scale.value == pytest.approx(2.0, rel=1e-3)
    assert scale.step_target_s(0.25) == pytest.approx(HEADROOM * 0.25 / 2.0, rel=1e-3)
    fast = LawSlowdown()
    for _ in range(200):
        fast.observe(0.1, 0.05)  # faster than the law: left at 1
        fast.observe(None, 0.3)  # a step without a prediction says nothing
    assert fast.value == 1.0
    for _ in range(500):
        fast.observe(0.01, 1.0)
    assert fast.value == pytest.approx(MAX_SCALE, rel=1e-3)


def test_a_scaled_law_cuts_chunks_deep_into_a_prompt_further():
    sizes = {}
    for value in (1.0, 2.0):
        engine, driver = make_timed_engine()
        engine.scheduler.law_slowdown.value = value
        driver.add("long", prompt(1, 4000), SamplingParams(max_tokens=2, ignore_eos=True))
        driver.run(3000)
        sizes[value] = [n for _, kind, n in driver.steps_of("long") if kind == "prefill"]
    assert len(sizes[2.0]) > len(sizes[1.0])  # more, smaller chunks for the same prompt
    assert sum(sizes[2.0]) == sum(sizes[1.0]) == 4000
