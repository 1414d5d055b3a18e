"""Capacity planning from the trace: the recorded requests arriving faster or slower.

    faster = scale_window(window, 2.0)        # twice the rate: the same requests, the
                                              # arrivals' gaps halved
    table = sweep(window, model, {"as-is": recorded}, (1, 1.5, 2, 3), slo)

A request keeps its lengths, lane, tenant and priority; only its arrival moves (to
`since + (arrival - since) / k`), and what was relative to its arrival stays so: a
client's cancel after 2 s still comes 2 s after it arrived, a deadline 5 s after it is
still 5 s. So "what happens if traffic doubles" is the same traffic, twice as dense, with
the same clients. The sweep replays each config at each rate and reads, per rate, the
offered rate, goodput, the share of offered requests that met their SLO, outcomes and
p99 latencies; a config's capacity is the highest swept rate up to which, at every swept
rate, at least CAPACITY_MET_SHARE of the offered requests met their SLO.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from control.whatif.calibrate import StepTimeModel
from control.whatif.fleet_replay import MAX_REPLICAS
from control.whatif.replay import Prediction
from control.whatif.replay_many import replays
from control.whatif.summary import SLOs, predicted_summary
from control.whatif.window import Window
from engine.config import EngineConfig

MAX_RATE_SCALE = 100.0
MAX_SWEEP_RATES = 8  # each is a replay of every config
CAPACITY_MET_SHARE = 0.95


def check_rate(value: Any, name: str) -> float:
    """A rate scale as given by a client: a finite number in (0, MAX_RATE_SCALE]."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not 0 < value <= MAX_RATE_SCALE):
        raise ValueError(f"{name}={value!r} must be a number in (0, {MAX_RATE_SCALE:g}]: the"
                         " recorded arrival rate times this")
    return float(value)


def check_replicas(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{name}={value!r} must be a whole number of replicas in"
                         f" 1..{MAX_REPLICAS}")
    return value


def check_sweep(values: Any, name: str) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)) or not 1 <= len(values) <= MAX_SWEEP_RATES:
        raise ValueError(f"{name} must be a list of 1 to {MAX_SWEEP_RATES} rate scales")
    rates = tuple(check_rate(v, f"{name}[{i}]") for i, v in enumerate(values))
    if len(set(rates)) != len(rates):
        raise ValueError(f"{name} names a rate scale twice: {list(rates)}")
    return tuple(sorted(rates))


def parse_sweep(text: str, name: str) -> tuple[float, ...]:
    """A sweep as a person types it ("0.5, 1,2"): check_sweep's rates, or ValueError."""
    try:
        values = [float(v) for v in text.replace(" ", "").split(",")]
    except ValueError:
        raise ValueError(f"{name} {text!r} must be comma-separated numbers, e.g. 0.5,1,2,4"
                         ) from None
    return check_sweep(values, name)


def scale_window(window: Window, k: float) -> Window:
    """The window's requests at `k` times their recorded arrival rate (module docstring)."""
    if k == 1.0:
        return window
    since = window.since

    def moved(r):
        arrival = since + (r.arrival_time - since) / k
        return dataclasses.replace(
            r, arrival_time=arrival,
            finished_time=(None if r.finished_time is None
                           else arrival + (r.finished_time - r.arrival_time)),
            deadline=None if r.deadline is None else arrival + (r.deadline - r.arrival_time))

    return dataclasses.replace(window, requests=[moved(r) for r in window.requests],
                               until=since + (window.until - since) / k)


def capacity_row(k: float, window: Window, p: Prediction, slo: SLOs) -> dict[str, Any]:
    """One config at one rate: what a capacity table shows."""
    s = predicted_summary(p, window.duration_s, slo)
    met = None if s["goodput_rps"] is None else s["goodput_rps"] * window.duration_s
    return {"rate_scale": k, "offered_rps": s["requests"] / window.duration_s,
            "goodput_rps": s["goodput_rps"],
            "met_share_of_offered": None if met is None or not s["requests"]
            else met / s["requests"],
            **{o: s[o] for o in ("requests", "finished", "rejected", "timeout")},
            "ttft_p99_s": s["ttft"]["p99"], "e2e_p99_s": s["e2e"]["p99"]}


def sweep(window: Window, model: StepTimeModel, configs: dict[str, EngineConfig],
          rates: Sequence[float], slo: SLOs, progress: bool = False, workers: int = 1,
          replicas: int = 1) -> dict[str, Any]:
    """Every config replayed at every rate: {"rates", "configs": {name: [row per rate]},
    "capacity": {name: highest rate meeting CAPACITY_MET_SHARE, or None}}."""
    table: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for k in rates:
        scaled = scale_window(window, k)
        for name, p in replays(scaled, model, configs, progress, workers, replicas).items():
            table[name].append(capacity_row(k, scaled, p, slo))
    capacity: dict[str, float | None] = {}
    for name, rows in table.items():  # the highest rate up to which every rate meets it
        capacity[name] = None
        for r in rows:
            share = r["met_share_of_offered"]
            if share is None or share < CAPACITY_MET_SHARE:
                break
            capacity[name] = r["rate_scale"]
    return {"rates": list(rates), "met_share_for_capacity": CAPACITY_MET_SHARE,
            "configs": table, "capacity": capacity}
