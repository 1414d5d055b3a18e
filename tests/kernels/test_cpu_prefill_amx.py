"""Long prefill chunks on a bf16 cache through the tiled kernel, on each kind of tiles
(`tiles`: AMX, kernels/cpu_prefill_amx.c, and AVX-512-BF16, kernels/cpu_prefill_bf16.c):
equal to the float32 reference within bf16 rounding, with the causal edge where it belongs,
from position 0 and over a cached prefix, for row counts and contexts that are not whole
tiles (16 rows, 64 keys). Caches are garbage-filled and block ids shuffled (make_paged), so a
wrong block, key or padding changes the result far beyond the tolerance. Fails, not skips,
where a kind does not build under CI on a CPU with its flag
(fixtures/native_build.require_tiles)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from fixtures.native_build import require_tiles
from test_cpu_attention import make_paged

from kernels import cpu_attention, cpu_prefill_amx, cpu_prefill_sdpa, reference

BF16_TOL = 2e-2  # as test_cpu_prefill_sdpa.py: bf16 q and softmax weights


def _bf16(paged):
    q, k_cache, v_cache, *rest = paged
    return (q, k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16), *rest)


def _widened(paged):
    return [t.float() if t.is_floating_point() else t for t in paged]


@pytest.fixture(params=cpu_prefill_amx.TILE_KINDS)
def tiles(request, monkeypatch) -> str:
    """The kernel on one kind of tiles only (skips or fails where that kind is missing)."""
    require_tiles(request.param)
    monkeypatch.setattr(cpu_prefill_amx, "TILE_KINDS", (request.param,))
    assert cpu_prefill_amx.tile_kind() == request.param
    return request.param


@pytest.mark.parametrize("group,head_dim,block_size", [(3, 64, 16), (1, 128, 16), (4, 64, 16),
                                                      (3, 64, 8), (2, 128, 32)])
def test_long_chunks_match_the_float32_reference(group, head_dim, block_size, tiles):
    # (context, rows): from position 0; over a cached prefix (rows and context past whole
    # tiles); exactly one tile of rows and keys; then a short chunk and decodes beside them
    seqs = [(150, 150), (421, 97), (64, 64), (30, 30), (200, 1), (64, 1)]
    bf16 = _bf16(make_paged(seqs, block_size, 2, group, head_dim, torch.float32,
                            seed=group + block_size))
    with mock.patch.object(cpu_prefill_amx, "prefill_attention",
                           wraps=cpu_prefill_amx.prefill_attention) as amx, \
            mock.patch.object(cpu_prefill_sdpa, "prefill_attention") as sdpa:
        out = cpu_attention.paged_attention(*bf16, 0.125)
    assert [c[2] - c[1] for c in amx.call_args.args[4]] == [150, 97, 64]
    sdpa.assert_not_called()
    expected = reference.paged_attention(*_widened(bf16), 0.125)
    torch.testing.assert_close(out, expected, atol=BF16_TOL, rtol=BF16_TOL)
    # and no worse than torch's bf16 SDPA on the same chunks
    with mock.patch.object(cpu_prefill_amx, "AMX_PREFILL", False):
        sdpa_out = cpu_attention.paged_attention(*bf16, 0.125)
    rows = slice(0, 311)
    amx_err = (out[rows] - expected[rows]).abs().max()
    sdpa_err = (sdpa_out[rows] - expected[rows]).abs().max()
    assert amx_err <= 2 * sdpa_err, (amx_err, sdpa_err)


def test_which_models_it_serves(tiles):
    """What a server's ready line reports: a bf16 cache and head_dim 64 or 128, and on
    which tiles."""
    assert cpu_prefill_amx.serving_tiles(torch.bfloat16, 64) == tiles
    assert cpu_prefill_amx.serves(torch.bfloat16, 64)
    assert cpu_prefill_amx.serves(torch.bfloat16, 128)
    assert not cpu_prefill_amx.serves(torch.float32, 64)
    assert not cpu_prefill_amx.serves(torch.bfloat16, 40)
    for head_dim in (32, 96, 192, 256):  # other dims, multiples of 32 or 64 too
        assert not cpu_prefill_amx.serves(torch.bfloat16, head_dim)


def test_which_chunks_come_here():
    fresh = (0, 0, 32, 32)  # 32 rows from position 0: 528 pairs
    enough = (1, 32, 64, 48)  # 32 rows over 16 cached keys: 1,040 pairs
    few_rows = (2, 64, 64 + cpu_prefill_amx.MIN_ROWS - 1, 2000)
    over_prefix = (3, 75, 91, 600)  # 16 rows over 584 cached keys
    mine, rest = cpu_prefill_amx.split_chunks((fresh, enough, few_rows, over_prefix))
    assert mine == [enough, over_prefix] and rest == [fresh, few_rows]


def test_a_causal_edge_off_by_one_would_show(tiles):
    """Rows from position 0: the first sees one key, so an edge one key off moves the
    result far past the tolerance (the cache holds a 41st key to be wrongly read)."""
    paged = _bf16(make_paged([(41, 40)], 16, 1, 3, 64, torch.float32, seed=5))
    q, k_cache, v_cache, table, _, starts = paged
    out = torch.zeros_like(q)
    cpu_prefill_amx.prefill_attention(q, k_cache, v_cache, table, [(0, 0, 40, 40)], 0.125,
                                      out)
    wide = _widened(paged)
    for ctx, close in ((40, True), (41, False)):
        expected = reference.paged_attention(wide[0], wide[1], wide[2], table,
                                             torch.tensor([ctx], dtype=torch.int32), starts,
                                             0.125)
        if close:
            torch.testing.assert_close(out, expected, atol=BF16_TOL, rtol=BF16_TOL)
        else:
            assert (out - expected).abs().max() > 10 * BF16_TOL


def test_a_refusing_kernel_leaves_the_chunks_to_sdpa(monkeypatch, tiles):
    """Past `usable`, the kernel refuses only when its scratch cannot be allocated: the
    chunks then take torch's bf16 SDPA, and the step goes on."""
    paged = _bf16(make_paged([(100, 100)], 16, 1, 3, 64, torch.float32, seed=2))
    q, k_cache, v_cache, table, *_ = paged

    class Refusing:
        def __getattr__(self, name):
            return lambda *args: -1

    monkeypatch.setattr(cpu_prefill_amx.native_library, "load", lambda: Refusing())
    out = torch.zeros_like(q)
    cpu_prefill_amx.prefill_attention(q, k_cache, v_cache, table, [(0, 0, 100, 100)], 0.125,
                                      out)
    torch.testing.assert_close(out, reference.paged_attention(*_widened(paged), 0.125),
                               atol=BF16_TOL, rtol=BF16_TOL)


