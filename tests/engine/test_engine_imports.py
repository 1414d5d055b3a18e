"""The engine's core imports no torch: `import engine` (its public names) and the engine,
config, scheduler and simulator modules load in a process that never imports torch, so the
control plane's tools and the simulated engine start without it; `LLM` and
`RequestOutput` load on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
import engine
from engine import RequestStatus, SamplingParams
import engine.engine, engine.config.yaml_loader, engine.config.patch, engine.reports
import engine.scheduling.scheduler, engine.lanes.admission, engine.sim.executor
heavy = sorted(m for m in ("torch", "transformers", "fastapi", "duckdb", "prometheus_client")
               if m in sys.modules)
print(json.dumps({"heavy": heavy, "public": sorted(engine.__all__)}))
"""


def test_the_engine_core_imports_no_torch():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], result
    assert result["public"] == ["LLM", "RequestOutput", "RequestStatus", "SamplingParams"]


def test_the_lazy_public_names_resolve():
    import engine
    from engine.llm import LLM
    from engine.output.processor import RequestOutput

    assert engine.LLM is LLM and engine.RequestOutput is RequestOutput
