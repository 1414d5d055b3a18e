"""Decodes on a bf16 cache through the bf16 items, on each kind (`decode_tiles`: the AMX item,
kernels/cpu_decode_amx.h, and the VDPBF16PS item, kernels/cpu_decode_dpbf16.h): equal to the
float32 reference within bf16 rounding, for contexts that are not whole tiles (16 keys a
score tile, 32 a weight tile; up to 16 keys the float32 item keeps them), block sizes that
hold 16 keys (read in place) and that do not (copied), both ways of splitting a step (a
whole decode an item; one KV head an item), through the attention backend and through the
native decode layers (whose parallel region configures the tiles). Caches are
garbage-filled and block ids shuffled (make_paged), so a wrong block, key, head or padding
changes the result far beyond the tolerance. Fails, not skips, where a kind does not build
under CI on a CPU with its flag (fixtures/native_build.require_tiles)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from fixtures.native_build import require_tiles
from fixtures.native_steps import paged_step, run
from fixtures.tiny_models import TINY_LLAMA, write_checkpoint
from test_cpu_attention import make_paged

from engine.models import load_model
from kernels import cpu_attention, cpu_layers, native_library, reference

BF16_TOL = 2e-2  # as test_cpu_prefill_amx.py: bf16 q and softmax weights
CONTEXTS = [1, 15, 16, 17, 31, 32, 33, 64, 150, 300]


def _bf16_decodes(contexts, block_size, kv_heads, group, head_dim, seed):
    q, k_cache, v_cache, *rest = make_paged([(c, 1) for c in contexts], block_size, kv_heads,
                                            group, head_dim, torch.float32, seed=seed)
    return (q, k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16), *rest)


def _widened(paged):
    return [t.float() if t.is_floating_point() else t for t in paged]


@pytest.fixture(params=native_library.DECODE_TILES)
def decode_tiles(request, monkeypatch) -> str:
    """bf16 products on one kind only (skips or fails where that kind is missing)."""
    require_tiles(request.param)
    monkeypatch.setattr(native_library, "DECODE_TILES", (request.param,))
    assert native_library.bf16_decode_tiles(torch.bfloat16, 64) == request.param
    return request.param


@pytest.mark.parametrize("group,head_dim,block_size", [(3, 64, 16), (1, 128, 16), (4, 64, 8),
                                                      (2, 128, 32), (16, 64, 16), (3, 64, 5)])
@pytest.mark.parametrize("num_decodes", [2, len(CONTEXTS)])  # an item a KV head; a decode
def test_decodes_match_the_float32_reference(group, head_dim, block_size, num_decodes,
                                             decode_tiles):
    paged = _bf16_decodes(CONTEXTS[-num_decodes:], block_size, 2, group, head_dim,
                          seed=group + block_size)
    out = cpu_attention.paged_attention(*paged, 0.125)
    expected = reference.paged_attention(*_widened(paged), 0.125)
    torch.testing.assert_close(out, expected, atol=BF16_TOL, rtol=BF16_TOL)
    # the bf16 item ran: float32 products give another result, and one within float32 noise
    with mock.patch.object(native_library, "AMX_DECODE", False):
        float32_products = cpu_attention.paged_attention(*paged, 0.125)
    torch.testing.assert_close(float32_products, expected, atol=2e-5, rtol=2e-5)
    assert (out - float32_products).abs().max() > 1e-5
    # except over contexts of up to 16 keys (AMX_DEC_MIN_KEYS, DP_MIN_KEYS): the float32
    # item, unchanged
    short = [i for i, c in enumerate(CONTEXTS[-num_decodes:]) if c <= 16]
    assert torch.equal(out[short], float32_products[short])
    # and the bf16 rounding is all it adds: within a few roundings of the reference
    assert (out - expected).abs().max() < 8 * 2.0 ** -8 * expected.abs().max()


def test_head_dims_it_does_not_take_keep_float32_products(decode_tiles):
    """head_dim 80 (AMX: not 64 or 128; VDPBF16PS: not a multiple of 32): the tiled float32
    item, as before."""
    paged = _bf16_decodes([40, 150], 16, 2, 3, 80, seed=3)
    out = cpu_attention.paged_attention(*paged, 0.125)
    torch.testing.assert_close(out, reference.paged_attention(*_widened(paged), 0.125),
                               atol=2e-5, rtol=2e-5)


def test_the_switch_names_the_cache_mode():
    assert native_library.cache_mode(False) == 0
    assert native_library.cache_mode(True) == 2
    with mock.patch.object(native_library, "DECODE_TILES", ("AVX512-BF16",)):
        assert native_library.cache_mode(True) == 3
    with mock.patch.object(native_library, "AMX_DECODE", False):
        assert native_library.cache_mode(True) == 1


def test_a_server_says_so_where_it_runs(decode_tiles):
    """What the ready line reads (control/serve/bootstrap.py): head_dim 64 and 128 here, on
    these tiles; float32 products on a float32 cache or with the switch off."""
    assert native_library.bf16_decode_tiles(torch.bfloat16, 64) == decode_tiles
    assert native_library.bf16_decode_tiles(torch.bfloat16, 128) == decode_tiles
    assert native_library.bf16_decode_tiles(torch.float32, 64) is None
    with mock.patch.object(native_library, "AMX_DECODE", False):
        assert native_library.bf16_decode_tiles(torch.bfloat16, 64) is None


@pytest.fixture(scope="module")
def head_dim_64_llama(tmp_path_factory):
    """The tiny Llama at head_dim 64 (2 query heads, 1 KV head): the AMX item's shapes."""
    spec = {**TINY_LLAMA, "hidden_size": 128, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64}
    arch, seed = spec.pop("arch"), spec.pop("seed")
    path = write_checkpoint(tmp_path_factory.mktemp("llama-d64"), arch, seed, **spec)
    return load_model(path, dtype=torch.float32).model


@pytest.mark.parametrize("rows", [1, 5])
def test_the_native_decode_layers_take_it(head_dim_64_llama, rows, monkeypatch, decode_tiles):
    """Decodes over 40-80 keys in the native layers on a bf16 cache: the same step as the
    torch layers (whose attention takes the same bf16 item), and within bf16 rounding of the
    layers with float32 products."""
    model = head_dim_64_llama
    assert model.head_dim == 64
    monkeypatch.setattr(cpu_layers, "NATIVE_MAX_ROWS", cpu_layers.MAX_ROWS)
    step = paged_step(model, [1] * rows, [40 + 9 * i for i in range(rows)], seed=rows,
                      spare_blocks=2, cache_dtype=torch.bfloat16)
    native, torch_layers = run(model, step, native=True), run(model, step, native=False)
    torch.testing.assert_close(native[0], torch_layers[0], atol=2e-4, rtol=2e-4)
    with mock.patch.object(native_library, "AMX_DECODE", False):
        float32_products = run(model, step, native=True)
    assert (native[0] - float32_products[0]).abs().max() > 0
    torch.testing.assert_close(native[0], float32_products[0], atol=BF16_TOL, rtol=BF16_TOL)
