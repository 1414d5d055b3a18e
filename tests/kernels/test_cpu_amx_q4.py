"""The AMX kernel over Q4_1 tiles (kernels/cpu_amx_q4.c): the tiled layout holds exactly
the blocks' weights, the product equals oneDNN's bf16 product on the bf16-rounded weights
within one bf16 rounding of the output, at every row count 1..64 around its 16-row groups,
and a GGUF model's projections use it for the steps it takes.

Tests of the kernel itself need AMX: they skip on a CPU without it and fail under CI on
one that has it (fixtures/native_build.require_amx)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fixtures.native_build import require_amx
from gguf import GGMLQuantizationType, quants

from bench.quantized_models import quantize_to_gguf
from engine.models import load_model
from engine.models.gguf_blocks import attach_gguf_blocks
from kernels import cpu_amx_q4

# skips where the library did not build, fails under CI (conftest.py)
pytestmark = pytest.mark.usefixtures("native_library")


@pytest.fixture
def amx() -> None:
    require_amx()


def q4_blocks(rows: int, cols: int, seed: int,
              gguf_type: str = "Q4_1") -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 blocks of gguf_type [rows, cols / 32 * block bytes], the float32 weights they
    decode to)."""
    qtype = getattr(GGMLQuantizationType, gguf_type)
    weights = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
    blocks = quants.quantize(weights, qtype)
    decoded = quants.dequantize(blocks, qtype).astype(np.float32)
    return torch.from_numpy(blocks), torch.from_numpy(decoded)


@pytest.mark.parametrize("gguf_type", ["Q4_1", "Q8_0"])
def test_tiles_hold_the_blocks_weights_exactly(gguf_type):
    blocks, decoded = q4_blocks(48, 96, seed=0, gguf_type=gguf_type)
    tiles = cpu_amx_q4.pack(blocks, 96, gguf_type)
    assert tiles.numel() == 48 // 16 * 96 // 32 * cpu_amx_q4.TILE_BYTES[gguf_type]
    assert torch.equal(cpu_amx_q4.unpack(tiles, 48, 96, gguf_type), decoded)


def test_sizes_that_do_not_tile_are_refused():
    blocks, _ = q4_blocks(40, 64, seed=1)  # 40 rows: not a multiple of 16
    with pytest.raises(ValueError, match="do not tile"):
        cpu_amx_q4.pack(blocks, 64)
    assert not cpu_amx_q4.packs(40, 64) and cpu_amx_q4.packs(48, 64)


