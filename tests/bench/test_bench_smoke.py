"""Every benchmark runs end to end in --smoke mode (tiny sizes, seconds, the same code), so a
broken benchmark fails CI. Each runs as a user runs it: `python -m bench.NAME --smoke` from
the repository root, in a subprocess; it must exit 0 and end with its JSON line. The GPU
benchmarks run through `bench/gpu_check.sh --dry-run` instead (test_gpu_check_dry_run.py).
"""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
# module -> extra arguments after --smoke
SMOKE_RUNS: dict[str, list[str]] = {
    "scheduler_overhead": [],
    "trace_overhead": [],
    "offline_throughput": [],
    "dashboard_load": [],
    "hostile_traffic": [],
    "lane_preemption": [],
    "loadtest_goals": [],
    "tuning_sweep": [],
    "kernel_compile": ["--strict"],
    "cpu_roofline": [],
    "latency_reconcile": [],
    "whatif_speed": [],
    "whatif_accuracy": [],
    "fleet_routing": [],
    "cpu_attention_ab": [],
    "fleet_control": [],
    "fleet_scaling": [],
    "fleet_autoscale": [],
    "native_layers_ab": [],
    "fused_layers_ab": [],
    "dtype_agreement": [],
    "single_stream": [],
    "openapi_fuzz": [],
    "goodput_policy": [],
    "step_cost_drift": [],
    "cpu_peers": [],
    "serving_path": [],
    "step_law_fit": [],
    "malloc_tuning": [],
}
# seconds a smoke may take (default 240): the fleet smokes start Ray and three or four
# replica processes; beside the other half of make test on a loaded CI machine
# fleet_scaling took 240 s where it takes 50 s alone
SMOKE_TIMEOUT_S = {"fleet_scaling": 480, "fleet_control": 480, "fleet_autoscale": 480}
WRITES_JSON = {"kernel_compile"}  # takes --json FILE (the others print their JSON only)
GPU_CHECK_STEPS = {"kernel_check", "kernel_speed", "gpu_parity", "gpu_engine"}
# imported by benchmarks, no main()
HELPERS = {"step_cost", "paged_inputs", "random_models", "roofline_steps", "roofline_profile",
           "hf_baselines", "quantized_models", "poison_requests", "poison_phase", "raw_http",
           "openvino_peer", "otlp_sink", "fleet_routing_bed", "stream_client"}


