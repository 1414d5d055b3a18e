"""Sanity checks of the smoke figures of the engine's and kernels' benchmarks.

tests/bench/test_bench_smoke.py runs each smoke and calls CHECKS[its name] on its JSON line.
Each check asserts what the run must have done and that its figures are finite and in
range; never a speed goal (a tiny model beside the rest of make test)."""

from __future__ import annotations

import importlib.metadata
import math
import statistics

import pytest


def _spread(stat: dict) -> None:
    """A {median, min, max} of positive finite samples, the median inside its range."""
    assert 0 < stat["min"] <= stat["median"] <= stat["max"] < math.inf, stat


def check_malloc_tuning(result: dict) -> None:
    """Both sides ran their rounds in processes of their own, the rates finite and positive
    and the ratio theirs; faults counted. Which side is faster is printed, never asserted."""
    sides = result["sides"]
    for side in ("on", "off"):
        got = sides[side]
        assert got["runs"] == 2 and got["faults_median"] >= 0, result
        low, high = got["tok_s_range"]
        assert 0 < low <= got["tok_s_median"] <= high and math.isfinite(high), result
    ratio = sides["on"]["tok_s_median"] / sides["off"]["tok_s_median"]
    assert result["ratio_on_off"] == pytest.approx(ratio, abs=1e-3), result


def check_step_law_fit(result: dict) -> None:
    """Every shape measured and priced by both laws, the ratios finite and positive and
    their ranges the shapes' own; which law fits better is printed, never asserted."""
    assert [(r["decodes"], r["context"]) for r in result["shapes"]] == [(1, 32), (4, 32),
                                                                        (16, 32)]
    for name in ("own_terms", "one_law"):
        ratios = [r[f"{name}_ratio"] for r in result["shapes"]]
        assert all(math.isfinite(x) and x > 0 for x in ratios), result
        assert result["ratio_range"][name] == [min(ratios), max(ratios)], result
    one = result["laws"]["one_law"]  # one law: decodes priced as prompt tokens
    assert one["decode_fixed_ms"] == one["fixed_ms"] and one["decode_row_ms"] == one["token_ms"]


def check_cpu_peers(result: dict) -> None:
    """Our sides ran with positive finite rates; the peer either ran (its sides and both
    ratios present) or says why not (it is not a project dependency: CI has no venv for
    it)."""
    sides = result["sides"]
    assert 0 < sides["ours"]["median"] < math.inf and sides["ours"]["n"] == result["rounds"]
    # one-stream decode rates: a round whose run was no longer than its first token alone
    # (a tiny model on a busy machine) has none
    assert all(0 < side["median"] < math.inf for side in sides.values())
    if "skipped" in result["peer"]:
        assert "bench.cpu_peers --setup" in result["peer"]["skipped"] or \
            "openvino_genai" in result["peer"]["skipped"], result["peer"]
        assert result["ratios"] == {} and result["paired"] == {} and "openvino" not in sides
    else:
        assert "ours/openvino" in result["ratios"]
        assert all(0 < r < math.inf for r in result["ratios"].values())
        assert result["paired"]["ours/openvino"]["n"] == result["rounds"]


def check_cpu_attention_ab(result: dict) -> None:
    """Both smoke steps timed on the same sides, ms per step positive and medians in range:
    the committed and torch sides always, the three native ones together, or none where the
    library did not build (allowed only where a test of it would skip: must_build())."""
    from fixtures.native_build import must_build  # imports torch: only when checked

    assert result["context"] == 40 and result["threads"] == 2 and "engine" not in result
    steps = result["kernel"]
    assert set(steps) == {"decode x4", "mixed 16+2"}, result
    native = {"native", "native_bf16", "native_bf16_f32dot"}  # the AMX or AVX512-BF16 path
    for step in steps.values():
        assert set(step) == set(steps["decode x4"]), steps
        assert set(step) in ({"before", "torch"}, {"before", "torch"} | native), step
        assert native <= set(step) or not must_build(), "CI has a compiler: native must run"
        for stat in step.values():
            _spread(stat)