@pytest.mark.parametrize("gguf_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 33, 48, 64])
def test_product_equals_onednn_on_the_bf16_weights(amx, rows, gguf_type):
    blocks, decoded = q4_blocks(64, 160, seed=rows, gguf_type=gguf_type)
    tiles = cpu_amx_q4.pack(blocks, 160, gguf_type)
    x = torch.randn(rows, 160).to(torch.bfloat16)  # whole 16-row groups: read in place
    got = cpu_amx_q4.matmul(x, tiles, 64, gguf_type)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 64)
    exact = F.linear(x.to(torch.bfloat16).double(), decoded.to(torch.bfloat16).double())
    # float32 sums in another order, then one rounding to bf16 (a relative 2^-8 at most)
    assert ((got.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-3).all()


@pytest.mark.parametrize("gguf_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 16, 23, 64])
def test_float32_out_is_the_bf16_product_widened(amx, rows, gguf_type):
    blocks, _ = q4_blocks(48, 96, seed=rows + 7, gguf_type=gguf_type)
    tiles = cpu_amx_q4.pack(blocks, 96, gguf_type)
    x = torch.randn(rows, 96)
    wide = cpu_amx_q4.matmul(x, tiles, 48, gguf_type, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and wide.shape == (rows, 48)
    assert torch.equal(wide, cpu_amx_q4.matmul(x, tiles, 48, gguf_type).float())
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        cpu_amx_q4.matmul(x, tiles, 48, gguf_type, out_dtype=torch.float16)


def test_too_many_rows_are_refused(amx):
    blocks, _ = q4_blocks(16, 32, seed=2)
    with pytest.raises(ValueError, match="outside the AMX kernel"):
        cpu_amx_q4.matmul(torch.randn(cpu_amx_q4.MAX_ROWS + 1, 32), cpu_amx_q4.pack(blocks, 32),
                          16)


def test_a_gguf_model_multiplies_mid_sized_steps_on_the_tiles(amx, tiny_llama_dir, tmp_path,
                                                                monkeypatch):
    model = load_model(tiny_llama_dir, dtype=torch.float32).model
    path = quantize_to_gguf(model, tmp_path / "blocks.gguf")  # rounds the model to Q4_1
    model.keep_bf16_copies(1)
    described = attach_gguf_blocks(model, path)
    proj = model.model.layers[0].mlp.gate_up_proj
    assert cpu_amx_q4.packs(*proj.weight.shape)  # the tiny model's sizes tile
    assert "on AMX for steps of <= 64 rows" in described
    assert torch.equal(cpu_amx_q4.unpack(proj.weight_tiles, *proj.weight.shape),
                       proj.weight)  # the tiles are the model's own weights
    x = torch.randn(12, proj.in_features)
    on_tiles = proj(x, bf16=True)
    monkeypatch.setattr(cpu_amx_q4, "ENABLED", False)
    torch.testing.assert_close(on_tiles.float(), proj(x, bf16=True).float(), atol=2e-2,
                               rtol=2e-2)  # oneDNN on the bf16 copy
    monkeypatch.setattr(cpu_amx_q4, "ENABLED", True)
    other, decoded = q4_blocks(proj.out_features, proj.in_features, seed=3)
    proj.weight_tiles = cpu_amx_q4.pack(other, proj.in_features)  # the step reads these
    expected = F.linear(x.to(torch.bfloat16), decoded.to(torch.bfloat16))
    torch.testing.assert_close(proj(x, bf16=True).float(), expected.float(), atol=2e-2,
                               rtol=2e-2)
    assert proj(torch.randn(cpu_amx_q4.MAX_ROWS + 1, proj.in_features), bf16=True).shape[0] \
        == cpu_amx_q4.MAX_ROWS + 1  # more rows: oneDNN again


def test_the_heads_q8_0_blocks_are_tiled_and_multiply_steps_past_the_native_gemv(
        amx, tiny_llama_dir, tmp_path, monkeypatch):
    """The head's Q8_0 blocks tile too: steps of more rows than the native GEMV takes
    compute their logits on them, within bf16 rounding of oneDNN on the bf16 copy."""
    from kernels import cpu_layers

    model = load_model(tiny_llama_dir, dtype=torch.float32).model
    path = quantize_to_gguf(model, tmp_path / "blocks.gguf")  # a Q8_0 head
    model.keep_bf16_copies(1)
    assert "(lm_head Q8_0, on AMX)" in attach_gguf_blocks(model, path)
    head = model.lm_head
    assert torch.equal(cpu_amx_q4.unpack(head.weight_tiles, *head.weight.shape, "Q8_0"),
                       head.weight)
    hidden = torch.randn(cpu_layers.NATIVE_GGUF_LOGITS_MAX_ROWS + 3, head.in_features)
    calls = []
    original = cpu_amx_q4.matmul

    def recording(x, tiles, out_features, gguf_type="Q4_1", out_dtype=torch.bfloat16):
        calls.append((gguf_type, out_dtype))
        return original(x, tiles, out_features, gguf_type, out_dtype)

    monkeypatch.setattr(cpu_amx_q4, "matmul", recording)
    with torch.inference_mode():
        on_tiles = model.compute_logits(hidden)
        monkeypatch.setattr(cpu_amx_q4, "ENABLED", False)
        on_onednn = model.compute_logits(hidden)
    assert calls == [("Q8_0", torch.float32)]  # float32 logits written by the kernel
    assert on_tiles.dtype == on_onednn.dtype == torch.float32
    torch.testing.assert_close(on_tiles, on_onednn, atol=2e-2, rtol=2e-2)
    assert torch.equal(on_tiles, head(hidden, bf16=True).float())  # what .float() gave


@pytest.mark.parametrize("rows", [4, 17, 50])
def test_small_decode_steps_of_a_gguf_model_run_natively_on_the_tiles(amx, tiny_llama_dir,
                                                                        tmp_path, rows):
    """A step of NATIVE_TILES_MIN_ROWS..MAX_ROWS decodes runs the native layers on the tiles
    (4 rows: part of one 16-row group; 17: two; 50: four). They round only the projections'
    inputs to bf16, so the step stays within bf16 rounding of the same native layers on the
    blocks in float32; a step of fewer rows stays on the blocks."""
    from fixtures.native_steps import decode_step, run

    from kernels import cpu_layers

    model = load_model(tiny_llama_dir, dtype=torch.float32).model
    path = quantize_to_gguf(model, tmp_path / "blocks.gguf")
    model.keep_bf16_copies(1)
    attach_gguf_blocks(model, path)
    assert model.model.layers[0].self_attn.qkv_proj.weight_tiles is not None
    assert cpu_layers.NATIVE_TILES_MIN_ROWS <= rows <= cpu_layers.NATIVE_TILES_MAX_ROWS
    fewer = decode_step(model, cpu_layers.NATIVE_TILES_MIN_ROWS - 1)  # the most the blocks take
    step = decode_step(model, rows, seed=rows)
    formats = []
    original = cpu_layers.decode_layers

    def recording(table, *args):
        formats.append(table.weights_format)
        return original(table, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_layers, "decode_layers", recording)
        tiles = run(model, step, native=True)
        with pytest.MonkeyPatch.context() as on_blocks:
            on_blocks.setattr(cpu_layers, "NATIVE_TILES_MIN_ROWS", rows + 1)
            on_blocks.setattr(cpu_layers, "NATIVE_GGUF_MAX_ROWS", cpu_layers.MAX_ROWS)
            blocks = run(model, step, native=True)
        run(model, fewer, native=True)
    assert formats == [cpu_layers.FORMAT_Q4_TILES, cpu_layers.GGUF_FORMATS["Q4_1"],
                       cpu_layers.GGUF_FORMATS["Q4_1"]]
    scale = blocks[0].abs().max()
    assert (tiles[0] - blocks[0]).abs().max() <= 2e-2 * scale  # bf16 inputs: ~2^-9 each
    for (kt, vt), (kb, vb) in zip(tiles[1], blocks[1], strict=True):
        torch.testing.assert_close(kt, kb, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(vt, vb, atol=2e-2, rtol=2e-2)
