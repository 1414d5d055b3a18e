"""What-if, end to end: the recorded window, its self-prediction, and each proposed config,
side by side with ratios and every warning.

    window = read_window(con, since, until)
    model = calibrate(window.samples)
    recorded, notes = recorded_config(window, base)
    result = compare(window, model, recorded, {"seqs64": {"max_num_seqs": 64}}, slo)

`result` is JSON-ready (what `POST /v1/whatif` returns and `batchpilot whatif --json`
prints). Its columns: `recorded` (what happened), `predicted` (the recorded config
replayed: its distance from `recorded` is the prediction's own error) and one per
proposal; `rows` hold each metric's values with ratios self / recorded and proposal /
predicted (the change the proposal makes, with the replay's bias divided out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from control.loadtest.records import SLO
from control.whatif.calibrate import FEATURES, StepTimeModel
from control.whatif.capacity import scale_window, sweep
from control.whatif.configs import propose
from control.whatif.replay import Prediction
from control.whatif.replay_many import replays
from control.whatif.summary import (
    LATENCIES,
    OUTCOMES,
    PERCENTILES,
    LaneSLOs,
    SLOs,
    predicted_summary,
    recorded_summary,
)
from control.whatif.window import Window
from engine.config import EngineConfig, LiveConfig
from engine.config.patch import diff

RECORDED, PREDICTED = "recorded", "predicted"
AS_IS = "as-is"  # the recorded config, in a capacity sweep
SELF_ERROR_WARN = 0.20  # self-prediction off by more than this on a p50: say so


def _key(*path: str) -> Callable[[dict], Any]:
    def read(summary: dict) -> Any:
        for key in path:  # a group's summary has no KV or preemption figures: None
            summary = summary.get(key) if summary is not None else None
        return summary

    return read


def _metric_rows() -> list[tuple[str, Callable[[dict], Any]]]:
    """(metric, how to read it from a summary), in table order."""
    rows = [(name, _key(name)) for name in ("requests", *OUTCOMES, "goodput_rps",
                                            "slo_met_share")]
    rows += [(f"{name}_p{p}_s", _key(name, f"p{p}")) for name in LATENCIES
             for p in PERCENTILES]
    return rows + [(name, _key(name)) for name in ("kv_peak_usage", "preempted")]


METRIC_ROWS = _metric_rows()


def ratio_rows(summaries: dict[str, dict], metrics=METRIC_ROWS, baseline: str = PREDICTED,
               ) -> list[dict]:
    """{metric, values: {column: v}, ratios: {column: v / its baseline}}: the predicted
    column over recorded, every other over `baseline` (the recorded config replayed at the
    proposals' rate: `predicted`, or `as-is@Kx` under a rate scale)."""
    rows = []
    for metric, read in metrics:
        values = {name: read(s) for name, s in summaries.items()}
        ratios = {}
        for name, v in values.items():
            if name == RECORDED:
                continue
            if name == baseline and baseline != PREDICTED:
                ratios[name] = None  # itself
                continue
            base = values[RECORDED if name == PREDICTED else baseline]
            ratios[name] = None if v is None or not base else v / base
        rows.append({"metric": metric, "values": values, "ratios": ratios})
    return rows


def _beyond_warning(name: str, p: Prediction, model: StepTimeModel) -> str | None:
    if not p.beyond_seen_steps:
        return None
    seen = dict(zip(FEATURES[1:], model.seen_max[1:], strict=True))
    over = ", ".join(f"{k} {p.largest_step[k]:.0f} (fit saw <= {v:.0f})"
                     for k, v in seen.items() if p.largest_step[k] > 1.05 * v)
    return (f"{name}: {p.beyond_seen_steps} of {p.steps} predicted steps"
            f" ({p.beyond_seen_steps / max(p.steps, 1):.0%}) are larger than any step the fit"
            f" has seen: {over}; extrapolated, record traffic under such steps to trust it")


def _self_warnings(summaries: dict[str, dict]) -> list[str]:
    out = []
    rec, pred = summaries[RECORDED], summaries[PREDICTED]
    for name in ("ttft", "tpot", "e2e"):
        a, b = rec[name]["p50"], pred[name]["p50"]
        if a and b is not None and abs(b / a - 1) > SELF_ERROR_WARN:
            out.append(f"self-prediction misses the recorded {name.upper()} p50 by"
                       f" {b / a - 1:+.0%}: read the proposals' ratios to '{PREDICTED}' as"
                       " directions more than amounts")
    return out


def compare(window: Window, model: StepTimeModel, recorded: EngineConfig,
            proposals: dict[str, dict[str, Any]], slo: SLO | None = None,
            notes: list[str] | None = None, progress: bool = False, workers: int = 1,
            rate_scale: float = 1.0, rate_sweep: tuple[float, ...] = (), replicas: int = 1,
            ) -> dict[str, Any]:
    """Raises ValueError naming the proposal and field when a patch is invalid (before any
    replay runs). `workers` > 1: the replays run side by side in that many processes.
    `rate_scale` != 1 or `replicas` > 1: the proposals run on the window's arrivals at that
    multiple of the recorded rate, on that many replicas behind the fleet's router
    (control/whatif/fleet_replay.py), beside the recorded config run the same way (column
    `as-is@Kx,Nrep`, what their ratios divide by); `rate_sweep`: every config at each
    rate (control/whatif/capacity.py), as `capacity`."""
    at = at_label(rate_scale, replicas)
    taken = (RECORDED, PREDICTED, AS_IS, at)
    if any(name in proposals for name in taken):
        raise ValueError(f"a proposal may not be named {' or '.join(map(repr, taken[:3]))}"
                         " or 'as-is@...'")
    configs = {}
    for name, patch in proposals.items():
        try:
            configs[name] = propose(recorded, patch)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if slo is None:  # goodput by the recorded config's lane SLOs (engine/config/slo.py)
        slo = lane_slos(recorded.live)
    baseline, scaled = PREDICTED, window
    predictions = replays(window, model, {PREDICTED: recorded, **(
        configs if at is None else {})}, progress, workers)
    if at is not None:
        baseline, scaled = at, scale_window(window, rate_scale)
        predictions |= replays(scaled, model, {baseline: recorded, **configs}, progress,
                               workers, replicas)
    summaries = {RECORDED: recorded_summary(window, slo)}
    for name, p in predictions.items():
        at = window if name == PREDICTED else scaled
        summaries[name] = predicted_summary(p, at.duration_s, slo)
    warnings = list(model.warnings) + _self_warnings(summaries)
    warnings += [w for name, p in predictions.items()
                 if (w := _beyond_warning(name, p, model)) is not None]
    if window.facts.running_at_start:
        warnings.append(f"{window.facts.running_at_start} requests were already running when"
                        " the window opened; the replay starts empty, so it under-counts"
                        " the load of the window's first moments")
    return {
        "window": {"since": window.since, "until": window.until, "model": window.model,
                   "device": window.device or None, "run_id": window.facts.run_id,
                   "requests": len(window.requests),
                   "config_version": window.facts.config_version},
        "calibration": model.to_dict(),
        "slo": _slo_dict(slo),
        "configs": {name: {"patch": proposals[name], "diff": diff(recorded.live, c.live)}
                    for name, c in configs.items()},
        "columns": list(summaries),
        "summaries": summaries,
        "baseline": baseline, "rate_scale": rate_scale, "replicas": replicas,
        "rows": ratio_rows(summaries, baseline=baseline),
        "capacity": (sweep(window, model, {AS_IS: recorded, **configs}, rate_sweep, slo,
                           progress, workers, replicas) if rate_sweep else None),
        "replays": {name: {"steps": p.steps, "sim_seconds": p.sim_seconds,
                           "wall_s": p.wall_s, "beyond_seen_steps": p.beyond_seen_steps,
                           "largest_step": p.largest_step}
                    for name, p in predictions.items()},
        "warnings": warnings,
        "notes": list(window.notes) + list(notes or ()),
    }


def at_label(rate_scale: float, replicas: int) -> str | None:
    """The recorded config's column at another rate or replica count: as-is@2x, as-is@3rep,
    as-is@2x,3rep; None at the recorded ones (1x, one replica)."""
    parts = ([f"{rate_scale:g}x"] if rate_scale != 1.0 else []) + (
        [f"{replicas}rep"] if replicas != 1 else [])
    return f"as-is@{','.join(parts)}" if parts else None


def lane_slos(live: LiveConfig) -> LaneSLOs:
    """The config's lanes' SLOs as the summaries' per-lane targets."""
    return {lane.name: SLO(s.ttft_s, s.tpot_s) for lane in live.lanes
            if (s := live.lane_slo(lane)).is_set}


def _slo_dict(slo: SLOs) -> dict[str, Any] | None:
    """The SLO the goodput was counted under: one for all, or {"by_lane": {...}}."""
    if slo is None or isinstance(slo, SLO):
        return dataclasses.asdict(slo) if slo is not None else None
    return {"by_lane": {lane: dataclasses.asdict(s) for lane, s in slo.items()}}