def _check_roofline_step(step: dict, stream: dict, weight_dtypes: set) -> None:
    """One step of cpu_roofline: timed, profiled, and each rate the quotient of its terms."""
    _spread(step["wall_ms"])
    for name, ms in step["profiled_ms"].items():
        if name != "other_top_ops_ms":  # projections are 0 where the native layers ran them
            assert 0 <= ms["min"] <= ms["median"] < math.inf, (name, ms)
    assert step["profiled_ms"]["total"]["min"] > 0 and step["proj_gflop"] > 0, step
    assert step["attn_gflop"] > 0 and set(step["weight_dtypes"]) <= weight_dtypes, step
    wall_s = step["wall_ms"]["min"] / 1e3
    assert step["tokens_per_s"] == pytest.approx(step["tokens"] / wall_s), step
    flop = step["proj_gflop"] + step["attn_gflop"]
    assert step["step_gflops"] == pytest.approx(flop / wall_s), step
    assert set(step["ceiling"]) == {"fp32", "bf16"}, step
    for dtype, ceiling in step["ceiling"].items():
        floor = stream[dtype]["ms_per_pass"]["min"]  # the ideal is no faster than streaming
        assert ceiling["ideal_ms"] >= floor * (1 - 1e-9), (dtype, ceiling)
        assert ceiling["bound"] in ("gemm", "streaming"), ceiling
        assert ceiling["bound"] == "gemm" or ceiling["ideal_ms"] == pytest.approx(floor)
        gflops = step["proj_gflop"] / ceiling["ideal_ms"] * 1e3
        assert ceiling["gflops"] == pytest.approx(gflops), (dtype, ceiling)
        assert ceiling["step_ratio"] == pytest.approx(step["step_gflops"] / gflops), ceiling
        assert ceiling["proj_ratio"] == pytest.approx(step["proj_gflops"] / gflops), ceiling


def check_cpu_roofline(result: dict) -> None:
    """GEMM ceilings in fp32 and bf16 at every shape and smoke row count, weight streaming in
    both (fp32 twice bf16's bytes), every smoke step timed, profiled and priced. Which dtype
    or bound wins is the CPU's (AMX, AVX512-BF16 or neither): printed, never asserted."""
    gemm, stream = result["gemm_gflops"], result["streaming"]
    assert set(gemm) == {"fp32", "bf16"} and set(gemm["fp32"]) == set(gemm["bf16"]), result
    for table in gemm.values():
        for shape in table.values():
            assert set(shape) == {"label", "1", "4", "16"}, shape
            for rows in ("1", "4", "16"):
                _spread(shape[rows])
    assert stream["fp32"]["bytes"] == 2 * stream["bf16"]["bytes"] > 0, stream
    for side in stream.values():
        _spread(side["ms_per_pass"])
        _spread(side["gb_s"])
        best = side["bytes"] / side["ms_per_pass"]["min"] / 1e6
        assert side["gb_s"]["max"] == pytest.approx(best), side
    assert {name: (s["tokens"], s["sample_rows"]) for name, s in result["steps"].items()} == {
        "decode x1": (1, 1), "decode x4": (4, 4), "prefill 16": (16, 1)}, result["steps"]
    for step in result["steps"].values():
        _check_roofline_step(step, stream, set(result["weight_dtypes"]))
    assert result["params"] > 0 and result["linear_weight_bytes"] > 0, result


def check_dtype_agreement(result: dict) -> None:
    """Every side ran the 16 parity prompts for 6 tokens, its counts consistent (identical:
    no first difference; agreeing positions cover the agreeing prefixes). How far bf16 (AMX
    or AVX512-BF16) drifts from float32 is the CPU's and the model's: never asserted."""
    tokens, sides = result["tokens"], result["sides"]
    assert tokens == 6 and result["context"] == 40, result
    assert set(sides) == {"auto batched", "auto one at a time", "bfloat16 batched",
                          "auto batched, float32 prefill attention",
                          "auto batched, float32 decode attention"}, sides
    for side in sides.values():
        firsts = side["first_differences"]
        assert side["sequences"] == 16 and side["identical"] == 16 - len(firsts), side
        assert firsts == sorted(firsts) and all(0 <= f < tokens for f in firsts), side
        same = side["positions"] * 16 * tokens
        assert 0 <= side["positions"] <= 1 and same == pytest.approx(round(same)), side
        assert sum(firsts) + tokens * side["identical"] <= round(same), side
        assert round(same) <= 16 * tokens - len(firsts), side


