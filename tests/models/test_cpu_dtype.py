"""The dtype option: how "auto" resolves per device and CPU, the per-step fp32/bf16 choice,
refusal of bad values at every entry point, and sane tokens from the bf16 paths."""

from __future__ import annotations

import pytest
import torch
from fixtures.paged import PagedHarness
from llm.helpers import PROMPTS

from engine import LLM, SamplingParams
from engine.models import cpu_dtype, load_model
from engine.models.cpu_dtype import BF16_MIN_ROWS, BF16_MIN_ROWS_NATIVE, parse_dtype, resolve_dtype
from kernels import cpu_layers


@pytest.fixture
def amx_cpu(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "cpu_bf16_flags", lambda: ("amx_bf16", "avx512_bf16"))


@pytest.fixture
def no_native_layers(monkeypatch):
    monkeypatch.setattr(cpu_layers, "available", lambda: False)


@pytest.fixture
def plain_cpu(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "cpu_bf16_flags", lambda: ())


def test_auto_on_a_bf16_cpu_keeps_fp32_plus_bf16_copies_for_batched_steps(
        amx_cpu, no_native_layers):
    plan = resolve_dtype("auto", "cpu")
    assert (plan.dtype, plan.bf16_min_rows) == (torch.float32, BF16_MIN_ROWS)
    assert "amx_bf16" in plan.describe() and f">= {BF16_MIN_ROWS} tokens" in plan.describe()


def test_auto_with_the_native_layers_runs_every_step_on_the_bf16_copies(amx_cpu, monkeypatch):
    """Their GEMV streams bf16 weights at full bandwidth, so bf16 wins at one row too."""
    monkeypatch.setattr(cpu_layers, "available", lambda: True)
    plan = resolve_dtype("auto", "cpu")
    assert (plan.dtype, plan.bf16_min_rows) == (torch.float32, BF16_MIN_ROWS_NATIVE) == (
        torch.float32, 1)
    assert "bf16 projections for every step" in plan.describe()
    assert "native decode layers" in plan.describe()


def test_auto_on_a_cpu_without_native_bf16_is_float32(plain_cpu):
    plan = resolve_dtype(None, "cpu")
    assert (plan.dtype, plan.bf16_min_rows) == (torch.float32, None)
    assert "no amx_bf16" in plan.reason


def test_auto_on_cuda_and_explicit_choices(amx_cpu):
    assert resolve_dtype("auto", "cuda").dtype == torch.bfloat16
    for value, dtype in [("float32", torch.float32), ("FP32", torch.float32),
                         ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                         (torch.float16, torch.float16)]:
        plan = resolve_dtype(value, "cpu")
        assert (plan.dtype, plan.bf16_min_rows) == (dtype, None), value


@pytest.mark.parametrize("bad", ["fp16", "int8", "", torch.int8])
def test_a_bad_dtype_names_the_choices(bad):
    with pytest.raises(ValueError, match="must be .*auto, float32, bfloat16"):
        parse_dtype(bad)


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n")
    monkeypatch.setattr(cpu_dtype, "_CPUINFO", info)
    assert cpu_dtype.cpu_bf16_flags() == ("avx512_bf16",)
    monkeypatch.setattr(cpu_dtype, "_CPUINFO", tmp_path / "missing")
    assert cpu_dtype.cpu_bf16_flags() == ()


@pytest.fixture
def tiny_auto(amx_cpu, no_native_layers, tiny_llama_dir):
    """auto with the torch layers' crossover (BF16_MIN_ROWS)."""
    return load_model(tiny_llama_dir, dtype="auto")


def test_steps_below_the_crossover_run_exactly_fp32(tiny_auto, tiny_loaded):
    ids = tiny_loaded.tokenizer("The quick brown fox jumps")["input_ids"]
    small = ids[: BF16_MIN_ROWS - 1]
    fp32 = PagedHarness(tiny_loaded.model, seed=1).step({"a": small})["a"]
    auto = PagedHarness(tiny_auto.model, seed=1).step({"a": small})["a"]
    assert torch.equal(fp32, auto)


def test_steps_at_the_crossover_run_on_the_bf16_copies(tiny_auto, tiny_loaded):
    ids = tiny_loaded.tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"]
    assert len(ids) >= BF16_MIN_ROWS
    fp32 = PagedHarness(tiny_loaded.model, seed=1).step({"a": ids})["a"]
    auto = PagedHarness(tiny_auto.model, seed=1).step({"a": ids})["a"]
    assert not torch.equal(fp32, auto)  # bf16 rounding shows ...
    # ... and only that: logits here span about +-10, bf16 keeps ~3 significant digits
    assert (auto - fp32).abs().max() <= 0.02 * fp32.abs().max()
    assert (auto.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.9
    assert tiny_auto.model.model.layers[0].mlp.down_proj.weight_bf16.dtype == torch.bfloat16
    assert "weight_bf16" not in str(list(tiny_auto.model.state_dict()))


def test_auto_keeps_the_kv_cache_in_float32(tiny_auto):
    from engine.execution.model_runner import ModelRunner

    runner = ModelRunner(tiny_auto, num_kv_blocks=4, block_size=16)
    assert {t.dtype for pair in runner.kv_caches for t in pair} == {torch.float32}


def test_bad_bf16_min_rows_is_refused(tiny_loaded):
    with pytest.raises(ValueError, match="min_rows=0 must be >= 1"):
        tiny_loaded.model.keep_bf16_copies(0)


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_bf16_generation_agrees_with_fp32(dtype, amx_cpu, tiny_llama_dir):
    fp32 = _greedy(LLM(tiny_llama_dir, device="cpu", dtype="float32", num_kv_blocks=256))
    llm = LLM(tiny_llama_dir, device="cpu", dtype=dtype, num_kv_blocks=256)
    assert llm.loaded.dtype_plan.choice == dtype
    got = _greedy(llm)
    # a token that differs sends the rest of that sequence elsewhere: compare first tokens
    # and the fraction of identical positions
    assert [g[0] for g in got] == [f[0] for f in fp32]
    same = sum(a == b for g, f in zip(got, fp32, strict=True) for a, b in zip(g, f, strict=True))
    assert same / sum(len(f) for f in fp32) >= 0.8
    vocab = llm.loaded.hf_config.vocab_size
    assert all(0 <= t < vocab for g in got for t in g)


def test_llm_refuses_a_bad_dtype_and_a_dtype_for_a_loaded_model(tiny_loaded, tiny_llama_dir):
    with pytest.raises(ValueError, match="dtype='half' must be one of"):
        LLM(tiny_llama_dir, device="cpu", dtype="half")
    with pytest.raises(ValueError, match="applies only when LLM loads the model"):
        LLM(tiny_loaded, dtype="float32")


def test_llm_over_load_model_runs_as_llm_over_a_name(amx_cpu, tiny_llama_dir):
    """One default, "auto", for load_model as for LLM and `serve --dtype`: LLM(load_model(x))
    ran float32 while LLM(x) ran auto (3.3x slower on a bf16 CPU, and nothing said so)."""
    loaded = load_model(tiny_llama_dir)
    assert loaded.dtype_plan.choice == "auto" and loaded.dtype_plan.bf16_min_rows is not None
    by_name = LLM(tiny_llama_dir, num_kv_blocks=16)
    assert LLM(loaded, num_kv_blocks=16).loaded.dtype_plan == by_name.loaded.dtype_plan
