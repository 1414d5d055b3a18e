"""The Triton kernels against the torch reference, on CPU through Triton's interpreter.

TRITON_INTERPRET=1 must be set when a kernel is decorated, so kernels/triton_*.py are imported
(or re-imported) inside the module fixture with it set, and it is restored afterwards: other
test modules see the environment they started with. Caches are filled with garbage and block
ids shuffled, so a wrong block, offset or padding read changes the result. Shapes are tiny:
one interpreted launch costs ~0.2-1 s.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import reference

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
KERNEL_MODULES = ("triton_launch", "triton_tile", "triton_kv_write", "triton_decode",
                  "triton_prefill", "triton_attention")


def _import_kernels() -> SimpleNamespace:
    """kernels.triton_*, imported afresh while TRITON_INTERPRET=1: interpreted kernels."""
    _forget_kernels()
    return SimpleNamespace(**{name: importlib.import_module(f"kernels.{name}")
                              for name in KERNEL_MODULES})


def _forget_kernels() -> None:
    """Drop kernels.triton_* from sys.modules and the package, so the next import decorates
    the kernels again, for whatever TRITON_INTERPRET says then."""
    for name in KERNEL_MODULES:
        sys.modules.pop(f"kernels.{name}", None)
        if hasattr(kernels, name):
            delattr(kernels, name)


@pytest.fixture(scope="module", autouse=True)
def tk():
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is not installed: pip install 'triton>=3.6' (the kernels' tests "
                    "run it on CPU in its interpreter)")
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        modules = _import_kernels()
        assert modules.triton_attention.kernels_interpreted()
        yield modules
    finally:
        _forget_kernels()  # later modules get kernels built for their own environment
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def make_batch(seqs, block_size, num_kv_heads, group, head_dim, dtype, seed):
    """seqs: [(context_len, q_len)] -> (q, k_cache, v_cache, block_tables, context_lens,
    query_start_loc) with shuffled blocks, -1 table padding and garbage everywhere else."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-ctx // block_size) for ctx, _ in seqs]
    pool = list(range(sum(needed) + 3))
    random.Random(seed).shuffle(pool)
    shape = (len(pool), block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    table = torch.full((len(seqs), max(needed) + 2), -1, dtype=torch.int32)
    for s, n in enumerate(needed):
        table[s, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    q_lens = torch.tensor([q for _, q in seqs])
    q = torch.randn(int(q_lens.sum()), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(q_lens, 0)
    context_lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    return q, k_cache, v_cache, table, context_lens, query_start_loc


def assert_matches(out, expected, dtype):
    assert out.shape == expected.shape and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


# (context_len, q_len): a one-token context, decodes at ragged lengths, a whole prompt,
# chunks over cached prefixes; contexts mostly not multiples of 16 or 32. The chunks at
# (70, 8) and (38, 8) start at positions 62 and 30, just below a KV step (64 positions in
# 16 bits, 32 in fp32), where the prefill kernel's unmasked phase must stop one key early.
MIXED = [(1, 1), (37, 1), (33, 7), (16, 16), (70, 8), (38, 8), (70, 1), (50, 3)]


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_batch_matches_reference(tk, dtype, block_size, head_dim, group):
    batch = make_batch(MIXED, block_size, 2, group, head_dim, dtype, seed=block_size + group)
    scale = head_dim**-0.5
    out = tk.triton_attention.paged_attention(*batch, scale, max_query_len=16,
                                              max_context_len=70)
    assert_matches(out, reference.paged_attention(*batch, scale), dtype)


@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_split_k_on_and_off(tk, dtype, group, num_splits):
    # max context 600 in 64-position steps: a forced 3 gives splits of 256 (the shorter
    # sequences' later splits are empty); None lets the heuristic pick (2 for 8 programs)
    seqs = [(600, 1), (1, 1), (129, 1), (64, 1)]
    block_size = 16 if group == 4 else 32
    q, k_cache, v_cache, table, ctx, _ = make_batch(seqs, block_size, 2, group, 64, dtype,
                                                    seed=5)
    out = tk.triton_decode.decode_attention(q, k_cache, v_cache, table, ctx, 0.125,
                                            num_splits=num_splits)
    expected = reference.decode_attention(q, k_cache, v_cache, table, ctx, 0.125)
    assert_matches(out, expected.to(dtype), dtype)


def test_heuristic_splits_few_long_sequences_only(tk):
    choose = tk.triton_decode.choose_num_splits
    assert choose(1, 8, 16384, 132) > 16  # one long sequence: spread it over the SMs
    assert 1 < choose(16, 8, 4096, 132) < 8
    assert choose(64, 8, 4096, 132) == 1  # 512 programs already fill 132 SMs
    assert choose(1, 8, 300, 132) == 1  # too short to pay for the reduce
    assert choose(4, 2, 600, 132) == 2  # what test_decode_split_k_on_and_off gets from None
    assert tk.triton_decode.split_plan(3, 100, 64) == (2, 64)


def test_pure_decode_and_pure_prefill_batches(tk):
    # max_query_len == 1 launches only the decode kernel; equal chunks only the prefill one;
    # one token short of equal chunks must still launch both
    cases = (([(45, 1), (3, 1), (90, 1)], 1), ([(20, 4), (9, 4)], 4), ([(20, 2), (9, 1)], 2))
    for seqs, max_q in cases:
        batch = make_batch(seqs, 16, 1, 4, 64, torch.float32, seed=11)
        out = tk.triton_attention.paged_attention(*batch, 0.2, max_query_len=max_q)
        assert_matches(out, reference.paged_attention(*batch, 0.2), torch.float32)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    lens=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 20)), min_size=1, max_size=5),
    block_size=st.sampled_from([16, 32]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 32, 64]),
    seed=st.integers(0, 2**16),
)
def test_random_ragged_batches_match_reference(tk, lens, block_size, group, head_dim, seed):
    seqs = [(ctx, min(q_len, ctx)) for ctx, q_len in lens]  # q_len 0: an idle sequence
    if sum(q for _, q in seqs) == 0:
        seqs[0] = (seqs[0][0], 1)
    batch = make_batch(seqs, block_size, 2, group, head_dim, torch.float32, seed)
    out = tk.triton_attention.paged_attention(*batch, head_dim**-0.5)
    assert_matches(out, reference.paged_attention(*batch, head_dim**-0.5), torch.float32)


