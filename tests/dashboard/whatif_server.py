"""A live server for the dashboard's what-if tests: the tiny model behind the real app,
over a trace that already holds a realistic recent workload (60 requests from the
simulated engine of tests/control/whatif/whatif_sim_trace.py, recorded 10 minutes ago, so
the dashboard's "last 15 min" holds them and its "last 5 min" is empty).

    with whatif_server(tiny_loaded, tmp) as url: ...
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fixtures.serving import LiveServer, make_engine

from control.serve.settings import ServeSettings
from engine.config import LiveConfig

# NOTE: the simulated-trace helper lives beside the what-if tests (not a package): load it
# by path rather than copy it.
_SIM = Path(__file__).resolve().parents[1] / "control" / "whatif" / "whatif_sim_trace.py"
_spec = importlib.util.spec_from_file_location("whatif_sim_trace", _SIM)
assert _spec is not None and _spec.loader is not None
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

BUDGETS = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "prefill_chunk_size": 128}
REQUESTS = 60
AGO_S = 600  # the workload's first arrival, before the server starts


@contextlib.contextmanager
def whatif_server(tiny_loaded: Any, tmp: Path) -> Iterator[str]:
    """The server's URL; its config has the budgets the trace was recorded under."""
    path = str(tmp / "trace.duckdb")
    sim.record(path, LiveConfig(**BUDGETS), n=REQUESTS, start=time.time() - AGO_S)
    settings = ServeSettings(model="tiny", trace_db=path)
    engine, _, settings = make_engine(tiny_loaded, settings=settings, **BUDGETS)
    try:
        with LiveServer(engine, settings) as url:
            yield url
    finally:
        engine.stop()
