"""The native CPU decode kernel (kernels/native_library.py, cpu_decode.c) and the per-step plan
(kernels/cpu_plan.py) against the torch reference.

Caches are garbage-filled and block ids shuffled (make_paged), so a wrong block, offset,
head or row changes the result. Where the kernel does not build: skipped, saying why; under
CI with a C compiler, failed (tests/fixtures/native_build.py).
"""

from __future__ import annotations

import subprocess
from unittest import mock

import pytest
import torch
from fixtures.native_build import compiler_here, reload_native, require_native
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import (
    cpu_attention,
    cpu_plan,
    cpu_prefill_amx,
    cpu_prefill_sdpa,
    native_library,
    reference,
)
from tests.kernels.test_cpu_attention import MIXED, TOLERANCE, make_paged

# skips where the library did not build, fails under CI (conftest.py)
needs_native = pytest.mark.usefixtures("native_library")


def native_matches_reference(paged, scale=0.125, expect_native=True):
    """The backend with the native kernel on: same result as the reference, and the
    kernel ran once per call (when the batch holds decodes and expect_native)."""
    with mock.patch.object(native_library, "decode_attention",
                           wraps=native_library.decode_attention) as spy:
        out = cpu_attention.paged_attention(*paged, scale)
    has_decodes = bool(((paged[5][1:] - paged[5][:-1]) == 1).any())
    assert spy.call_count == int(expect_native and has_decodes)
    expected = reference.paged_attention(*paged, scale)
    q = paged[0]
    assert out.shape == q.shape and out.dtype == q.dtype
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    wide = [t.float() if t.is_floating_point() and t.dim() == 3 else t for t in paged]
    if q.dtype != torch.float32:  # fp32 q on the bf16 cache: the kernels' own precision
        # (long prefill chunks and, on AMX, decodes on a bf16 cache take bf16 products:
        # test_cpu_prefill_amx.py, test_cpu_prefill_sdpa.py, test_cpu_decode_amx.py)
        with mock.patch.object(cpu_prefill_sdpa, "SDPA_PREFILL", False), \
                mock.patch.object(cpu_prefill_amx, "AMX_PREFILL", False), \
                mock.patch.object(native_library, "AMX_DECODE", False):
            torch.testing.assert_close(cpu_attention.paged_attention(*wide, scale),
                                       reference.paged_attention(*wide, scale),
                                       atol=2e-5, rtol=2e-5)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_kv_heads", "group"), [(3, 3), (1, 4), (2, 1), (4, 2), (1, 9)])
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("head_dim", [8, 64, 80])  # 80: a 16-lane loop plus a tail
def test_mixed_batches_match_reference(dtype, num_kv_heads, group, block_size, head_dim):
    seqs = MIXED if block_size > 1 else MIXED[1:]
    native_matches_reference(make_paged(seqs, block_size, num_kv_heads, group, head_dim,
                                        dtype, 7))


@needs_native
@pytest.mark.parametrize("parallel_min_work", [0, native_library.PARALLEL_MIN_WORK])
@pytest.mark.parametrize("num_decodes", [1, 2, 7, 8, 9, 40])  # items per head vs per decode
def test_decode_counts_around_the_item_split(monkeypatch, parallel_min_work, num_decodes):
    # min work 0: every call runs on torch's threads, so both item layouts run in parallel
    monkeypatch.setattr(native_library, "PARALLEL_MIN_WORK", parallel_min_work)
    seqs = [(1 + 37 * i % 300, 1) for i in range(num_decodes)]
    native_matches_reference(make_paged(seqs, 16, 3, 3, 64, torch.float32, num_decodes))


@needs_native
def test_scores_of_very_different_size_across_tiles():
    # Scale 40: scores span hundreds, and the running max jumps between 32-key tiles,
    # so every rescale by exp(m_old - m_new) matters; a 1-token context has one key.
    q, k_cache, v_cache, table, lens, starts = make_paged(
        [(300, 1), (33, 1), (1, 1), (64, 1)], 16, 3, 3, 64, torch.float32, 9)
    k_cache[table[0, 12].long()] *= 6.0  # a late block with much larger keys
    native_matches_reference((q, k_cache, v_cache, table, lens, starts), scale=40.0)


