"""Parsing of load-test scenario YAML (see control/loadtest/scenario.py for the shape):
every error is a ValueError naming the field path and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control.loadtest.records import SLO
from control.loadtest.scenario_spec import (
    DEFAULT_CONCURRENCY,
    TRACE_DIR,
    Arrival,
    Cancel,
    Dist,
    Rag,
    Scenario,
    TraceSource,
)
from engine.config.known_keys import check_known_keys

TOP_KEYS = {"name", "description", "seed", "requests", "duration_s", "concurrency", "arrival",
            "prompt", "output", "trace", "tenants", "lanes", "stream_ratio", "ignore_eos",
            "cancel", "rag", "slo"}
ARRIVAL_KEYS = {"poisson": {"rate"}, "gamma": {"rate", "burstiness"},
                "bursts": {"burst_size", "every_s"}, "trace": set()}
DIST_KEYS = {"fixed": {"value"}, "uniform": {"min", "max"},
             "lognormal": {"mean", "sigma", "min", "max"}, "trace": set()}
_KIND_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def parse_scenario(data: Any) -> Scenario:
    top = _mapping(data, "scenario")
    check_known_keys("scenario", top, TOP_KEYS)
    requests = _get(top, "requests", int, gt=0)
    duration_s = _get(top, "duration_s", float, gt=0, unit="seconds")
    if requests is None and duration_s is None:
        raise ValueError("missing 'requests' (how many) or 'duration_s' (seconds of "
                         "arrivals): a scenario needs one of them, or both")
    trace = _parse_trace(top["trace"]) if top.get("trace") is not None else None
    arrival = _parse_arrival(top.get("arrival"))
    prompt = _parse_dist(top.get("prompt"), "prompt", set(DIST_KEYS))
    output = _parse_dist(top.get("output"), "output", set(DIST_KEYS))
    uses_trace = [field for field, kind in (("arrival.process", arrival.process),
                  ("prompt.dist", prompt.dist), ("output.dist", output.dist)) if kind == "trace"]
    if uses_trace and trace is None:
        raise ValueError(f"{uses_trace[0]}='trace' needs a 'trace:' block "
                         "(path, prompt_scale, output_scale, time_scale, limit)")
    return Scenario(
        name=_get(top, "name", str, required=True), arrival=arrival, prompt=prompt,
        output=output, description=_get(top, "description", str, "").strip(),
        seed=_get(top, "seed", int, 0), requests=requests, duration_s=duration_s,
        concurrency=_get(top, "concurrency", int, DEFAULT_CONCURRENCY, gt=0), trace=trace,
        tenants=_parse_weights(top.get("tenants"), "tenants") or Scenario.tenants,
        lanes=_parse_weights(top.get("lanes"), "lanes") or Scenario.lanes,
        stream_ratio=_get(top, "stream_ratio", float, 1.0, ge=0, le=1),
        ignore_eos=_get(top, "ignore_eos", bool, True),
        cancel=_parse_cancel(top.get("cancel")), rag=_parse_rag(top.get("rag")),
        slo=_parse_slo(top.get("slo")),
    )


def _parse_arrival(block: Any) -> Arrival:
    block = _mapping(block, "arrival", required=True)
    process = block.get("process")
    if process not in ARRIVAL_KEYS:
        raise ValueError(f"arrival.process={process!r} must be one of {sorted(ARRIVAL_KEYS)}")
    check_known_keys("arrival", block, ARRIVAL_KEYS[process] | {"process"})
    if process in ("poisson", "gamma"):
        return Arrival(process, rate=_get(block, "rate", float, where="arrival", gt=0,
                                          required=True, unit="requests/s"),
                       burstiness=_get(block, "burstiness", float, 1.0, where="arrival", gt=0))
    if process == "bursts":
        return Arrival(process,
                       burst_size=_get(block, "burst_size", int, where="arrival", gt=0,
                                       required=True, unit="requests"),
                       every_s=_get(block, "every_s", float, where="arrival", gt=0,
                                    required=True, unit="seconds"))
    return Arrival(process)


def _parse_dist(block: Any, where: str, kinds: set[str]) -> Dist:
    block = _mapping(block, where, required=True)
    kind = block.get("dist")
    if kind not in kinds:
        raise ValueError(f"{where}.dist={kind!r} must be one of {sorted(kinds)}")
    check_known_keys(where, block, DIST_KEYS[kind] | {"dist"})
    needed = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "sigma")}
    values = {key: _get(block, key, float, where=where, ge=0,
                        required=key in needed.get(kind, ()))
              for key in DIST_KEYS[kind]}
    dist = Dist(kind, **values)
    if dist.min is not None and dist.max is not None and dist.min > dist.max:
        raise ValueError(f"{where}.min={dist.min:g} must be <= {where}.max={dist.max:g}")
    if kind == "lognormal" and not dist.mean:
        raise ValueError(f"{where}.mean=0 must be > 0")
    return dist


def _parse_trace(block: Any) -> TraceSource:
    block = _mapping(block, "trace")
    keys = {"path", "prompt_scale", "output_scale", "time_scale", "limit"}
    check_known_keys("trace", block, keys)
    given = Path(_get(block, "path", str, "azure_llm_2023_conv.csv", where="trace"))
    path = given if given.is_absolute() else TRACE_DIR / given
    if not path.is_file():
        raise ValueError(f"trace.path={str(given)!r}: no such file {str(path)!r} (a relative "
                         f"path is under {str(TRACE_DIR)!r})")
    scales = {key: _get(block, key, float, 1.0, where="trace", gt=0) for key in keys
              if key.endswith("_scale")}
    return TraceSource(path=path, limit=_get(block, "limit", int, where="trace", gt=0), **scales)


def _parse_weights(block: Any, where: str) -> tuple[tuple[str, float], ...]:
    """{name: weight} -> ((name, weight), ...); at least one weight > 0."""
    block = _mapping(block, where)
    weights = tuple((str(name), _get(block, name, float, where=where, ge=0, required=True))
                    for name in block)
    if block and not any(weight for _, weight in weights):
        raise ValueError(f"{where}: at least one weight must be > 0")
    return weights


def _parse_cancel(block: Any) -> Cancel | None:
    if block is None:
        return None
    block = _mapping(block, "cancel")
    check_known_keys("cancel", block, {"ratio", "after_s"})
    return Cancel(ratio=_get(block, "ratio", float, where="cancel", ge=0, le=1, required=True),
                  after_s=_parse_dist(block.get("after_s"), "cancel.after_s",
                                      {"fixed", "uniform", "lognormal"}))


def _parse_rag(block: Any) -> Rag | None:
    if block is None:
        return None
    block = _mapping(block, "rag")
    check_known_keys("rag", block, {"ratio", "context", "lane"})
    lane = _get(block, "lane", str, where="rag")
    return Rag(ratio=_get(block, "ratio", float, where="rag", ge=0, le=1, required=True),
               context=_parse_dist(block.get("context"), "rag.context",
                                   {"fixed", "uniform", "lognormal"}),
               lane=lane)


def _parse_slo(block: Any) -> SLO:
    block = _mapping(block, "slo")
    check_known_keys("slo", block, {"ttft_s", "tpot_s", "e2e_s"})
    return SLO(**{key: _get(block, key, float, where="slo", gt=0, unit="seconds")
                  for key in block})


def _mapping(block: Any, where: str, required: bool = False) -> dict[str, Any]:
    if block is None:
        if required:
            raise ValueError(f"missing '{where}': must be a mapping")
        return {}
    if not isinstance(block, dict):
        raise ValueError(f"'{where}' must be a mapping, got {block!r}")
    return block


def _get(block: dict[str, Any], key: str, kind: type, default: Any = None, *, where: str = "",
         required: bool = False, gt: float | None = None, ge: float | None = None,
         le: float | None = None, unit: str = "") -> Any:
    """block[key] checked for type and range; errors name `where.key` and what is allowed."""
    name = f"{where}.{key}" if where else key
    value = block.get(key)
    if value is None:
        if required:
            raise ValueError(f"missing {name}: must be {_KIND_WORDS[kind]}")
        return default
    given = value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name}={given!r} must be {_KIND_WORDS[kind]}")
    unit = f" ({unit})" if unit else ""
    for ok, rule in ((gt is None or value > gt, f"> {gt}"), (ge is None or value >= ge,
                     f">= {ge}"), (le is None or value <= le, f"<= {le}")):
        if not ok:
            raise ValueError(f"{name}={given!r} must be {rule}{unit}")
    return value
