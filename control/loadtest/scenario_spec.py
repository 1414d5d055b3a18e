"""What a load-test scenario is: the frozen dataclasses a scenario YAML parses to
(control/loadtest/scenario_parse.py) and that `plan()` draws requests from
(control/loadtest/scenario.py, which also documents the YAML shape), with their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from control.loadtest.records import SLO
from engine.sim.workload import AZURE_CONV_TRACE

DEFAULT_CONCURRENCY = 64  # requests in flight when the scenario does not say
AUTO_LANE = "auto"  # a lane weight under this name plans requests that name no lane


@dataclass(frozen=True)
class Dist:
    """A length (tokens) or delay (seconds). lognormal: `mean` is the mean of the values
    themselves (not of their log); min/max clip every draw."""

    dist: str  # fixed | uniform | lognormal | trace (rows of the scenario's trace)
    value: float | None = None
    mean: float | None = None
    sigma: float | None = None
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Arrival:
    process: str  # poisson | gamma | bursts | trace
    rate: float | None = None  # requests/s, mean (poisson, gamma)
    burstiness: float = 1.0  # gamma shape: 1 = poisson, < 1 burstier
    burst_size: int | None = None  # bursts: this many requests at once ...
    every_s: float | None = None  # ... every every_s seconds


@dataclass(frozen=True)
class TraceSource:
    path: Path  # resolved: relative paths are under engine/sim/data
    prompt_scale: float = 1.0  # prompt lengths multiplied by this
    output_scale: float = 1.0  # output lengths multiplied by this
    time_scale: float = 1.0  # arrival times multiplied by this (> 1 is slower)
    limit: int | None = None  # first rows only


@dataclass(frozen=True)
class Cancel:
    ratio: float  # share of requests the client abandons
    after_s: Dist  # seconds after sending


@dataclass(frozen=True)
class Rag:
    ratio: float  # share of requests with a long context before the question
    context: Dist  # context tokens; the prompt dist gives the question
    lane: str | None = None  # None: the lane drawn by weight like any request


@dataclass(frozen=True)
class Scenario:
    name: str
    arrival: Arrival
    prompt: Dist
    output: Dist
    description: str = ""
    seed: int = 0
    requests: int | None = None
    duration_s: float | None = None  # arrivals up to this offset, seconds
    concurrency: int = DEFAULT_CONCURRENCY  # most requests in flight, client-side
    trace: TraceSource | None = None
    tenants: tuple[tuple[str, float], ...] = (("default", 1.0),)  # (name, weight)
    lanes: tuple[tuple[str, float], ...] = ((AUTO_LANE, 1.0),)  # (name, weight)
    stream_ratio: float = 1.0
    ignore_eos: bool = True
    cancel: Cancel | None = None
    rag: Rag | None = None
    slo: SLO = SLO()

TRACE_DIR = AZURE_CONV_TRACE.parent  # engine/sim/data: relative trace paths start here
