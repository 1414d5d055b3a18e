"""Fused qkv_proj / gate_up_proj: loaded from transformers' names, equal to the separate
projections, and given back under transformers' names (state_dict, saved checkpoints)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.paged import PagedHarness, hf_logits

from engine.models import build_model, load_model, save_checkpoint

ATOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request):
    directory = request.getfixturevalue(f"tiny_{request.param}_dir")
    return load_model(directory, dtype="float32", keep_reference=True)  # exact parity


def test_fused_weights_are_the_transformers_rows_stacked(tiny):
    ours, theirs = tiny.model.model.layers[1], tiny.reference.model.layers[1]
    attn = theirs.self_attn
    for kind in ["weight", "bias"] if attn.q_proj.bias is not None else ["weight"]:
        parts = [getattr(getattr(attn, p), kind) for p in ("q_proj", "k_proj", "v_proj")]
        assert torch.equal(getattr(ours.self_attn.qkv_proj, kind), torch.cat(parts))
    mlp = theirs.mlp
    assert torch.equal(ours.mlp.gate_up_proj.weight,
                       torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))


def test_fused_projection_equals_separate_ones(tiny):
    attn = tiny.reference.model.layers[0].self_attn
    x = torch.randn(7, tiny.hf_config.hidden_size, generator=torch.Generator().manual_seed(0))
    fused = tiny.model.model.layers[0].self_attn.qkv_proj(x)
    separate = torch.cat([F.linear(x, p.weight, p.bias)
                          for p in (attn.q_proj, attn.k_proj, attn.v_proj)], dim=-1)
    torch.testing.assert_close(fused, separate, atol=1e-6, rtol=0)


def test_fused_model_matches_transformers_logits(tiny):
    ids = tiny.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]
    ours = PagedHarness(tiny.model, block_size=4, seed=5).step({"a": ids})["a"]
    reference = hf_logits(tiny.reference, ids)
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_state_dict_has_transformers_names_and_round_trips(tiny):
    state = tiny.model.state_dict()
    expected = {k for k in tiny.reference.state_dict() if not k.endswith("inv_freq")}
    assert set(state) == expected
    rebuilt = build_model(type(tiny.model), tiny.hf_config, dict(state), torch.float32,
                          torch.device("cpu"))
    for (name, a), (_, b) in zip(tiny.model.named_parameters(), rebuilt.named_parameters(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_saved_checkpoint_loads_in_transformers(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    out = save_checkpoint(tiny, tmp_path / "saved")
    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = tiny.tokenizer("Hello world! How are you today?")["input_ids"]
    assert torch.equal(hf_logits(hf, ids), hf_logits(tiny.reference, ids))


def test_a_state_dict_missing_one_part_is_refused_by_name(tiny):
    state = dict(tiny.model.state_dict())
    del state["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="missing.*qkv_proj.weight.*unexpected.*q_proj.weight"):
        build_model(type(tiny.model), tiny.hf_config, state, torch.float32,
                    torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_once_per_step_is_bit_equal_to_apply_rotary(dtype):
    from engine.models.llama import rope_for_rotate, rotate
    from engine.models.rope import apply_rotary

    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, 9, 16, generator=gen).to(dtype)
    x = qkv[:, :6]  # strided, as the q/k heads of a fused qkv output
    cos, sin = torch.randn(5, 16, generator=gen).to(dtype), torch.randn(5, 16, generator=gen)
    sin = sin.to(dtype)
    assert torch.equal(rotate(x, *rope_for_rotate(cos, sin)), apply_rotary(x, cos, sin))


def test_fp32_rms_norm_is_bit_equal_to_the_transformers_formula():
    from engine.models.llama import RMSNorm

    gen = torch.Generator().manual_seed(4)
    norm = RMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(576, generator=gen))
    x = 3 * torch.randn(33, 576, generator=gen)
    by_hand = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(norm(x), by_hand)
