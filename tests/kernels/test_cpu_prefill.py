"""The native prefill kernel (kernels/cpu_prefill.py) against torch's SDPA path of the same
backend and against the reference: chunks over cached prefixes and from position 0, rows
across its 16-row query tiles and 32-key key tiles, one to four query heads per KV head,
head dims that are and are not multiples of 16, float32 and bfloat16 caches. The caches are
garbage-filled and block ids shuffled (test_cpu_attention.make_paged), so a wrong block,
offset or causal edge changes the result."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cpu_attention import make_paged

from kernels import cpu_attention, cpu_prefill, cpu_prefill_amx, native_library, reference

# skips where the library did not build, fails under CI (conftest.py)
pytestmark = pytest.mark.usefixtures("native_library")


@pytest.fixture(autouse=True)
def _float32_kernel_only(monkeypatch):
    """Chunks the AMX kernel would take on a bf16 cache (test_cpu_prefill_amx.py) stay in
    the float32 kernel this file tests, and the decodes beside them in float32 products
    (their AMX path: test_cpu_decode_amx.py)."""
    monkeypatch.setattr(cpu_prefill_amx, "AMX_PREFILL", False)
    monkeypatch.setattr(native_library, "AMX_DECODE", False)


def _both_paths(monkeypatch, paged, scale=0.125):
    native = cpu_attention.paged_attention(*paged, scale)
    monkeypatch.setattr(cpu_prefill, "NATIVE_PREFILL", False)
    torch_path = cpu_attention.paged_attention(*paged, scale)
    monkeypatch.setattr(cpu_prefill, "NATIVE_PREFILL", True)
    return native, torch_path


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (3, 64), (4, 40), (2, 16)])
def test_chunks_match_the_sdpa_path_and_the_reference(monkeypatch, cache_dtype, group,
                                                       head_dim):
    # (context, rows): from position 0, over a cached prefix, past a 16-row tile, 1 row of
    # prefill beside decodes, a context crossing several 32-key tiles
    seqs = [(37, 37), (100, 20), (64, 33), (9, 1), (130, 2), (200, 1), (48, 17)]
    paged = make_paged(seqs, 16, 2, group, head_dim, torch.float32, seed=group + head_dim)
    q, k_cache, v_cache, *rest = paged
    paged = (q, k_cache.to(cache_dtype), v_cache.to(cache_dtype), *rest)
    native, torch_path = _both_paths(monkeypatch, paged)
    torch.testing.assert_close(native, torch_path, atol=2e-5, rtol=2e-5)
    wide = [t.float() if t.is_floating_point() else t for t in paged]
    torch.testing.assert_close(native, reference.paged_attention(*wide, 0.125),
                               atol=2e-5, rtol=2e-5)


@settings(max_examples=25, deadline=None,  # native_library: the library, nothing to reset
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 80)), min_size=1,
                       max_size=5),
       block_size=st.sampled_from([8, 16, 32]), group=st.integers(1, 3))
def test_random_chunks_match_the_sdpa_path(chunks, block_size, group):
    seqs = [(rows + prefix, rows) for rows, prefix in chunks]  # (context, rows)
    paged = make_paged(seqs, block_size, 2, group, 32, torch.float32, seed=len(seqs))
    native = cpu_attention.paged_attention(*paged, 0.2)
    cpu_prefill.NATIVE_PREFILL = False
    try:
        torch_path = cpu_attention.paged_attention(*paged, 0.2)
    finally:
        cpu_prefill.NATIVE_PREFILL = True
    torch.testing.assert_close(native, torch_path, atol=2e-5, rtol=2e-5)


def test_block_table_rows_without_padding_prefill():
    """A chunk whose table row is exactly as long as the blocks its context owns (the
    longest context the table holds) is computed, not refused as outside block_tables."""
    q, k_cache, v_cache, table, ctx, starts = make_paged([(64, 30), (40, 40)], 16, 2, 2, 32,
                                                         torch.float32, seed=3)
    table = table[:, :4].contiguous()  # 64 tokens at block size 16: all 4 entries
    paged = (q, k_cache, v_cache, table, ctx, starts)
    torch.testing.assert_close(cpu_attention.paged_attention(*paged, 0.2),
                               reference.paged_attention(*paged, 0.2), atol=2e-5, rtol=2e-5)


def test_a_block_outside_the_cache_is_refused_before_any_read():
    q, k_cache, v_cache, table, ctx, starts = make_paged([(40, 40)], 16, 1, 1, 32,
                                                         torch.float32, seed=1)
    table[0, 1] = k_cache.shape[0]  # one past the last block
    out = torch.zeros_like(q)
    with pytest.raises(ValueError, match="block ids must lie in"):
        cpu_prefill.prefill_attention(q, k_cache, v_cache, table, [(0, 0, 40, 40)], 0.1, out)
    with pytest.raises(ValueError, match="see at least their own keys"):
        cpu_prefill.prefill_attention(q, k_cache, v_cache, table, [(0, 0, 40, 39)], 0.1, out)
    assert not out.any()
