"""The native decode layers on GGUF blocks (kernels/cpu_quant_dot.c, engine/models/gguf_blocks.py).

The blocks decode to exactly the float32 weights the model holds, so a step on them must
equal the torch layers' float32 step within float32 summation-order rounding: the same
tolerance as the float32 native layers (tests/kernels/test_cpu_layers.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.native_steps import assert_same_step, decode_step, run
from gguf import GGMLQuantizationType, quants

from bench.quantized_models import quantize_to_gguf
from engine.models import load_model
from engine.models.gguf_blocks import PROJECTION_PARTS, attach_gguf_blocks
from kernels import cpu_layers

# skips where the library did not build, fails under CI (conftest.py)
pytestmark = pytest.mark.usefixtures("native_library")


@pytest.mark.parametrize("gguf_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("width", [96, 256, 576, 16416])
def test_blocks_decode_and_project_as_gguf_py_decodes_them(gguf_type, width):
    """Decoding equals gguf-py's bit for bit; the GEMV equals x @ decoded.T at row counts
    around its 8-row groups and with an odd number of output rows (its 1-row tail). Widths:
    Q4_1 rows convert their blocks' scales 8 at a time first, so whole eights (256), a
    remainder (96, 576) and rows past that pass's 512 blocks (16416: scales inline)."""
    rng = np.random.default_rng(width)
    weights = rng.standard_normal((37, width), dtype=np.float32)
    qtype = getattr(GGMLQuantizationType, gguf_type)
    blocks = torch.from_numpy(quants.quantize(weights, qtype))
    decoded = torch.from_numpy(quants.dequantize(blocks.numpy(), qtype).astype(np.float32))
    assert torch.equal(cpu_layers.dequantize_rows(blocks, gguf_type, width), decoded)
    bias = torch.randn(37)
    for rows in (1, 3, 8, 9, 17):
        x = torch.randn(rows, width)
        got = cpu_layers.project_rows(blocks, bias, x, gguf_type)
        expected = (x.double() @ decoded.double().T + bias.double()).float()
        tol = 2e-5 * (width / 96) ** 0.5  # float32 sums of `width` terms, another order
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="in_features"):
        cpu_layers.project_rows(blocks, None, torch.randn(1, 64), gguf_type)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_layers.dequantize_rows(blocks, gguf_type, 100)


@pytest.fixture(params=["llama", "qwen2"])
def quantized(request, tiny_llama_dir, tiny_qwen2_dir, tmp_path):
    """(model rounded to Q4_1 with a Q8_0 head, the GGUF file of its blocks)."""
    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]
    model = load_model(path, dtype=torch.float32).model
    return model, quantize_to_gguf(model, tmp_path / "blocks.gguf")


@pytest.mark.parametrize("rows", [1, 5, cpu_layers.NATIVE_GGUF_MAX_ROWS])
def test_steps_on_gguf_blocks_match_the_float32_torch_layers(quantized, rows):
    model, path = quantized
    step = decode_step(model, rows, seed=rows)
    reference = run(model, step, native=False)
    assert attach_gguf_blocks(model, path).startswith("GGUF Q4_1 blocks")
    assert model.gguf_layers_type == "Q4_1" and model.lm_head.gguf_type == "Q8_0"
    tables = []
    original = cpu_layers.decode_layers

    def recording(table, *args):
        tables.append(table)
        return original(table, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_layers, "decode_layers", recording)
        native = run(model, step, native=True)
    assert [t.weights_format for t in tables] == [cpu_layers.GGUF_FORMATS["Q4_1"]]
    assert_same_step(native, reference, 2e-5)


def test_logits_of_small_steps_come_from_the_head_blocks(quantized):
    model, path = quantized
    hidden = torch.randn(cpu_layers.NATIVE_GGUF_LOGITS_MAX_ROWS + 1, model.config.hidden_size)
    expected = hidden @ model.lm_head.weight.detach().T
    attach_gguf_blocks(model, path)
    calls = []
    original = cpu_layers.project_rows

    def recording(weight, *args, **kwargs):
        calls.append(weight.dtype)
        return original(weight, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, torch.inference_mode():
        patch.setattr(cpu_layers, "project_rows", recording)
        small = model.compute_logits(hidden[:cpu_layers.NATIVE_GGUF_LOGITS_MAX_ROWS])
        big = model.compute_logits(hidden)
    assert calls == [torch.uint8]  # the bigger step ran on oneDNN
    torch.testing.assert_close(small, expected[:len(small)], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(big, expected, atol=2e-5, rtol=2e-5)


def test_blocks_that_do_not_decode_to_the_weights_are_not_attached(quantized):
    """A weight that differs from its blocks (here one element of the last layer's
    down_proj) keeps the whole model off the blocks: the check is exact, not a tolerance."""
    model, path = quantized
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight[0, 0] += 1e-6
    assert attach_gguf_blocks(model, path) is None
    assert model.gguf_layers_type is None
    assert all(layer.mlp.down_proj.weight_gguf is None for layer in model.model.layers)


@pytest.mark.parametrize("overrides", ["within_a_projection", "between_layers"])
def test_a_file_that_mixes_block_types_keeps_the_model_off_the_blocks(
        overrides, tiny_llama_dir, tmp_path):
    """llama.cpp can give single tensors another type (its per-tensor overrides): a fused
    projection whose parts differ cannot be one table of blocks, and layers of two types
    cannot run one kernel; either way the file's blocks are left alone and the model loads
    (its float32 weights, exactly what the file holds) instead of failing."""
    model = load_model(tiny_llama_dir, dtype=torch.float32).model
    last = len(model.model.layers) - 1
    assert last >= 1, "the tiny model needs two layers for this test"
    tensor_types = ({"blk.0.attn_v": "Q8_0"} if overrides == "within_a_projection" else
                    {f"blk.{last}.{part}": "Q8_0" for _, parts in PROJECTION_PARTS
                     for part in parts})
    path = quantize_to_gguf(model, tmp_path / "mixed.gguf", tensor_types=tensor_types)
    assert attach_gguf_blocks(model, path) is None
    assert model.gguf_layers_type is None
    assert all(proj.weight_gguf is None for layer in model.model.layers
               for proj in (layer.self_attn.qkv_proj, layer.mlp.down_proj))
