"""Step sizing for goodput: the Azure conversation replay at loads relative to the measured
capacity, under each way of sizing steps, on the simulated engine with CPU-like step costs.

    python -m bench.goodput_policy [--requests 200] [--seeds 3] [--loads 0.7,1.0,1.5]
                                   [--client-retries 0,2]
    python -m bench.goodput_policy --smoke          # CI: 40 requests, one seed, checks sanity

Sides (each on the same arrivals, prompts and seed):
  a_fitted    budgets fitted at start-up, no per-step law (as 865306f ran)
  b_law       today's step law: every step held to target_step_ms (step_policy fixed)
  c_goodput   the goodput policy (step_policy goodput, slo_unreachable shed; the default)
  c_defer     the goodput policy, deferring what would miss its TTFT (slo_unreachable defer)
  c_noshed    the goodput policy's step sizes alone (slo_unreachable serve)
  fixed_N     fixed budgets, no law: max_num_batched_tokens N, a chunk of 2/3 of it
The step costs are engine/sim/step_cost.py's CpuLikeStepCost (SmolLM2-135M on this CPU's two
threads: fixed cost, tokens, attention quadratic in a prompt, decode attention per context
token, 5% noise); the law is fitted by the start-up probe over those costs, as a server fits
it over its model. Time is simulated, so each figure is exact for its seed: the spread
is over seeds (arrival noise and step noise), not over a noisy machine.

Capacity: the replay's requests all arriving at once, under a_fitted, finished per second.
A load of x spaces the trace's arrivals so they come at x times that rate. Lanes and SLOs
are the defaults (interactive: TTFT 5 s, TPOT 0.5 s; prompts of 4,096+ tokens go to
long_context: 30 s, 1 s); the mixed scenario sends every third request to the batch lane
(no SLO) with 4x its output. Goodput: requests that met their lane's SLO per second of the
offered arrivals' span (the same window for every side).

Clients (`--client-retries`, each side run once per value): 0, a refusal is final; 2, the
OpenAI SDK's default (control/loadtest/retries.py): a 429 or 503 is sent again after its
Retry-After, twice at most. A resent request's TTFT counts from its first send, so a
request served on its second try meets its SLO only if it still did so from the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics

from tqdm import tqdm

from control.api.errors import rejection_error
from control.loadtest.retries import SDK_DEFAULT_RETRIES, ClientRetries
from engine.calibration.budget_fit import fit_step_budgets
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.sim.executor import FakeClock, SimulatedExecutor
from engine.sim.simulate import simulate
from engine.sim.step_cost import CostProber, CpuLikeStepCost
from engine.sim.workload import TraceRequest, TraceScale, load_trace

STATIC = StaticConfig(num_kv_blocks=4096, max_model_len=8192, target_step_ms=250)
FIXED_BUDGETS = (256, 512, 1024, 2048)
GOALS = ("c >= best other on goodput at every load; at 1.5x c finishes >= 95% of the best"
         " (each with the same clients)")


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    config: EngineConfig
    law: object | None  # StepLaw


def sides(seed: int) -> list[Side]:
    """Every side's config; the law fitted by the start-up probe over the step cost."""
    fitted, fit = fit_step_budgets(EngineConfig(STATIC, LiveConfig()), set(),
                                   CostProber(CpuLikeStepCost(seed=seed)))
    out = [Side("a_fitted", fitted, None),
           Side("b_law", _live(fitted, step_policy="fixed"), fit.law),
           Side("c_goodput", _live(fitted, step_policy="goodput"), fit.law),
           Side("c_defer", _live(fitted, step_policy="goodput", slo_unreachable="defer"),
                fit.law),
           Side("c_noshed", _live(fitted, step_policy="goodput", slo_unreachable="serve"),
                fit.law)]
    for n in FIXED_BUDGETS:
        chunk = 1 << int(math.log2(n * 2 / 3))
        out.append(Side(f"fixed_{n}", _live(fitted, max_num_batched_tokens=n,
                                            prefill_chunk_size=chunk), None))
    return out


def _live(config: EngineConfig, **changes) -> EngineConfig:
    return EngineConfig(config.static, config.live.replace(**changes))


def client_retry(retries: int, seed: int):
    """simulate()'s `retry`: what a client with `retries` does with each refusal, as the
    server answers it (its status and Retry-After: control/api/errors.py)."""
    policy, rng = ClientRetries(retries), random.Random(seed)

    def retry(decision, sends: int) -> float | None:
        answer = rejection_error(decision, {})
        return policy.delay_s(answer.status, answer.headers.get("Retry-After"), sends, rng)
    return retry


