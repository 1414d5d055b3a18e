"""The fused work between projections (kernels/cpu_elementwise.c via
engine/models/fused_layers.py): each call against the torch ops it replaces, and whole
steps (prefill chunks with decodes, large decode batches) against the torch layers.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from fixtures.native_steps import BLOCK_SIZE, paged_step

from engine.models import fused_layers
from engine.models.llama import rope_for_rotate, rotate
from kernels import cpu_elementwise, cpu_layers, use_attention_backend

# skips where the library did not build, fails under CI (conftest.py)
pytestmark = pytest.mark.usefixtures("native_library")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("delta_dtype", [None, torch.float32, torch.bfloat16])
def test_add_rmsnorm_is_the_residual_add_then_rms_norm(out_dtype, delta_dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 70, generator=gen)
    weight = 1 + 0.1 * torch.randn(70, generator=gen)
    delta = None if delta_dtype is None else torch.randn(37, 70, generator=gen).to(delta_dtype)
    expected_x = x if delta is None else x + delta
    expected = F.rms_norm(expected_x, (70,), weight, 1e-5).to(out_dtype)
    got = cpu_elementwise.add_rmsnorm(x, delta, weight, 1e-5, out_dtype)
    torch.testing.assert_close(x, expected_x, atol=0, rtol=0)  # the add: exact, in place
    assert got.dtype == out_dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=1e-5, rtol=8e-3)
    if delta is not None:
        assert cpu_elementwise.add_rmsnorm(x, delta, None, 1e-5, out_dtype) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_is_swiglu(dtype):
    gate_up = torch.randn(33, 2 * 45, generator=torch.Generator().manual_seed(1)).to(dtype)
    gate, up = gate_up.float().split(45, dim=-1)
    got = cpu_elementwise.silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (33, 45)
    torch.testing.assert_close(got.float(), (F.silu(gate) * up).to(dtype).float(),
                               atol=1e-6, rtol=8e-3)


def test_takes_says_yes_only_to_sizes_the_kernels_take():
    """A layer whose SwiGLU row (gate, up and product: 3 x intermediate) is wider than the
    kernel's buffer is left to torch (TinyLlama's 5632 is), rather than fused and refused
    mid-step."""
    inter = cpu_elementwise.ROW_MAX // 3  # 5461: 3 x 5461 fits
    assert cpu_elementwise.takes(2048, inter, 32, 4, 64)
    assert not cpu_elementwise.takes(2048, inter + 1, 32, 4, 64)
    assert not cpu_elementwise.takes(2048, 5632, 32, 4, 64)
    with pytest.raises(ValueError, match="intermediate size"):  # what fusing it would do
        cpu_elementwise.silu_mul(torch.zeros(1, 2 * (inter + 1)))


@pytest.mark.parametrize("width", [1, 48])  # the scalar loop; 16-lane vectors
def test_silu_mul_is_accurate_over_the_range_and_at_the_edges(width):
    """The kernel's own exp (no libm) and reciprocal against float64 silu: a dense sweep,
    the clamp's edge (|g| near 87) and far past it; a NaN stays NaN."""
    sweep = torch.linspace(-40, 40, 20043)  # with the edges: 437 rows of 48
    edges = torch.tensor([-1e30, -1e4, -100.0, -88.0, -87.5, -87.0, -86.9, -1e-30, -0.0, 0.0,
                          1e-30, 86.9, 87.0, 88.0, 100.0, 1e4, 1e30, 0.5, -0.5, 3.0, -3.0])
    gate = torch.cat((sweep, edges)).reshape(-1, width)  # I = width
    got = cpu_elementwise.silu_mul(torch.cat((gate, torch.ones_like(gate)), dim=1))
    expected = F.silu(gate.double()).float()
    torch.testing.assert_close(got, expected, atol=1e-30, rtol=2e-6)
    nan = torch.ones(1, 2 * width)
    nan[0, 0] = float("nan")
    assert torch.isnan(cpu_elementwise.silu_mul(nan)[0, 0])


