"""bench.roofline_steps counts the weight bytes a step streams on its own dtype path: the
bf16 copies (non-persistent buffers, not parameters) on steps that use them, fp32 otherwise."""

from __future__ import annotations

import pytest
import torch

from bench.random_models import tiny_checkpoint
from bench.roofline_steps import StepShape, linear_weights, model_info, streamed_weights
from engine.models import load_model


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_checkpoint(tmp_path_factory.mktemp("tiny")))


def test_steps_stream_the_copy_their_row_count_selects(tiny):
    loaded = load_model(tiny, dtype="float32")
    loaded.model.keep_bf16_copies(4)  # what dtype auto does on an AMX CPU
    fp32 = dict(linear_weights(loaded.model))
    single = streamed_weights(loaded.model, StepShape("decode x1", 1, 16, 0))
    assert [w.dtype for _, w, _ in single] == [torch.float32] * len(fp32)
    assert nbytes(w for _, w, _ in single) == nbytes(fp32.values())
    batched = {n: (w, rows) for n, w, rows in
               streamed_weights(loaded.model, StepShape("decode x8", 8, 16, 0))}
    for name, (weight, rows) in batched.items():
        assert weight.dtype == torch.bfloat16 and rows == 8, name
    # a prefill chunk samples one row: lm_head stays fp32, the layers take bf16
    chunk = {n: w for n, w, _ in streamed_weights(loaded.model, StepShape("p", 0, 0, 16))}
    assert chunk["lm_head"].dtype == torch.float32
    assert {w.dtype for n, w in chunk.items() if n != "lm_head"} == {torch.bfloat16}
    info = model_info(loaded)  # resident: fp32 weights plus their bf16 copies
    assert info["linear_weight_bytes"] == nbytes(fp32.values()) * 3 // 2
    assert info["weight_dtypes"] == ["bfloat16", "float32"]


def test_without_copies_every_step_streams_fp32(tiny):
    loaded = load_model(tiny, dtype="float32")
    streamed = streamed_weights(loaded.model, StepShape("decode x64", 64, 16, 0))
    assert {w.dtype for _, w, _ in streamed} == {torch.float32}
    assert model_info(loaded)["weight_dtypes"] == ["float32"]