@needs_native
def test_results_match_torch_path_and_dense_attention():
    seqs = [(700, 1), (3, 1), (129, 1)]
    paged = make_paged(seqs, 16, 3, 3, 64, torch.float32, 2)
    native = cpu_attention.paged_attention(*paged, 0.125)
    for s, (ctx, _) in enumerate(seqs):
        k = reference.gather_kv(paged[1], paged[3][s], ctx)
        v = reference.gather_kv(paged[2], paged[3][s], ctx)
        dense = reference.reference_attention(paged[0][s:s + 1], k, v, 0.125)
        torch.testing.assert_close(native[s:s + 1], dense, atol=2e-5, rtol=2e-5)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 24), st.booleans()).map(
        lambda t: (t[0], 1 if t[2] else min(t[0], t[1]))), min_size=1, max_size=12),
    block_size=st.sampled_from([2, 3, 8, 16, 64]),
    kv_group=st.sampled_from([(1, 1), (3, 3), (2, 4), (1, 9)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_random_mixed_batches_match_reference(lens, block_size, kv_group, dtype, seed):
    require_native()  # not the fixture: hypothesis reruns the body, not the fixtures
    native_matches_reference(make_paged(lens, block_size, *kv_group, 16, dtype, seed))


@needs_native
def test_unsupported_head_counts_take_the_torch_path():
    paged = make_paged([(40, 1), (9, 1)], 4, 1, 130, 8, torch.float32, 1)  # 130 heads
    assert not native_library.supports(paged[0], paged[1])
    native_matches_reference(paged, expect_native=False)
    out = torch.empty_like(paged[0])
    two = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_heads"):
        native_library.decode_attention(native_library.load(), paged[0], paged[1], paged[2],
                                    paged[3], paged[4], two, two, 0.1, out, 1)




def test_switched_off_or_without_a_compiler_falls_back(monkeypatch, tmp_path):
    lib, reason = reload_native(monkeypatch, BATCHPILOT_CPU_NATIVE="0")
    assert lib is None and reason == "BATCHPILOT_CPU_NATIVE=0"
    with pytest.warns(UserWarning, match="native CPU decode kernel unavailable"):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_CPU_NATIVE="1", CC="/bin/false",
                                    BATCHPILOT_KERNEL_CACHE=str(tmp_path))
    assert lib is None and "failed" in reason
    monkeypatch.setattr(native_library, "load", lambda: None)  # the backend keeps serving
    native_matches_reference(make_paged(MIXED, 16, 3, 3, 64, torch.float32, 4),
                             expect_native=False)


def test_a_compiler_that_hangs_falls_back(monkeypatch, tmp_path):
    """A build that runs past its timeout leaves the torch path in use, saying why; it does
    not fail the model's load."""
    def hang(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout", 0))

    monkeypatch.setattr(native_library.subprocess, "run", hang)
    with pytest.warns(UserWarning, match="native CPU decode kernel unavailable"):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_CPU_NATIVE="1", CC="gcc",
                                    BATCHPILOT_KERNEL_CACHE=str(tmp_path))
    assert lib is None and "timed out" in reason


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_source_that_stops_compiling_fails_the_kernel_tests_under_ci(monkeypatch, tmp_path,
                                                                     ci):
    """A real compiler on a copy of the sources with a syntax error: under CI the kernel
    tests fail with the compiler's message; elsewhere they skip with it."""
    if compiler_here() is None:
        require_native()  # no compiler: this skips (CI or not), as the kernel tests do
    broken = tmp_path / "src" / "cpu_decode.c"
    broken.parent.mkdir()
    broken.write_text(native_library.SOURCES[0].read_text() + "\nint broken(void) { return }\n")
    monkeypatch.setattr(native_library, "SOURCES", (broken,))
    monkeypatch.setattr(native_library, "HEADERS", ())
    for name, value in (("CI", ci), ("BATCHPILOT_KERNEL_CACHE", str(tmp_path / "cache")),
                        (native_library.NATIVE_ENV_VAR, "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(native_library, "_reason", [])
    native_library.load.cache_clear()
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    try:
        with pytest.warns(UserWarning), pytest.raises(outcome) as caught:
            require_native()
    finally:
        native_library.load.cache_clear()  # later tests load the real sources again
    assert "failed" in str(caught.value) and "cpu_decode.c" in str(caught.value)
    assert ("CI=true" in str(caught.value)) == bool(ci)


@needs_native
def test_build_goes_to_the_cache_directory_once(monkeypatch, tmp_path):
    lib, _ = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(tmp_path))
    built = list(tmp_path.glob("cpu_decode_*.so"))
    assert lib is not None and len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(tmp_path))[0] is not None
    assert [p.stat().st_mtime_ns for p in tmp_path.glob("cpu_decode_*.so")] == [stamp]


def test_step_plan_is_made_once_per_step():
    q, _, _, table, lens, starts = make_paged(MIXED, 16, 1, 1, 8, torch.float32, 0)
    plan = cpu_plan.attention_plan(q.shape[0], table, lens, starts, 16)
    assert cpu_plan.attention_plan(q.shape[0], table, lens, starts, 16) is plan  # the next layer
    fresh = cpu_plan.attention_plan(q.shape[0], table.clone(), lens.clone(), starts.clone(), 16)
    assert fresh is not plan and fresh.prefills == plan.prefills
    decodes = [s for s, (_, q_len) in enumerate(MIXED) if q_len == 1]
    assert plan.decode_seqs.tolist() == decodes
    assert plan.decode_rows.tolist() == [int(starts[s]) for s in decodes]
    assert [s for s, *_ in plan.prefills] == [6, 7, 9] and not plan.all_decodes


@needs_native
@pytest.mark.parametrize("bad_id", [-1, "one past the last", 10**6])
def test_block_ids_outside_the_cache_are_rejected_not_read(bad_id):
    q, k_cache, v_cache, table, lens, starts = make_paged([(40, 1), (9, 1)], 4, 1, 2, 8,
                                                          torch.float32, 1)
    if bad_id == "one past the last":  # the first id past the cache, not only far ones
        bad_id = k_cache.shape[0]
    table[1, 2] = bad_id  # block 2 of a 9-token context at block size 4: owned
    with pytest.raises(ValueError, match="block_tables must give every decode"):
        cpu_attention.paged_attention(q, k_cache, v_cache, table, lens, starts, 0.5)
    with pytest.raises(ValueError, match="a row too short"):
        cpu_attention.paged_attention(q, k_cache, v_cache, table[:, :2].contiguous(), lens,
                                      starts, 0.5)


@needs_native
def test_q_with_heads_apart_in_memory_matches_reference():
    """A float32 q whose heads are not d apart (a [nh, T, d] tensor transposed) is read as
    its values say, not as if its heads were packed."""
    q, *rest = make_paged(MIXED, 16, 3, 3, 64, torch.float32, 4)
    apart = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, head stride T * d
    assert torch.equal(apart, q) and apart.stride(1) != q.shape[2]
    native_matches_reference((apart, *rest))


@needs_native
def test_block_table_rows_without_padding_decode():
    """A decode whose table row is exactly as long as the blocks it owns (a sequence at the
    longest context the table holds) is served, not refused as a row too short."""
    paged = list(make_paged([(40, 1), (9, 1), (33, 1)], 4, 1, 2, 8, torch.float32, 1))
    paged[3] = paged[3][:, :10].contiguous()  # 40 tokens at block size 4: all 10 entries
    native_matches_reference(tuple(paged))


@needs_native
def test_a_block_table_with_strided_columns_matches_reference():
    """A block table whose columns are not adjacent in memory (a view of every other
    column) gives the same attention as its contiguous copy."""
    paged = list(make_paged(MIXED, 16, 3, 3, 64, torch.float32, 4))
    table = paged[3]
    spread = torch.full((table.shape[0], 2 * table.shape[1]), -1, dtype=torch.int32)
    spread[:, ::2] = table
    paged[3] = spread[:, ::2]
    assert torch.equal(paged[3], table) and paged[3].stride(1) == 2
    torch.testing.assert_close(cpu_attention.paged_attention(*paged, 0.125),
                               reference.paged_attention(*paged, 0.125), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("skip_some", [False, True])
def test_write_kv_matches_reference(cache_dtype, skip_some):
    gen = torch.Generator().manual_seed(1)
    pair = [torch.randn(6, 4, 2, 8, generator=gen).to(cache_dtype) for _ in range(2)]
    caches = [*pair, *(c.clone() for c in pair)]  # ours, then the reference's
    qkv = torch.randn(5, 6, 8, generator=gen)
    k, v = qkv[:, 2:4], qkv[:, 4:]  # strided views, as the model passes them
    slots = torch.tensor([3, 17, -1 if skip_some else 8, 22, 0])
    cpu_plan.write_kv(caches[0], caches[1], k, v, slots)
    reference.write_kv(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@needs_native
def test_portable_build_matches_reference(monkeypatch, tmp_path):
    # The kernel's plain-C row loops (a CPU without AVX-512): built for baseline x86-64
    # (or the compiler's default elsewhere), loaded beside the native build.
    portable = tuple(f for f in native_library.FLAGS if not f.startswith("-march"))
    monkeypatch.setattr(native_library, "FLAGS", portable)
    lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(tmp_path))
    assert lib is not None, reason
    for dtype in (torch.float32, torch.bfloat16):
        q, k_cache, v_cache, table, lens, starts = make_paged(
            [(300, 1), (7, 1), (40, 1)], 16, 3, 3, 80, dtype, 3)
        out = torch.zeros(3, 9, 80)
        seqs = torch.arange(3, dtype=torch.int32)
        native_library.decode_attention(lib, q.float(), k_cache, v_cache, table, lens, seqs, seqs,
                                    0.125, out, 2)
        wide = (q.float(), k_cache.float(), v_cache.float(), table, lens, starts)
        torch.testing.assert_close(out, reference.paged_attention(*wide, 0.125),
                                   atol=2e-5, rtol=2e-5)