def test_blocks_outside_the_cache_are_refused(tiles):
    paged = _bf16(make_paged([(100, 100)], 16, 1, 3, 64, torch.float32, seed=1))
    q, k_cache, v_cache, table, *_ = paged
    table[0, 2] = k_cache.shape[0]
    with pytest.raises(ValueError, match="block ids"):
        cpu_prefill_amx.prefill_attention(q, k_cache, v_cache, table, [(0, 0, 100, 100)],
                                          0.125, torch.zeros_like(q))


@pytest.mark.parametrize("cache_dtype,group,head_dim", [(torch.bfloat16, 3, 64),
                                                        (torch.bfloat16, 1, 128),
                                                        (torch.float32, 3, 64)])
def test_bf16_output_is_the_float32_output_rounded(cache_dtype, group, head_dim, tiles):
    """paged_attention(out_dtype=bf16), as the fused layers ask for o_proj's input: the
    prefill kernels (AMX and float32) write their rows as bf16 and the native decode's
    float32 rows are rounded into them, each exactly as .to(bfloat16) of the float32
    result rounds it; the step's chunks take each kernel (long, short) and decode rows."""
    seqs = [(150, 150), (421, 97), (30, 30), (12, 5), (200, 1), (64, 1)]
    paged = make_paged(seqs, 16, 2, group, head_dim, torch.float32, seed=group)
    if cache_dtype == torch.bfloat16:
        paged = _bf16(paged)
    with mock.patch.object(cpu_prefill_amx, "prefill_attention",
                           wraps=cpu_prefill_amx.prefill_attention) as amx:
        wide = cpu_attention.paged_attention(*paged, 0.125)
        narrow = cpu_attention.paged_attention(*paged, 0.125, out_dtype=torch.bfloat16)
    assert amx.call_count == (2 if cache_dtype == torch.bfloat16 else 0)
    assert wide.dtype == torch.float32 and narrow.dtype == torch.bfloat16
    assert torch.equal(narrow.view(torch.int16), wide.to(torch.bfloat16).view(torch.int16))
    # a step of decodes alone (more than the native layers take): rounded in one pass
    decodes = make_paged([(200, 1), (64, 1), (17, 1)], 16, 2, group, head_dim, torch.float32,
                         seed=group + 1)
    if cache_dtype == torch.bfloat16:
        decodes = _bf16(decodes)
    wide = cpu_attention.paged_attention(*decodes, 0.125)
    narrow = cpu_attention.paged_attention(*decodes, 0.125, out_dtype=torch.bfloat16)
    assert torch.equal(narrow.view(torch.int16), wide.to(torch.bfloat16).view(torch.int16))