def check_fused_layers_ab(result: dict) -> None:
    """Every smoke step shape timed on both sides, positive with medians in range, the
    speedup the quotient of their medians (its size is printed, never asserted)."""
    steps = result["steps"]
    assert list(steps) == ["decode x20", "prefill 24", "prefill 24 + 16 decodes",
                           "prefill 24 in 3 prompts"], steps
    assert result["context"] == 20 and result["threads"] >= 1, result
    for row in steps.values():
        assert set(row) == {"torch", "fused", "speedup"}, row
        _spread(row["torch"])
        _spread(row["fused"])
        speedup = row["torch"]["median"] / row["fused"]["median"]
        assert row["speedup"] == pytest.approx(speedup), row


def check_native_layers_ab(result: dict) -> None:
    """Both smoke step sizes timed on all six sides (the smoke rounds the tiny model to GGUF
    blocks, so the gguf and tiles sides run; tiles fall back to gguf without AMX), each
    ratio the quotient of its sides' medians, best torch the faster torch side."""
    steps = result["steps"]
    assert list(steps) == ["1", "3"] and result["context"] == 20, result
    sides = ("torch_fp32", "torch_bf16", "native_fp32", "native_bf16", "native_gguf",
             "native_tiles")
    pairs = (("native_bf16", "best_torch"), ("native_bf16", "native_fp32"),
             ("native_gguf", "native_bf16"), ("native_gguf", "best_torch"),
             ("native_tiles", "native_gguf"), ("native_tiles", "best_torch"))
    for row in steps.values():
        assert set(row) == {*sides, *(f"{b}_vs_{a}" for b, a in pairs)}, row
        for side in sides:
            _spread(row[side])
        median = {side: row[side]["median"] for side in sides}
        median["best_torch"] = min(median["torch_fp32"], median["torch_bf16"])
        ratios = {f"{b}_vs_{a}": median[a] / median[b] for b, a in pairs}
        assert {k: row[k] for k in ratios} == pytest.approx(ratios), row


def check_kernel_compile(result: dict) -> None:
    """The smoke's variants (its --json file) compiled for sm_90 by the installed Triton,
    none over its limits (--strict exits 1 on one; asserted here to show which): each
    kernel's shared memory within the H100's, its registers within a thread's 255."""
    assert result["arch"] == 90 and result["failures"] == [], result
    assert result["triton"] == importlib.metadata.version("triton"), result
    variants = result["variants"]
    assert {v["kernel"] for v in variants} == {"_decode_kernel", "_prefill_kernel"}, variants
    for v in variants:
        assert 0 < v["smem"] <= 232448, v  # sm_90's opt-in maximum per block
        assert v["regs"] is None or 0 < v["regs"] <= 255, v  # None: ptxas did not say
        assert all(n >= 0 for n in v["ops"].values()), v


def check_offline_throughput(result: dict) -> None:
    """Every side ran the 4 requests once (the bench asserts their forced lengths) at a
    positive rate, each ratio its sides' quotient (2 decimals); hf_cb may be missing: a
    failure of transformers' new continuous batching API drops that side only."""
    assert (result["requests"], result["rounds"], result["against"]) == (4, 1, None), result
    sides = result["sides"]
    assert set(sides) - {"hf_cb"} == {"auto", "auto_kvf32", "sampled", "fp32", "hf_static"}
    for side in sides.values():
        low, high = side["range"]
        assert 0 < low == side["median"] == side["tok_s"] == high < math.inf, side  # 1 round
    ratios = {"auto/hf_static", "auto/fp32", "auto/auto_kvf32", "sampled/auto"}
    assert set(result["ratios"]) == ratios | ({"auto/hf_cb"} & {f"auto/{s}" for s in sides})
    for key, ratio in result["ratios"].items():
        top, bottom = key.split("/")
        quotient = sides[top]["tok_s"] / sides[bottom]["tok_s"]
        assert ratio == pytest.approx(quotient, abs=0.006), (key, result)


def check_single_stream(result: dict) -> None:
    """Both engine sides (on the GGUF blocks, and on the bf16 copies beside them) ran their
    2 rounds of 8 tokens (each generated all 8) at positive rates, the ratio their medians'
    quotient; llama.cpp is always left out of a smoke (the tiny model is no GGUF file it
    can load)."""
    assert (result["tokens"], result["rounds"]) == (8, 2), result
    sides = result["sides"]
    assert set(sides) == {"gguf", "bf16"} and result["tokens_equal_to_llama_cpp"] is None
    assert result["note"].startswith("llama_cpp left out"), result
    for side in sides.values():
        assert 0 < side["min"] <= side["tok_s"] <= side["max"] < math.inf, side
        assert side["generated"] == result["tokens"], side  # ignore_eos: every token
    quotient = sides["gguf"]["tok_s"] / sides["bf16"]["tok_s"]
    assert result["ratios"] == pytest.approx({"gguf/bf16": quotient}), result