def run(side: Side, trace: list[TraceRequest], seed: int, mixed: bool,
        retries: int = 0) -> dict:
    clock = FakeClock()
    executor = SimulatedExecutor(clock=clock, cost_model=CpuLikeStepCost(seed=seed),
                                 shadow_kv=False)
    engine = Engine(side.config, executor, clock=clock, step_law=side.law)
    steps: list[tuple[float, float | None]] = []
    route = (lambda i, _: {"lane": "batch"} if i % 3 == 2 else {}) if mixed else None
    result = simulate(engine, clock, trace, route=route, seed=seed, on_step=lambda out: (
        steps.append((out.record.end_time - out.record.start_time, out.record.target_step_s))
        if out.record is not None and out.record.tokens_used else None),
        retry=client_retry(retries, seed) if retries else None)
    return {"clients": retries, **summarize(side, trace, result, steps)}


def summarize(side: Side, trace: list[TraceRequest], result,
              steps: list[tuple[float, float | None]]) -> dict:
    live = side.config.live
    records = result.records
    finished = [r for r in records if r.outcome == "finished"]
    ttft = {r.request_id: _user_ttft_s(r, result.first_arrival) for r in finished}
    met = [r for r in finished
           if live.lane_slo(live.lane(r.lane)).met(ttft[r.request_id], r.tpot_s)]
    # the same window for every side: the offered arrivals' span, first sends (shedding
    # ends a run sooner, which must not count as goodput)
    span = trace[-1].arrival_s - trace[0].arrival_s
    base_s = STATIC.target_step_ms / 1000
    over = [d / base_s for d, _ in steps]
    grown = sum(1 for _, target in steps if target is not None and target > base_s + 1e-9)
    return {"side": side.name, "requests": len(trace),
            "goodput_rps": len(met) / span if span > 0 else 0.0,
            "met": len(met), "finished": len(finished),
            "shed": sum(d.reason == "slo_unreachable" for d in result.rejected),
            "timeouts": sum(r.outcome == "timeout" for r in records),
            "resent": len(result.retried),
            "ttft_p99_s": _p99(list(ttft.values())),
            "tpot_p99_s": _p99([r.tpot_s for r in finished if r.tpot_s is not None]),
            "step_p99_over_target": _p99(over), "steps": len(steps), "grown_steps": grown,
            "span_s": span, "makespan_s": _makespan(records)}


def _user_ttft_s(record, first_arrival: dict[str, float]) -> float | None:
    """TTFT from the request's first send (its user's wait), resends included."""
    if record.ttft_s is None:
        return None
    return record.ttft_s + record.arrival_time - first_arrival.get(record.request_id,
                                                                   record.arrival_time)


def _makespan(records) -> float:
    ends = [r.finished_time for r in records if r.finished_time is not None]
    return max(ends) - min(r.arrival_time for r in records) if ends else 0.0


def _p99(values: list[float]) -> float:
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)] if values else 0.0


def capacity_rps(trace: list[TraceRequest], seed: int) -> float:
    """Requests per second a_fitted finishes with every request arriving at once."""
    burst = [dataclasses.replace(t, arrival_s=0.0) for t in trace]
    side = sides(seed)[0]
    side = Side(side.name, _live(side.config, queue_timeout_ms=10_000_000,
                                 max_waiting_requests=len(trace) + 1), None)
    result = run(side, burst, seed, mixed=False)
    return result["finished"] / result["makespan_s"]