@pytest.mark.parametrize(("head_dim", "group", "block_size"), [(16, 3, 16), (80, 2, 32)])
def test_odd_shapes(tk, head_dim, group, block_size):
    # SmolLM2's group of 3, a 16-wide head (tiny models), a head padded to 128 lanes; an
    # idle sequence (q_len 0) and no max lengths given (computed from the tensors)
    seqs = [(40, 5), (7, 0), (17, 1), (2, 2)]
    batch = make_batch(seqs, block_size, 2, group, head_dim, torch.float32, seed=2)
    out = tk.triton_attention.paged_attention(*batch, 0.3)
    assert_matches(out, reference.paged_attention(*batch, 0.3), torch.float32)


# fp32 -> bf16 is left out: the interpreter (triton 3.7.1) truncates where a GPU rounds to
# nearest even, so it differs from torch by one ulp; fp32 -> fp16 rounds alike in both.
@pytest.mark.parametrize(("row_dtype", "cache_dtype"), [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float16)])
def test_write_kv_matches_reference(tk, row_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(1)
    shape = (6, 16, 2, 64)  # 96 slots
    caches = [torch.randn(shape, generator=gen).to(cache_dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    qkv = torch.randn(5, 6, 64, generator=gen).to(row_dtype)  # k, v: strided views of it
    k, v = qkv[:, 1:3], qkv[:, 3:5]
    slots = torch.tensor([13, -1, 0, 95, -1], dtype=torch.int64)
    tk.triton_attention.write_kv(*caches, k, v, slots)
    reference.write_kv(*expected, k, v, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_write_then_attend_round_trip(tk):
    block_size, kvh, ctx = 16, 2, 40
    blocks = [5, 1, 3]
    k_cache = torch.randn(8, block_size, kvh, 32)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(ctx, kvh, 32), torch.randn(ctx, kvh, 32)
    slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size
                          for p in range(ctx)])
    tk.triton_attention.write_kv(k_cache, v_cache, k, v, slots)
    q = torch.randn(3, kvh * 2, 32)
    out = tk.triton_attention.paged_attention(
        q, k_cache, v_cache, torch.tensor([blocks], dtype=torch.int32),
        torch.tensor([ctx], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), 0.3)
    torch.testing.assert_close(out, reference.reference_attention(q, k, v, 0.3))


def test_tiny_model_same_logits_on_both_backends(tk, tiny_llama_dir):
    from fixtures.paged import PagedHarness

    from engine.models import load_model

    model = load_model(tiny_llama_dir).model
    feeds = [{"a": list(range(3, 40)), "b": [7, 8]}, {"a": [41], "b": list(range(50, 60))},
             {"a": [42], "b": [61]}]
    logits = {}
    for name in ("reference", "triton"):
        assert kernels.use_attention_backend(model, name).name == name
        harness = PagedHarness(model, num_blocks=16, block_size=16, seed=3)
        logits[name] = [harness.step(feed) for feed in feeds]
    for ref_step, tri_step in zip(logits["reference"], logits["triton"], strict=True):
        for seq, ref in ref_step.items():
            torch.testing.assert_close(tri_step[seq], ref, atol=1e-4, rtol=1e-4)


def test_auto_uses_reference_for_cpu_tensors(tk, monkeypatch):
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, "auto")
    backend = kernels.get_attention_backend()
    assert not torch.cuda.is_available() or backend.name == "auto"
    batch = make_batch([(5, 2)], 16, 1, 1, 16, torch.float32, seed=0)
    if backend.name == "reference":  # no CUDA here: auto is the reference itself
        assert backend.paged_attention is reference.paged_attention
    # the cpu backend's native prefill kernel sums in another order than the reference
    torch.testing.assert_close(backend.paged_attention(*batch, 1.0),
                               reference.paged_attention(*batch, 1.0), atol=2e-5, rtol=2e-5)


def test_forced_triton_without_interpreter_fails_clearly(tk, monkeypatch):
    monkeypatch.setenv(kernels.ATTENTION_ENV_VAR, "triton")
    backend = kernels.get_attention_backend()  # allowed: the interpreter is on
    assert backend.name == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    batch = make_batch([(5, 2)], 16, 1, 1, 16, torch.float32, seed=0)
    with pytest.raises(kernels.BackendUnavailableError, match="BATCHPILOT_ATTENTION=reference"):
        backend.paged_attention(*batch, 1.0)  # CPU tensors: refused before any launch
    if not torch.cuda.is_available():
        with pytest.raises(kernels.BackendUnavailableError, match="CUDA"):
            kernels.get_attention_backend()


def test_a_q_of_another_head_dim_than_the_cache_is_refused(tk):
    """q rows of another head_dim than the cache's are a ValueError before any launch, not
    an attention over misread rows."""
    q, k_cache, v_cache, *_ = make_batch([(5, 2)], 16, 1, 1, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="head_dim"):
        tk.triton_launch.check_attention_inputs(q[..., :8], k_cache, v_cache)
    assert tk.triton_launch.check_attention_inputs(q, k_cache, v_cache) is q


def test_kernels_compile_for_sm90_without_spills():
    # The interpreter runs the kernels' logic; this runs Triton's real compiler (to sm_90
    # cubin, no GPU needed) on the variants the engine launches, and checks the resources.
    result = subprocess.run(
        [sys.executable, "-m", "bench.kernel_compile", "--quick", "--strict"],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
