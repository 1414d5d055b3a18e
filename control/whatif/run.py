"""The whole what-if from a trace: read the window, fit, reconstruct the recorded config,
replay and compare. Two halves, so the server can read on a thread (its DuckDB cursor)
and predict in another process (the replay is CPU-bound Python and would hold the GIL
against the engine thread).

    window = read_window(con, since, until)                  # the trace read, once
    result = predict(window, base, proposals, slo=slo)       # picklable arguments
"""

from __future__ import annotations

from typing import Any

from control.loadtest.records import SLO
from control.whatif.calibrate import calibrate
from control.whatif.compare import compare
from control.whatif.configs import recorded_config
from control.whatif.window import Window
from engine.config import EngineConfig


def predict(window: Window, base: EngineConfig, proposals: dict[str, dict[str, Any]], *,
            exact: bool = False, slo: SLO | None = None, notes: list[str] | None = None,
            progress: bool = False, workers: int = 1, rate_scale: float = 1.0,
            rate_sweep: tuple[float, ...] = (), replicas: int = 1) -> dict[str, Any]:
    """`base`: the server's config at the window's version (`exact`), else a YAML's or the
    defaults, overlaid with what the trace records (control/whatif/configs.py); `workers`:
    processes to replay the configs side by side (replay_many.replays); `rate_scale`,
    `rate_sweep`, `replicas`: the arrivals faster or slower, on a fleet (compare.compare,
    control/whatif/capacity.py, fleet_replay.py)."""
    model = calibrate(window.samples)
    recorded, config_notes = recorded_config(window, base, exact)
    return compare(window, model, recorded, proposals, slo,
                   list(notes or ()) + config_notes, progress, workers,
                   rate_scale=rate_scale, rate_sweep=rate_sweep, replicas=replicas)
