"""`batchpilot serve --dtype`: a bad value fails before anything loads; a good one (in any
case, or fp32 / bf16) reaches load_model, and the engine parts say which dtype the weights
run in (for the ready line)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from control.cli.main import main
from control.serve import bootstrap
from control.serve.bootstrap import build_parts
from control.serve.settings import ServeSettings
from engine.config import StaticConfig
from engine.config.dtype_option import parse_dtype_choice
from engine.models.cpu_dtype import kv_cache_dtype, resolve_dtype
from engine.models.projections import Projection
from kernels import cpu_prefill_amx, native_library


def test_a_bad_dtype_is_refused_before_anything_loads(capsys):
    assert main(["serve", "--dtype", "fp16", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "dtype='fp16' must be one of auto, float32, bfloat16" in err


def test_settings_validate_the_dtype():
    assert ServeSettings(dtype="bf16").validate().dtype == "bf16"
    with pytest.raises(ValueError, match="dtype='int4' must be one of"):
        ServeSettings(dtype="int4").validate()


def test_serve_help_lists_dtype(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--dtype" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["auto", "float32", "bfloat16"])
def test_the_dtype_reaches_load_model_and_the_parts(dtype, tiny_llama_dir, one_torch_thread):
    """The real load of the tiny checkpoint: the weights, the KV cache and the ready line
    are in the dtype asked for. An option that stopped reaching load_model would load its
    default instead: whatever that default is, the other two choices fail here."""
    settings = ServeSettings(model=str(tiny_llama_dir), device="cpu", dtype=dtype,
                             engine_overrides={"max_num_batched_tokens": 256,
                                               "prefill_chunk_size": 64})
    parts = build_parts(settings)
    loaded = parts.engine.executor.loaded
    expected = resolve_dtype(dtype, "cpu")  # auto: float32, + bf16 copies on AMX/AVX512-BF16
    assert loaded.dtype_plan == expected and expected.choice == dtype
    assert {p.dtype for p in loaded.model.parameters()} == {expected.dtype}
    kv = kv_cache_dtype("auto", expected.dtype, expected)  # bf16 beside native bf16 layers
    assert {k.dtype for k, _ in parts.engine.executor.kv_caches} == {kv}
    copies = [m.weight_bf16 for m in loaded.model.modules() if isinstance(m, Projection)]
    assert copies and all((c is not None) == (expected.bf16_min_rows is not None)
                          for c in copies)
    assert loaded.model.bf16_min_rows == expected.bf16_min_rows
    kv_name = str(kv).removeprefix("torch.")
    assert parts.weights == f"weights: {expected.describe()}; KV cache {kv_name}"
    if dtype != "auto":
        assert parts.weights == f"weights: {dtype} (asked for {dtype}); KV cache {dtype}"


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_the_kv_cache_dtype_reaches_the_caches_and_the_ready_line(kv, tiny_llama_dir,
                                                                   one_torch_thread):
    settings = ServeSettings(model=str(tiny_llama_dir), device="cpu",
                             engine_overrides={"kv_cache_dtype": kv,
                                               "max_num_batched_tokens": 256,
                                               "prefill_chunk_size": 64})
    parts = build_parts(settings)
    assert {k.dtype for k, _ in parts.engine.executor.kv_caches} == {getattr(torch, kv)}
    assert parts.weights.endswith(f"; KV cache {kv}")  # (head_dim 16: no AMX prefill)


def test_the_ready_line_says_when_long_prefills_run_on_amx(tiny_llama_dir, one_torch_thread,
                                                           monkeypatch):
    asked = []
    monkeypatch.setattr(cpu_prefill_amx, "serving_tiles",
                        lambda kv, head_dim: asked.append((kv, head_dim)) or "AMX")
    monkeypatch.setattr(native_library, "bf16_decode_tiles", lambda kv, head_dim: None)
    settings = ServeSettings(model=str(tiny_llama_dir), device="cpu",
                             engine_overrides={"kv_cache_dtype": "bfloat16",
                                               "max_num_batched_tokens": 256,
                                               "prefill_chunk_size": 64})
    parts = build_parts(settings)
    model = parts.engine.executor.loaded.model
    assert asked == [(torch.bfloat16, model.head_dim)]
    assert parts.weights.endswith("; KV cache bfloat16 (attention on AMX: long prefill chunks)")


def test_the_ready_line_says_when_decodes_run_on_amx(tiny_llama_dir, one_torch_thread,
                                                     monkeypatch):
    asked = []
    monkeypatch.setattr(cpu_prefill_amx, "serving_tiles", lambda kv, head_dim: None)
    monkeypatch.setattr(native_library, "bf16_decode_tiles",
                        lambda kv, head_dim: asked.append((kv, head_dim)) or "AMX")
    settings = ServeSettings(model=str(tiny_llama_dir), device="cpu",
                             engine_overrides={"kv_cache_dtype": "bfloat16"})
    parts = build_parts(settings)
    model = parts.engine.executor.loaded.model
    assert asked == [(torch.bfloat16, model.head_dim)]
    assert parts.weights.endswith(
        "; KV cache bfloat16 (attention on AMX: decodes over more than 16 keys)")


@pytest.mark.parametrize("prefill,decodes,note", [
    ("AMX", "AMX", " (attention on AMX: long prefill chunks, decodes over more than 16 keys)"),
    ("AVX512-BF16", None, " (attention on AVX512-BF16: long prefill chunks)"),
    ("AMX", "AVX512-BF16", " (attention on AMX: long prefill chunks; on AVX512-BF16: decodes"
                           " over more than 16 keys)"),
    (None, None, "")])
def test_the_ready_line_names_the_tiles_each_part_runs_on(monkeypatch, prefill, decodes, note):
    monkeypatch.setattr(cpu_prefill_amx, "serving_tiles", lambda kv, head_dim: prefill)
    monkeypatch.setattr(native_library, "bf16_decode_tiles", lambda kv, head_dim: decodes)
    assert bootstrap.bf16_attention_note(torch.bfloat16, 64) == note


def test_bf16_decodes_need_a_bf16_cache_and_a_head_dim_they_take():
    assert native_library.bf16_decode_tiles(torch.float32, 64) is None
    assert native_library.bf16_decode_tiles(torch.bfloat16, 80) is None
    with mock.patch.object(native_library, "AMX_DECODE", False):
        assert native_library.bf16_decode_tiles(torch.bfloat16, 64) is None


def test_a_bad_kv_cache_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="kv_cache_dtype.*one of auto, float32, bfloat16"):
        StaticConfig(kv_cache_dtype="int4").validate()


@pytest.mark.parametrize(("given", "choice"), [
    (None, "auto"), ("AUTO", "auto"), ("Float32", "float32"), ("FP32", "float32"),
    ("BF16", "bfloat16"), ("BFloat16", "bfloat16"), ("fp32", "float32")])
def test_a_dtype_is_read_in_any_case_and_by_its_short_name(given, choice):
    assert parse_dtype_choice(given) == choice
