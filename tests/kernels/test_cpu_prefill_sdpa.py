"""Long prefill chunks on a bf16 cache through bf16 SDPA (kernels/cpu_prefill_sdpa.py):
which chunks go there, and that they equal the float32 reference within bf16 rounding
with the causal edge where it belongs (from position 0 and over a cached prefix). Caches
are garbage-filled and block ids shuffled (make_paged), so a wrong block or a mask
aligned to the wrong corner changes the result far beyond the tolerance."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from test_cpu_attention import make_paged

from kernels import cpu_attention, cpu_prefill_amx, cpu_prefill_sdpa, native_library, reference
from kernels.cpu_prefill_sdpa import MIN_PAIRS, MIN_ROWS, split_chunks

# bf16 q and softmax weights: ~3 significant digits of outputs of magnitude ~1
BF16_TOL = 2e-2


def test_chunks_with_enough_rows_and_pairs_go_to_sdpa():
    fresh = (0, 0, 100, 100)  # 100 rows from position 0: 5,050 pairs
    few_rows = (1, 100, 100 + MIN_ROWS - 1, 2000)  # many pairs, too few rows
    short = (2, 107, 147, 60)  # 40 rows over 20 cached keys: 1,620 pairs
    over_prefix = (3, 147, 163, 600)  # 16 rows over 584 cached keys: 9,480 pairs
    mine, rest = split_chunks((fresh, few_rows, short, over_prefix))
    assert mine == [fresh, over_prefix] and rest == [few_rows, short]
    # from position 0, n rows see n (n + 1) / 2 pairs: 90 rows 4,095, 91 rows 4,186
    assert MIN_PAIRS == 4096
    assert split_chunks(((0, 0, 90, 90),))[0] == []
    assert split_chunks(((0, 0, 91, 91),))[0] == [(0, 0, 91, 91)]


def test_only_a_bf16_cache_is_taken(monkeypatch):
    assert cpu_prefill_sdpa.takes(torch.zeros(1, dtype=torch.bfloat16))
    assert not cpu_prefill_sdpa.takes(torch.zeros(1, dtype=torch.float32))
    monkeypatch.setattr(cpu_prefill_sdpa, "SDPA_PREFILL", False)
    assert not cpu_prefill_sdpa.takes(torch.zeros(1, dtype=torch.bfloat16))


@pytest.mark.parametrize("group,head_dim", [(1, 64), (3, 64), (4, 40)])
def test_long_chunks_match_the_float32_reference(group, head_dim, monkeypatch):
    monkeypatch.setattr(cpu_prefill_amx, "AMX_PREFILL", False)  # this path where AMX is too
    monkeypatch.setattr(native_library, "AMX_DECODE", False)  # decodes: float32 products
    # (context, rows): from position 0 (is_causal), over a cached prefix (explicit mask),
    # a short chunk and decodes beside them (the native kernels)
    seqs = [(150, 150), (420, 96), (30, 30), (200, 1), (64, 1)]
    paged = make_paged(seqs, 16, 2, group, head_dim, torch.float32, seed=group)
    q, k_cache, v_cache, *rest = paged
    bf16 = (q, k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16), *rest)
    with mock.patch.object(cpu_prefill_sdpa, "prefill_attention",
                           wraps=cpu_prefill_sdpa.prefill_attention) as spy:
        out = cpu_attention.paged_attention(*bf16, 0.125)
    assert [c[2] - c[1] for c in spy.call_args.args[4]] == [150, 96]
    wide = [t.float() if t.is_floating_point() else t for t in bf16]
    expected = reference.paged_attention(*wide, 0.125)
    torch.testing.assert_close(out, expected, atol=BF16_TOL, rtol=BF16_TOL)
    # the rows left to the native kernels keep float32 precision
    native_rows = torch.cat([torch.arange(246, 276), torch.tensor([276, 277])])
    torch.testing.assert_close(out[native_rows], expected[native_rows], atol=2e-5, rtol=2e-5)


def test_a_mask_on_the_wrong_corner_would_show():
    """The tolerance is far tighter than the error of a top-left mask over a prefix."""
    paged = make_paged([(300, 40)], 16, 1, 3, 64, torch.float32, seed=5)
    q, k_cache, v_cache, table, ctx, starts = paged
    wide = reference.paged_attention(*paged, 0.125)
    k = reference.gather_kv(k_cache, table[0], 40).transpose(0, 1)[None]
    v = reference.gather_kv(v_cache, table[0], 40).transpose(0, 1)[None]
    top_left = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k, v, is_causal=True, scale=0.125, enable_gqa=True)
    assert (top_left[0].transpose(0, 1) - wide).abs().max() > 10 * BF16_TOL
    bf16 = (q, k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16), table, ctx, starts)
    out = torch.zeros_like(q)
    cpu_prefill_sdpa.prefill_attention(q, bf16[1], bf16[2], table, [(0, 0, 40, 300)],
                                       0.125, out)
    torch.testing.assert_close(out, reference.paged_attention(
        *[t.float() if t.is_floating_point() else t for t in bf16], 0.125),
        atol=BF16_TOL, rtol=BF16_TOL)
