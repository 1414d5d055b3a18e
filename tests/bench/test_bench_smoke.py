"""Every benchmark runs end to end in --smoke mode (tiny sizes, seconds, the same code), so a
broken benchmark fails CI. Each runs as a user runs it: `python -m bench.NAME --smoke` from
the repository root, in a subprocess; it must exit 0 and end with its JSON line. The GPU
benchmarks run through `bench/gpu_check.sh --dry-run` instead (test_gpu_check_dry_run.py).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from smoke_checks_engine import CHECKS as ENGINE
from smoke_checks_fleet import CHECKS as FLEET
from smoke_checks_planning import CHECKS as PLANNING
from smoke_checks_serving import CHECKS as SERVING

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
CHECKS = {**ENGINE, **SERVING, **PLANNING, **FLEET}  # bench name -> check of its JSON line
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


def test_every_smoke_has_a_sanity_check_of_its_figures():
    assert set(CHECKS) == set(SMOKE_RUNS), (
        "each smoke's JSON is checked for sanity: add a check to a tests/bench/smoke_checks_*"
        f" module; missing {sorted(set(SMOKE_RUNS) - set(CHECKS))},"
        f" stray {sorted(set(CHECKS) - set(SMOKE_RUNS))}")


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_benchmark_runs_in_smoke_mode(name, smokes):
    result, out = smokes.result(f"smoke:{name}")
    if name in WRITES_JSON:  # the file holds the printed figures and the rest
        result = json.loads(out.read_text())
        assert result["bench"] == name
    if "smoke" in result:  # the figures of a tiny run are marked as such
        assert result["smoke"] is True
    CHECKS[name](result)  # what the run must have done; figures finite, in range


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