def at_load(trace: list[TraceRequest], load: float, capacity: float) -> list[TraceRequest]:
    """The trace's arrivals spaced to come at `load` x `capacity` requests per second."""
    rate = (len(trace) - 1) / (trace[-1].arrival_s - trace[0].arrival_s)
    k = rate / (load * capacity)  # new gaps = old gaps x k
    return [dataclasses.replace(t, arrival_s=(t.arrival_s - trace[0].arrival_s) * k)
            for t in trace]


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per (scenario, load, clients, side, seed)."""
    base = load_trace(limit=args.requests, scale=TraceScale(output_div=args.output_div))
    scenarios = [("replay", False)] + ([("mixed", True)] if args.mixed else [])
    rows = []
    total = (args.seeds * len(args.loads) * len(scenarios) * len(sides(0))
             * len(args.client_retries))
    bar = tqdm(total=total, desc="simulating", unit="run", disable=args.json)
    for seed in range(args.seeds):
        capacity = capacity_rps(base, seed)
        for scenario, mixed in scenarios:
            for load in args.loads:
                trace = at_load(base, load, capacity)
                for retries in args.client_retries:
                    for side in sides(seed):
                        row = run(side, trace, seed, mixed, retries)
                        rows.append({"scenario": scenario, "load": load, "seed": seed,
                                     "capacity_rps": capacity, **row})
                        bar.update(1)
    bar.close()
    return rows


def verdicts(rows: list[dict]) -> list[dict]:
    """Per scenario, load and clients, medians over seeds, and the goals' ratios."""
    out = []
    keys = sorted({(r["scenario"], r["load"], r["clients"]) for r in rows})
    for scenario, load, clients in keys:
        group = [r for r in rows
                 if (r["scenario"], r["load"], r["clients"]) == (scenario, load, clients)]
        by_side: dict[str, list[dict]] = {}
        for r in group:
            by_side.setdefault(r["side"], []).append(r)
        med = {name: {k: statistics.median(r[k] for r in rs) for k in (
            "goodput_rps", "finished", "met", "shed", "timeouts", "resent", "ttft_p99_s",
            "tpot_p99_s", "step_p99_over_target")} for name, rs in by_side.items()}
        others = [m for name, m in med.items() if not name.startswith("c_")]
        c = med["c_goodput"]
        out.append({"scenario": scenario, "load": load, "clients": clients, "sides": med,
                    "goodput_c_over_best_other": c["goodput_rps"] / max(
                        max(m["goodput_rps"] for m in others), 1e-9),
                    "finished_c_over_best": c["finished"] / max(
                        max(m["finished"] for m in med.values()), 1)})
    return out


def print_table(summary: list[dict]) -> None:
    cols = ("goodput_rps", "met", "finished", "shed", "timeouts", "resent", "ttft_p99_s",
            "tpot_p99_s", "step_p99_over_target")
    for v in summary:
        clients = f"clients resending {v['clients']}x" if v["clients"] else \
            "refusals final"
        print(f"\n{v['scenario']} at {v['load']:g}x capacity, {clients} (medians over seeds)")
        print(f"{'side':<11} " + " ".join(f"{c:>12}" for c in cols))
        for name, m in v["sides"].items():
            print(f"{name:<11} " + " ".join(f"{m[c]:>12.3g}" for c in cols))
        print(f"goodput c / best other {v['goodput_c_over_best_other']:.3f};"
              f" finished c / best {v['finished_c_over_best']:.3f}")


def check_sane(rows: list[dict]) -> None:
    """What the smoke run asserts: every side ran at every load, figures finite, >= 0."""
    names = {s.name for s in sides(0)}
    def key_of(r: dict) -> tuple:
        return r["scenario"], r["load"], r["seed"], r["clients"]

    for key in {key_of(r) for r in rows}:
        present = {r["side"] for r in rows if key_of(r) == key}
        assert present == names, f"{key}: sides {sorted(present)}, expected {sorted(names)}"
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                assert math.isfinite(v) and v >= 0, f"{r['side']}: {k}={v}"
        # each offered request ends once, however many times it was sent
        assert r["finished"] + r["shed"] + r["timeouts"] <= r["requests"], r
        assert r["clients"] or not r["resent"], f"{r['side']}: resent with no retries"
        assert r["met"] <= r["finished"] and r["capacity_rps"] > 0 and r["steps"] > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--loads", default="0.7,1.0,1.5")
    parser.add_argument("--output-div", type=float, default=4.0,
                        help="the trace's output lengths divided by this (default 4)")
    parser.add_argument("--client-retries", default=f"0,{SDK_DEFAULT_RETRIES}",
                        help="comma-separated: how many times clients resend a refused"
                        f" request (0: never; {SDK_DEFAULT_RETRIES}: the OpenAI SDK's"
                        " default); each side runs once per value")
    parser.add_argument("--no-mixed", dest="mixed", action="store_false")
    parser.add_argument("--smoke", action="store_true", help="40 requests, one seed, CI")
    parser.add_argument("--json", action="store_true", help="the JSON line only, no table")
    args = parser.parse_args()
    args.loads = [float(x) for x in args.loads.split(",")]
    args.client_retries = [int(x) for x in args.client_retries.split(",")]
    if args.smoke:
        args.requests, args.seeds, args.loads = 40, 1, [1.0, 1.5]
    rows = measure(args)
    check_sane(rows)
    summary = verdicts(rows)
    if not args.json:
        print_table(summary)
        print(f"\ngoals: {GOALS}")
    print(json.dumps({"bench": "goodput_policy", "smoke": args.smoke, "goals": GOALS,
                      "summary": summary, "rows": rows}))


if __name__ == "__main__":
    main()