def run_module(name: str, *args: str, timeout: float = 240) -> dict:
    """`python -m bench.NAME ARGS` from the repository root -> its last stdout line (JSON)."""
    done = subprocess.run([sys.executable, "-m", f"bench.{name}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    lines = done.stdout.strip().splitlines()
    assert lines, tail
    result = json.loads(lines[-1])
    assert isinstance(result, dict) and result, tail
    return result


def smoke_run(name: str, folder: Path) -> tuple[dict, Path]:
    """`python -m bench.NAME --smoke ...` -> (its JSON line, the --json file it may write)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "result.json"
    json_arg = ["--json", str(out)] if name in WRITES_JSON else []
    return run_module(name, "--smoke", *SMOKE_RUNS[name], *json_arg,
                      timeout=SMOKE_TIMEOUT_S.get(name, 240)), out


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_benchmark_runs_in_smoke_mode(name, smokes):
    result, out = smokes.result(f"smoke:{name}")
    if name in WRITES_JSON:
        assert json.loads(out.read_text())["bench"] == name
    if "smoke" in result:  # the figures of a tiny run are marked as such
        assert result["smoke"] is True
    if name == "hostile_traffic":
        check_poison_phase(result["poison"])
    if name == "goodput_policy":
        check_goodput_policy(result)
    if name == "step_cost_drift":
        check_step_cost_drift(result)
    if name == "cpu_peers":
        check_cpu_peers(result)
    if name == "whatif_accuracy":
        check_whatif_accuracy(result)
    if name == "trace_overhead":
        check_trace_overhead(result)
    if name == "fleet_routing":
        check_fleet_routing(result)
    if name == "serving_path":
        check_serving_path(result)
    if name == "fleet_autoscale":
        check_fleet_autoscale(result)
    if name == "step_law_fit":
        check_step_law_fit(result)
    if name == "malloc_tuning":
        check_malloc_tuning(result)


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


def check_fleet_autoscale(result: dict) -> None:
    """The burst scaled 1 -> 2 after the configured delay (not before it: the delay is
    real), the idle spell back to 1 after its own, replica 1 served part of the burst, and
    every request sent ended well, each one a row of a replica's trace (none lost)."""
    assert result["up_delay_s"] <= result["scale_up_s"] < result["ready_s"], result
    assert result["down_delay_s"] <= result["scale_down_s"] <= result["off_s"], result
    # each fired once its want had held the delay: not before (the delay is real), and the
    # policy acted on it within a few ticks and publishes (not a correctness bound: lax)
    for side in ("up", "down"):
        delay, waited = result[f"{side}_delay_s"], result[f"{side}_waited_s"]
        assert delay <= waited < delay + 5.0, result
    assert result["failed"] == 0 and result["ok"] == result["sent"] > 0, result["failures"]
    assert result["by_replica"].get("1", 0) > 0, result["by_replica"]
    assert result["trace_total"] == result["sent"], result["trace_rows"]
    events = [(e["event"], e["replica_id"]) for e in result["events"]]
    assert events == [("scale_up", 1), ("ready", 1), ("scale_down", 1), ("stopped", 1)]
    # replica 0 was live for both: its trace recorded each as an audit row
    assert result["trace_audit"]["replica-0"] == ["autoscale_scale_up",
                                                  "autoscale_scale_down"], result["trace_audit"]


def check_fleet_routing(result: dict) -> None:
    """Every router ran its round; the oracle routed on blocks it found held (the
    ingress's keys matched the replicas' own: broken hashing would leave it 0); the KV
    index learnt blocks from the events in every round (a broken feed: 0). Precise
    decisions themselves are timing: on a fast CPU a smoke round's 16 requests can end
    before the first events arrive. The figures are rates and positive latencies."""
    assert result["workload"] == "cache-pressure" and result["restart"] is True
    for mode in ("precise", "oracle", "affinity", "random"):
        assert 0.0 <= result[f"{mode}_prefix_hit_rate"] <= 1.0
        assert 0.0 < result[f"{mode}_ttft_p50_s"] <= result[f"{mode}_ttft_p99_s"] < 60
        # pooled over the rounds it is at least the smallest round's p99
        assert (result[f"{mode}_ttft_p99_s_range"][0] <= result[f"{mode}_ttft_p99_pooled_s"]
                < 60)
    # the pool was sized under the workload's live prefixes: there is pressure
    assert 0 < result["kv_blocks"] < result["live_blocks"], result
    assert set(result["ratios"]) >= {"prefix_hit_rate:precise/oracle",
                                     "ttft_p99_s:precise/affinity",
                                     "ttft_p99_pooled_s:precise/affinity"}
    assert all(0 < r < math.inf for r in result["ratios"].values())
    assert result["oracle_decisions"].get("precise", 0) > 0, result["oracle_decisions"]
    for mode in ("precise", "oracle", "affinity", "random"):
        assert result[f"{mode}_indexed_blocks"] > 0, result
    assert "precise" not in result["affinity_decisions"]
    # each document is asked for several times a round: a cache in use at all
    assert result["oracle_prefix_hit_rate"] > 0.2


def check_serving_path(result: dict) -> None:
    """Both sides generated every token of the workload (the server refused and failed
    none: a smoke round is far from its SLOs), at positive rates; the ratio is their
    medians' quotient. No bound on its size: a smoke round is tens of milliseconds of a
    tiny model, fixed costs and stalls, not a speed figure (CI once saw 25 when another
    smoke starved the offline side)."""
    assert result["refused"] == 0 and result["failed"] == 0, result
    assert result["tokens"]["server"] == result["tokens"]["offline"], result
    assert result["tokens"]["server_httpx"] == result["tokens"]["offline"], result
    for side in ("offline", "server", "server_httpx"):
        low, high = result[side]["range"]
        assert 0 < low <= result[side]["median_tok_s"] <= high < math.inf, result
    quotient = result["server"]["median_tok_s"] / result["offline"]["median_tok_s"]
    assert result["server_over_offline"] == pytest.approx(quotient, rel=1e-2), result
    assert min(result["per_round_ratio"]) <= result["server_over_offline"] * 1.01
    assert max(result["per_round_ratio"]) >= result["server_over_offline"] * 0.99
    assert len(result["per_round_ratio"]) == result["rounds"]


def check_trace_overhead(result: dict) -> None:
    """Every mode ran; the OTLP ones exported spans (to the sink process) and lost none;
    the ratio 0.1 exported fewer than every request."""
    for side in ("gpu_like", "cpu_bound"):
        run = result[side]
        assert set(run["steps_per_s"]) == {"off", "metrics", "trace", "otlp", "otlp_0.1"}
        assert all(v > 0 for v in run["steps_per_s"].values()), run
        assert run["spans_exported"] > 0 and run["spans_dropped"] == 0, run
        assert run["rows_dropped"] == 0, run


def check_whatif_accuracy(result: dict) -> None:
    """Every run predicted (A itself, each B, A at the faster rate), each error finite
    where both sides have the figure, and the faster run really came faster; the goals are
    printed, never asserted (a tiny model on a shared machine)."""
    assert set(result["errors"]) == {"A (self)", "seqs4", "A_fast"}, result["errors"].keys()
    for row, errs in result["errors"].items():
        assert errs and all(e is None or math.isfinite(e) for e in errs.values()), (row, errs)
        assert errs["ttft_p50"] is not None, row
    assert set(result["signs"]) == {"seqs4", "A_fast"}
    assert set(result["goals"]) == {"A (self)", "seqs4", "A_fast", "signs"}
    assert all(n == result["requests_per_config"] for n in result["requests"].values())
    assert result["patches"]["A_fast"] == result["patches"]["A"]
    # the rate the server saw, which the prediction used: on 6 requests the client's pacing
    # and a busy machine move it far off the 1.5 planned (0.75 once, beside another smoke),
    # so only its sanity is checked here; bench.whatif_accuracy's full run reports it
    assert 0.0 < result["fast_rate_scale"] < math.inf, result["fast_rate_scale"]


def check_step_cost_drift(result: dict) -> None:
    """Readings before and during the hog, finite and positive; how soon the hog was seen
    is printed against its goal, never asserted (a noisy VM moves it)."""
    assert result["steps"] > 100 and result["hogs"] >= 1, result
    for key in ("drift_before", "drift_late_in_hog", "law_scale_before", "law_scale_late",
                "step_s_before", "step_s_late", "tokens_before", "tokens_late",
                "prompt_512_s_before", "prompt_512_s_late",  # the hog stops at 7 s of 10:
                "step_s_after", "tokens_after", "prompt_512_s_after", "law_scale_after"):
        assert result[key] is not None and math.isfinite(result[key]), (key, result)
        assert result[key] > 0, (key, result)
    assert result["law_scale_before"] >= 1 and result["law_scale_late"] >= 1, result
    flagged = result["seconds_to_flag"]
    assert flagged is None or 0 <= flagged <= result["seconds"], result


def check_goodput_policy(result: dict) -> None:
    """Every side at every load, figures finite and in range; the ratios are printed by
    the bench (goals against other sides), never asserted here."""
    sides = {"a_fitted", "b_law", "c_goodput", "c_defer", "c_noshed", "fixed_256", "fixed_512",
             "fixed_1024", "fixed_2048"}
    assert result["summary"], "no load was run"
    # clients that take a refusal as final, and clients that resend as the OpenAI SDK does
    assert {v["clients"] for v in result["summary"]} == {0, 2}, result["summary"]
    for verdict in result["summary"]:
        assert set(verdict["sides"]) == sides, verdict["sides"].keys()
        for side, m in verdict["sides"].items():
            assert all(math.isfinite(v) and v >= 0 for v in m.values()), (side, m)
            assert m["met"] <= m["finished"], (side, m)
        for key in ("goodput_c_over_best_other", "finished_c_over_best"):
            assert math.isfinite(verdict[key]) and verdict[key] > 0, (key, verdict)
    for row in result["rows"]:
        assert row["steps"] > 0 and row["capacity_rps"] > 0, row
        assert row["clients"] or row["resent"] == 0, row  # nothing resent with no retries
        if row["side"].startswith("c_"):  # the policy's steps: at or above the target
            assert row["step_p99_over_target"] > 0, row


def check_poison_phase(poison: dict) -> None:
    """The poison phase's figures are sane, and its goals hold: they are correctness (no
    5xx, no innocent disturbed, each malformed request answered as expected), not speed.
    The TPOT ratio is printed by the bench, never asserted."""
    for key in ("poison_sent", "innocents", "five_xx", "innocents_disturbed",
                "baseline_unstable", "poison_failures"):
        assert isinstance(poison[key], int) and poison[key] >= 0, key
    assert poison["poison_sent"] > 0 and poison["innocents"] > 0
    assert set(poison["poison_by_kind"]) == set(poison["poison_cases"]), "every kind sent"
    for side, timing in poison["tpot_p99_ms"].items():
        for phase in ("A", "B"):
            values = timing["phases"][phase]
            assert len(values) == poison["rounds"], (side, phase)
            assert all(math.isfinite(v) and v > 0 for v in values), (side, phase, values)
        assert math.isfinite(timing["b_over_a"]) and timing["b_over_a"] > 0, side
    assert poison["five_xx"] == 0, poison["failures"]
    assert poison["innocents_disturbed"] == 0, poison["disturbed"]
    assert poison["poison_failures"] == 0, poison["failures"]


def test_scheduler_overhead_against_a_commit_side_by_side():
    # --against checks REF out in a temporary git worktree; HEAD exists wherever git does
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    result = run_module("scheduler_overhead", "--smoke", "--against", "HEAD")
    for mode in ("decode", "arrivals"):
        for row in result[mode].values():
            assert row["a_us"] > 0 and row["b_us"] > 0
            assert row["ratio"] == pytest.approx(row["a_us"] / row["b_us"], rel=0.01)
    worktrees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"],
                               capture_output=True, text=True).stdout
    assert "bench-against-" not in worktrees  # removed at the end


def test_every_benchmark_is_smoke_tested_and_runs_as_a_module():
    modules = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    assert modules - HELPERS == set(SMOKE_RUNS) | GPU_CHECK_STEPS, (
        "a new bench/ module needs a --smoke mode and an entry in SMOKE_RUNS (or a step in "
        "bench/gpu_check.sh), or, if it is a helper without main(), in HELPERS")
    script = (BENCH / "gpu_check.sh").read_text()
    index = ast.get_docstring(ast.parse((BENCH / "__init__.py").read_text()))
    for name in modules:
        source = (BENCH / f"{name}.py").read_text()
        nodes = list(ast.walk(ast.parse(source)))
        assert not [n for n in nodes if isinstance(n, ast.Attribute) and n.attr == "path"
                    and isinstance(n.value, ast.Name) and n.value.id == "sys"], (
            f"bench/{name}.py touches sys.path: `python -m bench.{name}` needs no help")
        assert re.search(rf"\b{name}\b", index), f"bench/__init__.py does not list {name}"
        functions = {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
        if name in HELPERS:
            assert "main" not in functions, f"bench/{name}.py has a main(): smoke-test it"
        else:
            assert "main" in functions and "--smoke" in source, name
    for name in GPU_CHECK_STEPS:
        assert f" bench.{name}" in script, f"gpu_check.sh does not run bench.{name}"


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
