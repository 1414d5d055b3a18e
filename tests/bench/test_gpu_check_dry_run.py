"""bench/gpu_check.sh, the only path to our GPU figures, runs on CPU before a GPU sees it:
`--dry-run` runs every step of the real script with --smoke (tiny shapes, Triton's
interpreter) and must write the same gpu_check.json, every step ok. And the GPU machine has
only torch, triton, transformers and this repository: the GPU steps import nothing else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"
# what the GPU steps import, including what their functions import when they run
GPU_MODULES = ("bench.kernel_check", "bench.kernel_speed", "bench.gpu_parity",
               "bench.gpu_engine", "bench.random_models", "bench.paged_inputs",
               "kernels.triton_attention", "kernels.reference", "engine.llm", "engine.models",
               "tests.fixtures.tiny_models")
GPU_MACHINE_DISTRIBUTIONS = ("torch", "triton", "transformers")
# Imported by an allowed distribution only when installed (torch.utils.data imports dill if
# it can; here guidellm's datasets brings it): absent on the GPU machine, skipped there.
OPTIONAL_IMPORTS = {"dill"}


def script_steps() -> list[str]:
    """The step names of gpu_check.sh, in order: `run_step NAME LIMIT MODULE ...` lines."""
    return re.findall(r"^run_step (\w+) ", SCRIPT.read_text(), flags=re.MULTILINE)


def dry_run(folder: Path) -> Path:
    """`gpu_check.sh --dry-run` writing into `folder` (conftest's pool runs it beside the
    smokes) -> the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OUT": str(folder), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=540)  # < pytest's 600
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return folder


def test_dry_run_runs_every_step_and_writes_the_summary(smokes):
    tmp_path = smokes.result("gpu_check_dry_run")
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["ok"] is True and summary["dry_run"] is True
    assert list(summary["steps"]) == script_steps() and len(script_steps()) >= 5
    for name, step in summary["steps"].items():
        assert step["status"] == "ok", name
        assert step["result"], f"{name} wrote no JSON"
        assert (tmp_path / "gpu_check_logs" / f"{name}.log").exists()
    # the interpreter's timings are no GPU figures, and the summary does not pretend they are
    speed = summary["steps"]["kernel_speed"]["result"]
    assert speed["figures_meaningful"] is False and speed["device"] == "cpu (interpreter)"
    assert summary["headline"]["decode_b64_ctx4k_fraction_of_peak"] is None
    assert summary["headline"]["kernel_check_ok"] and summary["headline"]["parity_ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the real check would run")
def test_without_a_gpu_the_real_check_stops_before_any_step(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no CUDA GPU" in done.stderr and "--dry-run" in done.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def requirement_closure(names) -> set[str]:
    """Distributions that installing `names` brings (their unconditional requirements)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a platform-specific requirement not installed here
        todo += [r for r in requires if "extra ==" not in r and "extra==" not in r]
    return seen


def test_gpu_steps_import_only_what_the_gpu_machine_has():
    allowed = requirement_closure(GPU_MACHINE_DISTRIBUTIONS)
    code = ("import json, sys; before = set(sys.modules)\n"
            f"for name in {GPU_MODULES!r}: __import__(name)\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    owners = metadata.packages_distributions()  # import name -> distributions
    foreign = {}
    for top in json.loads(done.stdout.strip().splitlines()[-1]):
        if (top in sys.stdlib_module_names or top in OPTIONAL_IMPORTS
                or top in ("bench", "engine", "kernels", "tests")
                or top.startswith(("__", "_sysconfigdata"))):  # the interpreter's own
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(top, [])}
        if not dists & allowed:
            foreign[top] = sorted(dists) or "unknown"
    assert not foreign, f"the GPU steps import modules the GPU machine lacks: {foreign}"