def check_scheduler_overhead(result: dict) -> None:
    """Both sizes timed in both modes and with KV events off and on, block hashing on both
    sides, each ratio its sides' quotient; continuous vs static counted in simulated steps,
    continuous never beating its ideal."""
    for key in ("us_per_step", "us_per_step_with_arrivals"):
        assert set(result[key]) == {"1", "8"}, result
        assert all(0 < us < math.inf for us in result[key].values()), result
    events = result["kv_events"]
    assert events["rounds"] == 1 and set(events) == {"rounds", "1", "8"}, events
    for row in (events["1"], events["8"]):
        assert row["off_us"] > 0 and row["ratio_range"] == [row["on_over_off"]] * 2, row
        # one round: its ratio is the sides' quotient, up to their rounding to 0.1 µs
        assert row["on_over_off"] == pytest.approx(row["on_us"] / row["off_us"], rel=0.02)
    hashing = result["block_hash_us"]
    assert (hashing["block_size"], hashing["blocks_per_round"], hashing["rounds"]) == (16, 512, 3)
    for side in ("builtin", "blake2b"):
        low, high = hashing[f"{side}_range"]
        assert 0 < low <= hashing[side] <= high < math.inf, hashing
    quotient = hashing["blake2b"] / hashing["builtin"]
    assert hashing["ratio"] == pytest.approx(quotient, rel=1e-2, abs=0.01), hashing
    # static takes its theory's steps (a batch runs to its longest output) and continuous at
    # least its ideal's (max_num_seqs tokens a step): exact counts, so a share at most 1
    assert 0 < result["share_of_theory"] <= 1 and result["cont_vs_static"] > 0, result


def check_lane_preemption(result: dict) -> None:
    """Each seed ran on and off over one trace (virtual clock): all batch requests finished,
    each interactive one finished, timed out or was refused; ratios their sides' quotients,
    the summaries theirs. Which setting wins is printed, never asserted."""
    assert (result["seeds"], result["batch"], result["interactive"]) == (2, 12, 20), result
    runs = result["runs"]
    assert [run["seed"] for run in runs] == list(range(result["seeds"])), result
    for run in runs:
        on, off = run["on"], run["off"]
        for side in (on, off):
            assert side["batch_done"] == result["batch"] and side["preemptions"] >= 0, side
            chat = side["chat_done"] + side["chat_timeouts"] + side["rejected"]
            assert chat == result["interactive"] and side["chat_done"] > 0, side
            assert 0 < side["chat_ttft_p50_s"] <= side["chat_ttft_p99_s"] < math.inf, side
            assert 0 < side["batch_makespan_s"] <= side["sim_seconds"], side
        ttft = off["chat_ttft_p99_s"] / on["chat_ttft_p99_s"]
        assert run["ttft_p99_off_over_on"] == pytest.approx(ttft, abs=0.006), run
        makespan = on["batch_makespan_s"] / off["batch_makespan_s"]
        assert run["batch_makespan_on_over_off"] == pytest.approx(makespan, abs=6e-4), run
    for key in ("ttft_p99_off_over_on", "batch_makespan_on_over_off"):
        values = [run[key] for run in runs]
        assert result[key] == {"median": statistics.median(values), "min": min(values),
                               "max": max(values)}, (key, result)


CHECKS = {
    "malloc_tuning": check_malloc_tuning,
    "step_law_fit": check_step_law_fit,
    "cpu_peers": check_cpu_peers,
    "cpu_attention_ab": check_cpu_attention_ab,
    "cpu_roofline": check_cpu_roofline,
    "dtype_agreement": check_dtype_agreement,
    "fused_layers_ab": check_fused_layers_ab,
    "native_layers_ab": check_native_layers_ab,
    "kernel_compile": check_kernel_compile,
    "offline_throughput": check_offline_throughput,
    "single_stream": check_single_stream,
    "scheduler_overhead": check_scheduler_overhead,
    "lane_preemption": check_lane_preemption,
}
