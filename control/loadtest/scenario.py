"""Load-test scenarios: a YAML file -> a frozen `Scenario` -> `plan()`, a list of requests.

    scenario = load_scenario("playbooks/scenarios/mixed.yaml")
    planned = plan(with_rate(scenario, 2.0))     # the same lengths, arrivals at 2 requests/s

The YAML shape (every key but `name` and one of `requests` / `duration_s` is optional)::

    name: mixed-burst
    seed: 0
    requests: 200        # and/or duration_s: 60 (with both, whichever ends first)
    concurrency: 32      # most requests in flight; later arrivals wait client-side
    arrival: {process: gamma, rate: 4.0, burstiness: 0.5}
    #  poisson {rate} | gamma {rate, burstiness} | bursts {burst_size, every_s} | trace {}
    prompt: {dist: lognormal, mean: 300, sigma: 0.8, min: 8, max: 2000}
    output: {dist: uniform, min: 16, max: 128}
    #  fixed {value} | uniform {min, max} | lognormal {mean, sigma, min, max} | trace {}
    trace: {path: azure_llm_2023_conv.csv, prompt_scale: 0.1, output_scale: 0.1,
            time_scale: 4.0, limit: 1000}
    tenants: {acme: 3, globex: 1}                 # weights
    lanes: {interactive: 4, batch: 1, auto: 1}    # weights; auto: the server routes
    stream_ratio: 0.8
    ignore_eos: true
    cancel: {ratio: 0.05, after_s: {dist: uniform, min: 0.5, max: 3}}
    rag: {ratio: 0.2, context: {dist: uniform, min: 1500, max: 3000}, lane: long_context}
    slo: {ttft_s: 2.0, tpot_s: 0.2, e2e_s: 30}

Every error is a ValueError naming the field path and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from control.loadtest.records import PlannedRequest
from control.loadtest.scenario_parse import parse_scenario
from control.loadtest.scenario_spec import AUTO_LANE, Arrival, Dist, Scenario
from engine.config.yaml_loader import read_yaml_file
from engine.sim.workload import TraceRequest, TraceScale, load_trace

MAX_PLANNED = 100_000  # a duration_s-only scenario stops here whatever the rate


def load_scenario(path: str | Path) -> Scenario:
    return scenario_from_dict(read_yaml_file(path, "scenario file"), str(Path(path)))


def scenario_from_dict(data: Any, where: str = "scenario") -> Scenario:
    """Validate a mapping of the YAML shape; errors read '<where>: <field>=<value> must ...'."""
    try:
        return parse_scenario(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def with_rate(scenario: Scenario, rate: float) -> Scenario:
    """The scenario at a mean arrival rate of `rate` requests/s; lengths and every other
    draw stay the same, since each has its own random stream. A trace replay keeps its
    arrivals' shape (bursts and gaps), its times scaled so that its mean rate (requests
    after the first over the span of arrivals) is `rate`."""
    arrival = scenario.arrival
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate={rate!r} must be a number > 0 (requests/s)")
    if arrival.process == "trace":
        times = [p.arrival_s for p in plan(scenario)]
        span = times[-1] - times[0] if times else 0.0
        if span <= 0:
            raise ValueError("the trace's requests all arrive at once: it has no rate to"
                             " set; change how many it replays (requests)")
        return scale_rate(scenario, rate / ((len(times) - 1) / span))
    if arrival.process == "bursts":
        assert arrival.burst_size is not None
        arrival = dataclasses.replace(arrival, every_s=arrival.burst_size / rate)
    else:
        arrival = dataclasses.replace(arrival, rate=float(rate))
    return dataclasses.replace(scenario, arrival=arrival)


def scale_rate(scenario: Scenario, factor: float) -> Scenario:
    """Arrivals `factor` times as frequent (a trace replay: its times divided by factor)."""
    if not (isinstance(factor, (int, float)) and factor > 0):
        raise ValueError(f"factor={factor!r} must be a number > 0")
    arrival, trace = scenario.arrival, scenario.trace
    if arrival.process == "trace":
        assert trace is not None
        trace = dataclasses.replace(trace, time_scale=trace.time_scale / factor)
        return dataclasses.replace(scenario, trace=trace)
    if arrival.process == "bursts":
        assert arrival.every_s is not None
        return dataclasses.replace(
            scenario, arrival=dataclasses.replace(arrival, every_s=arrival.every_s / factor))
    assert arrival.rate is not None
    return with_rate(scenario, arrival.rate * factor)


def plan(scenario: Scenario) -> list[PlannedRequest]:
    """The requests to send, in arrival order; the same for the same scenario and seed.
    Each kind of draw (arrivals, prompt, output, tenant, ...) has its own random stream, so
    changing the rate or a ratio leaves the other draws as they were."""
    s = scenario
    rows = _trace_rows(s)
    streams = {name: random.Random(f"{s.seed}:{name}") for name in (
        "arrival", "prompt", "output", "tenant", "lane", "stream", "cancel", "rag")}
    arrivals = iter_arrivals(s.arrival, streams["arrival"], rows)
    tenants, tenant_weights = zip(*s.tenants, strict=True)
    lanes, lane_weights = zip(*s.lanes, strict=True)
    limit = s.requests if s.requests is not None else MAX_PLANNED
    planned: list[PlannedRequest] = []
    for index in range(limit):
        arrival_s = next(arrivals, None)
        if arrival_s is None or (s.duration_s is not None and arrival_s > s.duration_s):
            break  # a trace replay ends with its rows
        row = rows[index % len(rows)] if rows else None
        prompt = sample_tokens(s.prompt, streams["prompt"], row and row.prompt_tokens)
        output = sample_tokens(s.output, streams["output"], row and row.output_tokens)
        lane = streams["lane"].choices(lanes, lane_weights)[0]
        kind = "chat"
        if s.rag is not None and streams["rag"].random() < s.rag.ratio:
            prompt += sample_tokens(s.rag.context, streams["rag"], None)
            kind, lane = "rag", s.rag.lane or lane
        cancel_after_s = None
        if s.cancel is not None and streams["cancel"].random() < s.cancel.ratio:
            cancel_after_s = sample(s.cancel.after_s, streams["cancel"])
        planned.append(PlannedRequest(
            index=index, arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output,
            tenant=streams["tenant"].choices(tenants, tenant_weights)[0],
            lane=None if lane == AUTO_LANE else lane,
            stream=streams["stream"].random() < s.stream_ratio,
            cancel_after_s=cancel_after_s, kind=kind, ignore_eos=s.ignore_eos,
        ))
    return planned


def iter_arrivals(arrival: Arrival, rng: random.Random, rows: list[TraceRequest],
                  ) -> Iterator[float]:
    """Arrival offsets in seconds from the start of the run; the first is 0 (a trace: its
    own first time, 0)."""
    if arrival.process == "trace":
        yield from (row.arrival_s for row in rows)
        return
    if arrival.process == "bursts":
        assert arrival.burst_size is not None and arrival.every_s is not None
        for burst in range(MAX_PLANNED):
            yield from [burst * arrival.every_s] * arrival.burst_size
        return
    assert arrival.rate is not None
    shape = arrival.burstiness if arrival.process == "gamma" else 1.0
    scale = 1.0 / (arrival.rate * shape)  # seconds: mean gap shape * scale = 1 / rate
    now = 0.0
    while True:
        yield now
        now += rng.gammavariate(shape, scale)


def sample(dist: Dist, rng: random.Random) -> float:
    """One draw of a fixed, uniform or lognormal dist, clipped to [min, max]."""
    if dist.dist == "fixed":
        assert dist.value is not None
        return float(dist.value)
    if dist.dist == "uniform":
        assert dist.min is not None and dist.max is not None
        return rng.uniform(dist.min, dist.max)
    assert dist.dist == "lognormal" and dist.mean is not None and dist.sigma is not None
    mu = math.log(dist.mean) - dist.sigma**2 / 2  # so that E[value] = mean
    value = rng.lognormvariate(mu, dist.sigma)
    low = dist.min if dist.min is not None else -math.inf
    high = dist.max if dist.max is not None else math.inf
    return min(max(value, low), high)


def sample_tokens(dist: Dist, rng: random.Random, trace_tokens: int | None) -> int:
    """A token count, at least 1; `trace` dists take the row's (already scaled) count."""
    if dist.dist == "trace":
        assert trace_tokens is not None
        return max(1, trace_tokens)
    if dist.dist == "uniform":  # whole numbers, both bounds included
        assert dist.min is not None and dist.max is not None
        return max(1, rng.randint(math.ceil(dist.min), math.floor(dist.max)))
    return max(1, round(sample(dist, rng)))


def _trace_rows(scenario: Scenario) -> list[TraceRequest]:
    """The trace rows the scenario uses ([] when it uses none), scaled as configured."""
    s, trace = scenario, scenario.trace
    uses = s.arrival.process == "trace" or "trace" in (s.prompt.dist, s.output.dist)
    if trace is None or not uses:
        return []
    limit = trace.limit if s.requests is None else min(trace.limit or s.requests, s.requests)
    scale = TraceScale(prompt_div=1 / trace.prompt_scale, output_div=1 / trace.output_scale,
                       time_div=1 / trace.time_scale, min_tokens=1)
    rows = load_trace(trace.path, limit=limit, scale=scale)
    if not rows:
        raise ValueError(f"trace.path={str(trace.path)!r} has no rows")
    return rows
