"""The prepacked bf16 weights (engine/models/projections.py): equal bit for bit to the plain
bf16 matmul, what every bf16 step multiplies on, never in a state dict."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.paged import PagedHarness

from engine.models import load_model, projections
from engine.models.projections import Projection

ONEDNN_PACKS_BF16 = (torch.backends.mkldnn.is_available()
                     and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def projection(seed: int, bias: bool = True) -> Projection:
    torch.manual_seed(seed)
    proj = Projection(96, 160, bias=bias)
    proj.keep_bf16_copy(True)
    return proj


def test_packing_follows_what_onednn_takes_here():
    # a CPU without native bf16 keeps the plain copy only; this CPU (CI's too) packs
    proj = projection(0)
    assert (proj.weight_packed is not None) == ONEDNN_PACKS_BF16
    proj.keep_bf16_copy(False)
    assert proj.weight_bf16 is None and proj.weight_packed is None


@pytest.mark.parametrize("rows", [1, 3, 64, 256, 257, 600, 1346, 2048])
def test_packed_equals_the_plain_bf16_matmul_bit_for_bit(rows):
    proj = projection(1)
    x = torch.randn(rows, 96)
    plain = F.linear(x.to(torch.bfloat16), proj.weight_bf16) + proj.bias
    assert torch.equal(proj(x, bf16=True), plain)


def test_the_packed_copy_is_what_every_step_multiplies_on():
    """Swap in another weight's pack: steps of any size follow it (prefill steps of
    thousands of rows too: oneDNN's plain-weight path is slower there, projections.py)."""
    if not ONEDNN_PACKS_BF16:
        assert projection(2).weight_packed is None
        return
    proj, other = projection(2, bias=False), projection(3, bias=False)
    proj.weight_packed = other.weight_packed
    for rows in (1, 256, 257, 2048):
        x = torch.randn(rows, 96)
        assert torch.equal(proj(x, bf16=True), F.linear(x.to(torch.bfloat16), other.weight_bf16))


def test_pack_weights_off_keeps_the_plain_path(monkeypatch):
    monkeypatch.setattr(projections, "PACK_WEIGHTS", False)
    assert projection(4).weight_packed is None


def test_a_model_on_packed_weights_gives_the_same_logits(tiny_llama_dir, monkeypatch):
    packed = load_model(tiny_llama_dir, dtype="float32")
    packed.model.keep_bf16_copies(1)
    monkeypatch.setattr(projections, "PACK_WEIGHTS", False)
    plain = load_model(tiny_llama_dir, dtype="float32")
    plain.model.keep_bf16_copies(1)
    head = packed.model.lm_head
    assert (head.weight_packed is not None) == ONEDNN_PACKS_BF16
    assert plain.model.lm_head.weight_packed is None
    prompts = {"a": list(range(5, 29)), "b": list(range(40, 47))}
    ours = PagedHarness(packed.model, seed=1).step(prompts)
    theirs = PagedHarness(plain.model, seed=1).step(prompts)
    for name in prompts:
        assert torch.equal(ours[name], theirs[name])
    assert not any("packed" in key for key in packed.model.state_dict())


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_float_forward_is_forward_widened(bf16, bias):
    """What compute_logits takes: forward's values as float32, on every path."""
    proj = projection(6, bias=bias)
    for rows in (1, 300):
        x = torch.randn(rows, 96)
        wide = proj.float_forward(x, bf16)
        assert wide.dtype == torch.float32
        assert torch.equal(wide, proj(x, bf16).float())
