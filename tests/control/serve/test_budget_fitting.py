"""Step budgets fitted to the device (engine/calibration/budget_fit.py): the rule on a fake
timer, the operator's values kept, the choice shown in the ready banner and GET
/control/config."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
from fixtures.serving import asgi_client, make_engine

from control.serve.server import banner
from engine.calibration.budget_fit import fit_step_budgets
from engine.calibration.probe import MIN_CHUNK
from engine.calibration.step_law import StepLaw, chunk_pairs
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.config.yaml_loader import load_config_dict
from engine.llm import LLM, fit_engine_config

# A CPU-like device: 12 ms per step plus 0.9 ms per token (attention terms: see below).
CPU_LAW = (0.012, 0.0009)


class FakeProber:
    """Steps that cost exactly `StepLaw(*law)` (no attention terms unless given)."""

    def __init__(self, fixed_s: float, token_s: float, pair_s: float = 0.0,
                 kv_s: float = 0.0):
        self.law = StepLaw(fixed_s, token_s, pair_s, kv_s)
        self.calls: list[tuple[str, int, int]] = []

    def prefill(self, start: int, num_tokens: int) -> float:
        self.calls.append(("prefill", start, num_tokens))
        return self.law.step_s(num_tokens, 0, chunk_pairs(start, num_tokens), 0)

    def decodes(self, batch: int, context: int) -> float:
        self.calls.append(("decode", batch, context))
        return self.law.step_s(batch, batch, 0, batch * context)


def fit(explicit: dict | None = None, law=CPU_LAW, target_ms: int = 250, **static):
    explicit = explicit or {}
    config = EngineConfig(StaticConfig(target_step_ms=target_ms, **static),
                          LiveConfig().replace(**explicit)).validate()
    return fit_step_budgets(config, set(explicit), FakeProber(*law))


def test_the_fit_keeps_a_full_step_under_the_target_on_a_slow_device():
    config, result = fit()
    live = config.live
    # (0.25 - 0.012) / 0.0009 = 264 tokens per step; the chunk is a power of two <= 2/3
    assert (live.prefill_chunk_size, live.max_num_batched_tokens) == (128, 264)
    assert result.predicted_ms(live.max_num_batched_tokens) <= 250
    assert result.law.fixed_s == pytest.approx(0.012)
    assert result.law.token_s == pytest.approx(0.0009)
    assert result.fitted == {"prefill_chunk_size": 128, "max_num_batched_tokens": 264}
    assert "prefill_chunk_size=128, max_num_batched_tokens=264 fitted to 250 ms steps" \
        in result.summary()
    assert "measured 12 ms + 0.9 ms/token" in result.summary()


def test_probing_stops_once_a_step_takes_half_the_target():
    timer = FakeProber(*CPU_LAW)
    config = EngineConfig(StaticConfig(), LiveConfig()).validate()
    _, result = fit_step_budgets(config, set(), timer)
    # 16, 32, 64, 128 (0.127 s >= 0.125 s): never the 2048-token step a default chunk is
    assert [n for n, _ in result.points] == [16, 32, 64, 128]
    assert max(n for kind, start, n in timer.calls if kind == "prefill") == 128


def test_a_fast_device_keeps_the_built_in_defaults():
    config, result = fit(law=(0.001, 1e-6))
    assert config.live.prefill_chunk_size == LiveConfig.prefill_chunk_size
    assert config.live.max_num_batched_tokens == LiveConfig.max_num_batched_tokens
    assert "defaults already fit" in result.note


def test_an_unreachable_target_keeps_the_fixed_cost_at_most_half_a_step_and_says_so():
    config, result = fit(law=(0.3, 0.001))  # the intercept alone is over 250 ms
    # 16-token steps would run 51 tokens/s; 300 tokens (the fixed cost's worth) run 500
    assert config.live.max_num_batched_tokens == 300
    assert config.live.prefill_chunk_size == 128  # largest power of two <= 2/3 of 300
    assert "over the target" in result.note


def test_a_busy_device_still_leaves_room_beside_a_full_chunk():
    # measured at start-up while other processes held the CPU: 227 ms + 4.18 ms/token
    config, result = fit(law=(0.227, 0.00418))
    live = config.live
    assert (live.prefill_chunk_size, live.max_num_batched_tokens) == (32, 54)
    # a long prompt's chunk leaves room for a short prompt that arrives behind it
    assert live.max_num_batched_tokens - live.prefill_chunk_size >= 16
    assert "over the target" in result.note


def test_a_device_too_slow_for_one_chunk_still_leaves_a_third_beside_it():
    # 100 ms + 10 ms/token: 15 tokens fit in a step, under the smallest chunk (16); the
    # budget still holds the chunk and half as much again, or a long prompt's chunks
    # would take every step and a short prompt behind it would wait for the whole prefill
    config, result = fit(law=(0.1, 0.01))
    assert result.step_tokens == 15
    assert config.live.prefill_chunk_size == MIN_CHUNK
    assert config.live.max_num_batched_tokens == MIN_CHUNK * 3 // 2


def test_values_the_operator_set_are_never_overridden():
    config, result = fit({"prefill_chunk_size": 1024})
    assert config.live.prefill_chunk_size == 1024
    assert config.live.max_num_batched_tokens == 1024  # never below their chunk
    assert result.kept == {"prefill_chunk_size": 1024}
    config, result = fit({"max_num_batched_tokens": 96})
    assert (config.live.prefill_chunk_size, config.live.max_num_batched_tokens) == (64, 96)
    both = {"prefill_chunk_size": 300, "max_num_batched_tokens": 5000}
    config, result = fit(both)
    assert result is None
    assert (config.live.prefill_chunk_size, config.live.max_num_batched_tokens) == (300, 5000)


def test_target_zero_or_chunked_prefill_off_fits_nothing():
    timer = FakeProber(*CPU_LAW)
    config = EngineConfig(StaticConfig(target_step_ms=0), LiveConfig()).validate()
    assert fit_step_budgets(config, set(), timer) == (config, None)
    config = EngineConfig(StaticConfig(max_model_len=4096),
                          LiveConfig(chunked_prefill=False)).validate()
    assert fit_step_budgets(config, set(), timer) == (config, None)
    assert timer.calls == []


@pytest.mark.parametrize(("value", "allowed"), [
    (-1, r"an integer number of milliseconds in 1\.\.60000, or 0"), (60_001, "an integer"),
    (2.5, "of type int"), ("250", "of type int")])
def test_an_invalid_target_is_refused_with_a_clear_message(value, allowed):
    with pytest.raises(ValueError, match=rf"target_step_ms=.* must be {allowed}"):
        EngineConfig(StaticConfig(target_step_ms=value)).validate()


def test_the_yaml_takes_the_target_and_checks_its_type():
    loaded = load_config_dict({"serving": {"target_step_ms": 100}})
    assert loaded.config.static.target_step_ms == 100
    with pytest.raises(ValueError, match="target_step_ms"):
        load_config_dict({"serving": {"target_step_ms": "fast"}})


def assert_the_law_is_sane(law: StepLaw, largest_step: int) -> None:
    """Costs are finite and >= 0; a first chunk costs more the more tokens it runs, and a
    decode batch no less the longer its contexts (else the budgets mean nothing)."""
    costs = (law.fixed_s, law.token_s, law.prefill_pair_s, law.decode_kv_s,
             law.decode_fixed_s, law.decode_row_s)
    assert all(math.isfinite(c) and c >= 0 for c in costs), law
    chunks = [law.fixed_s + law.chunk_s(0, n) for n in range(1, largest_step + 2)]
    assert chunks[0] > 0 and all(b > a for a, b in itertools.pairwise(chunks)), law
    decodes = [law.step_s(8, 8, 0, 8 * context) for context in (1, 64, 512)]
    assert decodes == sorted(decodes), law


def assert_the_budgets_follow_the_law(result, before: LiveConfig, live: LiveConfig) -> None:
    """The fitted budgets lie within the config's bounds (MIN_CHUNK .. the unfitted
    values), a full chunk leaves a third of the step (budget_fit.py's rule), and the budget
    is the largest first chunk the law keeps within the target (or the unfitted default)."""
    chunk, budget = live.prefill_chunk_size, live.max_num_batched_tokens
    assert result.fitted == {"prefill_chunk_size": chunk, "max_num_batched_tokens": budget}
    assert MIN_CHUNK <= chunk <= before.prefill_chunk_size and chunk & (chunk - 1) == 0
    assert math.ceil(chunk * 3 / 2) <= budget <= before.max_num_batched_tokens
    target_ms = result.target_step_ms
    assert "over the target" not in result.note  # the tiny model's steps take a few ms
    assert result.predicted_ms(budget) <= target_ms * (1 + 1e-9)
    n = result.step_tokens  # the most tokens of a first chunk within the target
    assert result.predicted_ms(n) <= target_ms * (1 + 1e-9) < result.predicted_ms(n + 1)
    if budget < before.max_num_batched_tokens:
        assert budget == max(n, math.ceil(chunk * 3 / 2))


def test_the_real_runner_probe_fits_the_tiny_model_and_leaves_the_pool_clean(tiny_loaded):
    options = {"num_kv_blocks": 64, "target_step_ms": 250}
    before = fit_engine_config(tiny_loaded, options).live  # what the fit may lower
    llm = LLM(tiny_loaded, **options)
    result = llm.step_fit
    assert result is not None and len(result.points) >= 2
    assert all(p.seconds > 0 for p in result.probes)
    kinds = {p.label.split()[0] for p in result.probes}
    assert kinds == {"prefill", "decode"}  # the decode probes ran on the real runner too
    assert_the_law_is_sane(result.law, before.max_num_batched_tokens)
    assert_the_budgets_follow_the_law(result, before, llm.engine.live_config)
    assert all(float(k.abs().sum()) == 0 and float(v.abs().sum()) == 0
               for k, v in llm.runner.kv_caches)
    out = llm.generate([[1, 2, 3]], use_tqdm=False)[0]
    assert out.token_ids  # the engine runs after the probe


def test_decode_probes_fit_a_pool_that_does_not_split_evenly_into_their_batch(tiny_loaded):
    # 95 blocks over 8 decodes: 190 tokens each would round up to 12 blocks, 96 in all
    llm = LLM(tiny_loaded, num_kv_blocks=95, max_num_seqs=8, target_step_ms=250)
    decodes = [p.label for p in llm.step_fit.probes if p.label.startswith("decode")]
    # 11 whole blocks each; a lone decode and a quarter batch at the shorter context
    assert decodes == ["decode 1 x 44", "decode 2 x 44", "decode 8 x 44", "decode 8 x 176"]
    assert llm.generate([[1, 2, 3]], use_tqdm=False)[0].token_ids


def test_the_ready_banner_says_what_was_fitted():
    _, result = fit()
    text = banner("http://127.0.0.1:8000", "smollm2-135m", result.summary())
    assert text.splitlines()[-1].strip().startswith(
        "budgets: prefill_chunk_size=128, max_num_batched_tokens=264 fitted to 250 ms steps")


async def get_config(engine, settings) -> dict:
    async with asgi_client(engine, settings) as client:
        return (await client.get("/control/config")).json()


def test_control_config_returns_the_fit(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, target_step_ms=250, max_num_seqs=4)
    try:
        assert engine.parts.step_fit is not None
        body = asyncio.run(get_config(engine, settings))
        fitted = body["fitted"]
        assert fitted["target_step_ms"] == 250
        assert body["static"]["target_step_ms"] == 250
        for name, value in fitted["fitted"].items():
            assert body["config"][name] == value
        # the law grows with the step's tokens: through token_ms or, when a noisy probe
        # (a busy machine: 512 tokens at 10x the time of 256, seen in CI) puts all of it in
        # the attention term, through prefill_pair_us; the non-negative fit allows either
        law = fitted["law"]
        assert min(law.values()) >= 0 and law["token_ms"] + law["prefill_pair_us"] > 0, law
        ramp = [p for p in fitted["probes"] if p["step"].endswith(" @0")]  # 16, 32, ...
        assert len(ramp) >= 3 and ramp[-1]["predicted_ms"] > ramp[0]["predicted_ms"], ramp
        assert fitted["summary"].startswith("budgets: ")
    finally:
        engine.stop()  # idempotent: asgi_client stops it too


def test_control_config_says_null_when_nothing_was_fitted(tiny_loaded):
    engine, _, settings = make_engine(tiny_loaded, target_step_ms=0)
    try:
        body = asyncio.run(get_config(engine, settings))
        assert body["fitted"] is None
    finally:
        engine.stop()  # idempotent: asgi_client stops it too


@pytest.mark.parametrize("law", [CPU_LAW, (0.227, 0.00418)])
def test_a_short_prompt_starts_beside_a_long_prefill_under_fitted_budgets(law):
    from tests.engine.engine_helpers import Driver, prompt
    from tests.engine.engine_helpers import make_engine as make_sim_engine

    fitted, _ = fit(law=law)
    engine, _clock = make_sim_engine(fitted.live, num_kv_blocks=512, max_model_len=4096)
    driver = Driver(engine)
    driver.add("long", prompt(1, 1500))
    driver.step()  # the long prompt's first chunk
    driver.add("short", prompt(2, 3))
    driver.step()  # a chunk of the long prompt and, beside it, the whole short prompt
    assert [(kind, n) for kind, n in [s[1:] for s in driver.steps_of("short")]] == \
        [("prefill", 3)]
    assert driver.steps_of("long")[-1][2] == fitted.live.prefill_chunk_size