def test_bf16_outputs_round_to_nearest_even_as_torch():
    """A row of ones normalises to exactly 1 (eps 0), so the bf16 output is the weight
    rounded: ties (1 + 2^-8, 1 + 3 * 2^-8), their negatives, a NaN, an inf, random values."""
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3 * 2**-9, float("nan"), float("inf")]
    weight = torch.cat((torch.tensor(ties), torch.randn(58, generator=torch.Generator()
                                                        .manual_seed(4))))
    got = cpu_elementwise.add_rmsnorm(torch.ones(1, 64), None, weight, 0.0, torch.bfloat16)
    expected = weight.to(torch.bfloat16)
    assert torch.equal(got[0, 4:5].isnan(), torch.tensor([True]))
    keep = ~torch.isnan(weight)
    assert torch.equal(got[0][keep].view(torch.int16), expected[keep].view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store_rotates_q_and_k_and_stores_k_and_v(dtype):
    gen = torch.Generator().manual_seed(2)
    rows, nh, kvh, d = 6, 4, 2, 16
    qkv = torch.randn(rows, (nh + 2 * kvh) * d, generator=gen).to(dtype)
    positions = torch.tensor([0, 5, 6, 7, 30, 31])
    freqs = positions[:, None].float() / 10000 ** (torch.arange(0, d, 2) / d)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, ssin = rope_for_rotate(emb.cos(), emb.sin())
    caches = [torch.zeros(10, BLOCK_SIZE, kvh, d) for _ in range(4)]
    slots = torch.tensor([3, 0, 39, 17, 8, 22])
    q = cpu_elementwise.rope_store(qkv, caches[0], caches[1], slots,
                                   cos.reshape(rows, d), ssin.reshape(rows, d), nh)
    heads = qkv.view(rows, nh + 2 * kvh, d)
    qk = rotate(heads[:, : nh + kvh], cos, ssin)
    caches[2].view(-1, kvh, d)[slots] = qk[:, nh:].float()
    caches[3].view(-1, kvh, d)[slots] = heads[:, nh + kvh:].float()
    torch.testing.assert_close(q, qk[:, :nh].float(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(caches[0], caches[2], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0)


def mixed_step(model, query_lens: list[int], seed: int = 0,
               cache_dtype: torch.dtype = torch.float32):
    """One step: per sequence `query_lens[i]` new tokens at the end of a context of
    q + 5 + 3 i tokens (ids, positions, caches, metadata)."""
    contexts = [q + 5 + 3 * i for i, q in enumerate(query_lens)]
    ids, positions, meta, caches = paged_step(model, query_lens, contexts, seed,
                                              cache_dtype=cache_dtype)
    return ids, positions, caches, meta


def run(model, step, fused: bool):
    ids, positions, caches, meta = step
    caches = [(k.clone(), v.clone()) for k, v in caches]
    with mock.patch.object(cpu_elementwise, "NATIVE_ELEMENTWISE", fused), \
            mock.patch.object(fused_layers, "FUSE_FLOAT32_STEPS", True), \
            mock.patch.object(cpu_layers, "NATIVE_LAYERS", False), \
            mock.patch.object(cpu_elementwise, "silu_mul",
                              wraps=cpu_elementwise.silu_mul) as spy, torch.inference_mode():
        hidden = model(ids, positions, caches, meta)
    assert spy.call_count == (model.num_layers if fused else 0)
    return hidden, caches


def test_float32_steps_keep_the_torch_ops_by_default(model):
    """The parity tests' float32 steps stay bit for bit torch's: not fused unless asked."""
    ids, positions, caches, meta = mixed_step(model, [7, 1], seed=3)
    with mock.patch.object(cpu_layers, "NATIVE_LAYERS", False), \
            mock.patch.object(cpu_elementwise, "silu_mul",
                              wraps=cpu_elementwise.silu_mul) as spy, torch.inference_mode():
        model(ids, positions, caches, meta)
    assert spy.call_count == 0


@pytest.mark.parametrize("query_lens", [[7], [5, 1, 1], [1] * 20, [1, 9, 1, 3]])
def test_fused_steps_match_the_torch_layers(model, query_lens):
    step = mixed_step(model, query_lens, seed=len(query_lens))
    (a, ca), (b, cb) = run(model, step, fused=True), run(model, step, fused=False)
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    for (ka, va), (kb, vb) in zip(ca, cb, strict=True):
        torch.testing.assert_close(ka, kb, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(va, vb, atol=2e-5, rtol=2e-5)


def test_fused_steps_on_a_bf16_cache_write_and_read_it_as_the_torch_layers(model):
    """kv_cache_dtype bfloat16: rope_store rounds V as .to(bfloat16) does (the first
    layer's, from the same projection, are the same bits; later layers' inputs differ by
    float32 ulps, as do K's rotations, so they may cross a rounding edge: one bf16 step),
    and the step's attention reads them as the torch layers' does."""
    step = mixed_step(model, [6, 1, 20], seed=5, cache_dtype=torch.bfloat16)
    (a, ca), (b, cb) = run(model, step, fused=True), run(model, step, fused=False)
    assert ca[0][0].dtype == torch.bfloat16
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    for (ka, va), (kb, vb) in zip(ca, cb, strict=True):
        torch.testing.assert_close(ka.float(), kb.float(), atol=1e-6, rtol=2.0**-7)
        torch.testing.assert_close(va.float(), vb.float(), atol=1e-6, rtol=2.0**-7)
    assert torch.equal(ca[0][1].view(torch.int16), cb[0][1].view(torch.int16))


def test_fused_bf16_steps_stay_within_bf16_rounding_of_the_torch_layers(model):
    """On the bf16 copies the two differ in rounding only (the fused SwiGLU rounds once,
    torch's after silu and after the product)."""
    step = mixed_step(model, [6, 1, 1, 1], seed=9)
    model.keep_bf16_copies(1)
    try:
        (a, _), (b, _) = run(model, step, fused=True), run(model, step, fused=False)
    finally:
        model.keep_bf16_copies(None)
    assert (a - b).abs().max() <= 0.02 * b.abs().max()


def test_a_step_with_a_slot_outside_the_cache_is_not_fused(model, monkeypatch):
    """C writes K/V at raw addresses: a slot past the cache (or a negative one) declines,
    leaving the step to the torch layers (which raise on it)."""
    monkeypatch.setattr(fused_layers, "FUSE_FLOAT32_STEPS", True)  # the float32 model
    ids, positions, caches, meta = mixed_step(model, [5, 1], seed=4)
    rope = rope_for_rotate(*model.model.rotary_emb(positions, torch.float32))
    past = caches[0][0].shape[0] * caches[0][0].shape[1]
    for slot in (past, -1):
        slots = meta.slot_mapping.clone()
        slots[-1] = slot
        bad = dataclasses.replace(meta, slot_mapping=slots)
        with torch.inference_mode():
            assert not fused_layers.run_fused_layers(
                model, model.model.embed_tokens(ids), rope, caches, bad, False)
    with torch.inference_mode():  # the same step with its own slots is fused
        assert fused_layers.run_fused_layers(
            model, model.model.embed_tokens(ids), rope, caches, meta, False)


def test_a_model_on_another_attention_backend_is_not_fused(model, monkeypatch):
    """The fused layers call the "cpu" backend's paged attention with its own out_dtype:
    a model pointed at another backend (the reference one here; Triton alike) keeps the
    torch layers, which call the backend it was given."""
    monkeypatch.setattr(fused_layers, "FUSE_FLOAT32_STEPS", True)  # the float32 model
    ids, positions, caches, meta = mixed_step(model, [5, 1], seed=6)
    rope = rope_for_rotate(*model.model.rotary_emb(positions, torch.float32))
    use_attention_backend(model, "reference")
    try:
        with torch.inference_mode():
            assert not fused_layers.run_fused_layers(
                model, model.model.embed_tokens(ids), rope, caches, meta, False)
    finally:
        use_attention_backend(model, "cpu")
    with torch.inference_mode():
        assert fused_layers.run_fused_layers(
            model, model.model.embed_tokens(ids), rope, caches, meta, False)
