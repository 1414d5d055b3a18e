"""The native decode layers (kernels/cpu_layers.c via engine/models/native_decode.py)
against the model's own torch layers, on the tiny Llama (no biases) and Qwen2 (qkv bias).

Caches are random-filled and block ids reversed, so a wrong block, slot, head or row
changes the result. The bf16 path reads bf16 weights with float32 activations, which no
torch path does: it is checked against the float32 layers run on the bf16-rounded weights.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from fixtures.native_steps import BLOCK_SIZE, assert_same_step, decode_step, run

from engine.models import native_decode
from engine.models.attention import build_attention_metadata
from engine.models.llama import rope_for_rotate
from kernels import cpu_layers, use_attention_backend

# skips where the library did not build, fails under CI (conftest.py)
needs_native = pytest.mark.usefixtures("native_library")


@pytest.fixture(autouse=True)
def every_row_count(monkeypatch):
    """Every step the kernel can take goes native here, not only those it is faster at."""
    monkeypatch.setattr(cpu_layers, "NATIVE_MAX_ROWS", cpu_layers.MAX_ROWS)


@needs_native
@pytest.mark.parametrize("rows", [1, 2, 5, 13, cpu_layers.MAX_ROWS])
def test_float32_layers_match_the_torch_layers(model, rows):
    step = decode_step(model, rows, seed=rows)
    assert_same_step(run(model, step, native=True), run(model, step, native=False), 2e-5)


@needs_native
@pytest.mark.parametrize("rows", [1, 6])
def test_a_bf16_cache_is_written_and_read_as_the_torch_layers_do(model, rows):
    """kv_cache_dtype bfloat16: the native layers round K and V into the cache as torch's
    .to(bfloat16) does and attend over it in float32.

    K and V are float32 sums in another order before rounding, so a value within float32
    noise of a rounding midpoint may round the other way: one bf16 step (2**-8 to 2**-7 of
    the value), seen on 1 element of 5376 on an AVX2-only CPU. A different rounding rule
    (truncation) would move about half of them; the rounding itself is checked bit for bit
    in test_cpu_elementwise.py."""
    step = decode_step(model, rows, seed=20 + rows, cache_dtype=torch.bfloat16)
    native, torch_layers = run(model, step, native=True), run(model, step, native=False)
    assert native[1][0][0].dtype == torch.bfloat16
    torch.testing.assert_close(native[0], torch_layers[0], atol=2e-5, rtol=2e-5)
    for ours, theirs in zip(native[1], torch_layers[1], strict=True):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a.float(), b.float(), atol=1e-6, rtol=2.0 ** -7)
            assert (a != b).float().mean().item() < 0.01


@needs_native
@pytest.mark.parametrize("rows", [1, 4])
def test_bf16_weights_match_float32_layers_on_the_rounded_weights(model, rows):
    step = decode_step(model, rows, seed=10 + rows)
    model.keep_bf16_copies(1)
    try:
        native = run(model, step, native=True)
    finally:
        model.keep_bf16_copies(None)
    rounded = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("proj.weight"):
                    p.copy_(p.to(torch.bfloat16).float())
        reference = run(model, step, native=False)
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(rounded[name])
    assert_same_step(native, reference, 2e-5)


@needs_native
def test_steps_the_kernel_does_not_take_run_the_torch_layers(model):
    """A prefill row, more rows than the kernel holds, another attention backend, a slot
    outside the cache, or index tensors of another type: the torch layers run."""
    ids, positions, meta, caches = decode_step(model, 2)
    prefill_positions, prefill_meta = build_attention_metadata([[0, 1]], [6], [3], BLOCK_SIZE)
    many_ids, many_positions, many_meta, many_caches = decode_step(model,
                                                                   cpu_layers.MAX_ROWS + 1)
    for args in ((torch.tensor([1, 2, 3]), prefill_positions, caches, prefill_meta),
                 (many_ids, many_positions, many_caches, many_meta)):
        with mock.patch.object(cpu_layers, "decode_layers") as spy, torch.inference_mode():
            model(*args)
        assert spy.call_count == 0
    use_attention_backend(model, "reference")  # a backend asked for by name is honoured
    try:
        with mock.patch.object(cpu_layers, "decode_layers") as spy, torch.inference_mode():
            model(ids, positions, caches, meta)
        assert spy.call_count == 0
    finally:
        use_attention_backend(model, "cpu")
    rope = rope_for_rotate(*model.model.rotary_emb(positions, torch.float32))
    # a slot outside the cache; context lengths as int64 (C reads int32: every other 0)
    for bad in (dataclasses.replace(meta, slot_mapping=torch.tensor([0, 10_000])),
                dataclasses.replace(meta, context_lens=meta.context_lens.long())):
        with torch.inference_mode():
            assert not native_decode.run_native_decode(
                model, model.model.embed_tokens(ids), rope, caches, bad, False)


@needs_native
def test_a_context_block_past_the_end_of_the_cache_is_not_read_natively(model):
    """C reads raw memory: a block table naming the block one past the cache's last (as a
    context block, not the one the step writes) keeps the step off the native layers."""
    ids, positions, meta, caches = decode_step(model, 2)
    rope = rope_for_rotate(*model.model.rotary_emb(positions, torch.float32))
    tables = meta.block_tables.clone()
    assert meta.context_lens[1] > BLOCK_SIZE  # block index 0 of seq 1 is context only
    tables[1, 0] = caches[0][0].shape[0]
    bad = dataclasses.replace(meta, block_tables=tables)
    with torch.inference_mode():
        assert not native_decode.run_native_decode(
            model, model.model.embed_tokens(ids), rope, caches, bad, False)
        assert native_decode.run_native_decode(
            model, model.model.embed_tokens(ids), rope, caches, meta, False)


@needs_native
@pytest.mark.parametrize("rows", [1, 3, cpu_layers.NATIVE_LOGITS_MAX_ROWS + 1])
def test_small_steps_logits_come_from_the_native_gemv(model, rows):
    """Up to NATIVE_LOGITS_MAX_ROWS rows: lm_head by the layers' GEMV, equal to torch's
    (fp32), and on the bf16 copy equal to fp32 on the rounded weight (fp32 activations)."""
    hidden = torch.randn(rows, model.config.hidden_size,
                         generator=torch.Generator().manual_seed(rows))
    native = rows <= cpu_layers.NATIVE_LOGITS_MAX_ROWS
    with mock.patch.object(cpu_layers, "project_rows",
                           wraps=cpu_layers.project_rows) as spy, torch.inference_mode():
        got = model.compute_logits(hidden)
        model.keep_bf16_copies(1)
        try:
            got_bf16 = model.compute_logits(hidden)
        finally:
            model.keep_bf16_copies(None)
    assert spy.call_count == (2 if native else 0)
    weight = model.lm_head.weight.detach()
    torch.testing.assert_close(got, hidden @ weight.T, atol=2e-5, rtol=2e-5)
    if native:
        rounded = weight.to(torch.bfloat16).float()
        torch.testing.assert_close(got_bf16, hidden @ rounded.T, atol=2e-5, rtol=2e-5)


@needs_native
def test_what_the_kernel_cannot_read_is_refused_before_c_reads_it():
    """C reads raw pointers: a cache of another element type, or more rows than its
    buffers hold, must be a ValueError here, not garbage or a read past the end."""
    weight, x = torch.randn(8, 32), torch.randn(cpu_layers.MAX_ROWS + 1, 32)
    torch.testing.assert_close(cpu_layers.project_rows(weight, None, x[:3]), x[:3] @ weight.T,
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=f"must be in 1..{cpu_layers.MAX_ROWS}"):
        cpu_layers.project_rows(weight, None, x)
    cache = torch.zeros(2, 16, 1, 8, dtype=torch.float16)
    layer = cpu_layers.LayerTensors(weight, weight, weight, weight, None, None, None, None,
                                    torch.ones(32), torch.ones(32), cache, cache)
    with pytest.raises(ValueError, match="float32 or bfloat16 only"):
        cpu_layers.layer_table([layer])
