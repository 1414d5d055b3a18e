"""Checks on stored load-test results (`batchpilot loadtest`, tables loadtest_runs and
loadtest_requests): a load test was run, with real length distributions, within the
latency SLO, the server's own latencies agree with what its clients measured, and long
prompts did not stall the decodes of streaming requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.checklist.evidence import Evidence
from control.checklist.registry import fmt, register
from control.checklist.result import Verdict, failed, needs, passed


def no_results(ev: Evidence) -> Verdict:
    """No load-test result: a fail where results could be read, else needs-evidence."""
    if ev.loadtest_from:
        return failed(f"no load-test results stored in {ev.loadtest_from}: run `batchpilot"
                      " loadtest --scenario playbooks/scenarios/mixed.yaml --url URL`")
    return needs(ev.missing.get("loadtest", "no load-test results were read"))


def run_name(row: dict[str, Any]) -> str:
    label = f", config {row['label']}" if row.get("label") else ""
    return f"run {row['run_id']} (scenario {row.get('scenario') or '?'}{label})"


def _scenarios(ev: Evidence) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["run_id"], r["label"]): r for r in ev.loadtest_runs}


@register("loadtest_present", min_requests=20)
def loadtest_present(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if not ev.loadtest_runs:
        return no_results(ev)
    latest = ev.loadtest_runs[0]
    big = [r for r in ev.loadtest_runs if r["requests"] >= p["min_requests"] and r["ok"]]
    if not big:
        return failed(f"no run with >= {p['min_requests']} requests and some ok: latest"
                      f" {run_name(latest)} sent {latest['requests']}, ok {latest['ok']}",
                      runs=len(ev.loadtest_runs))
    r = big[0]
    return passed(f"{len(ev.loadtest_runs)} result(s) stored; latest sized one:"
                  f" {run_name(r)}: {r['requests']} requests, {r['ok']} ok",
                  run_id=r["run_id"], label=r["label"])


def _cv(mean: float | None, std: float | None) -> float | None:
    return None if mean is None or std is None or mean <= 0 else std / mean


def _spread(row: dict[str, Any], kind: str) -> str:
    lo, hi = row[f"{kind}_min"], row[f"{kind}_max"]
    cv = _cv(row[f"{kind}_mean"], row[f"{kind}_std"])
    if lo is None:
        return f"{kind} tokens not counted"
    span = f"all {lo}" if lo == hi else f"{lo}..{hi}, mean {row[f'{kind}_mean']:.0f}"
    return f"{kind} tokens {span}, CV {fmt(cv)}"


@register("real_length_distributions", min_prompt_cv=0.25, min_output_cv=0.1,
          min_requests=20)
def real_length_distributions(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if not ev.loadtest_stats:
        return no_results(ev)
    runs = _scenarios(ev)
    sized = [s for s in ev.loadtest_stats if s["requests"] >= p["min_requests"]]
    if not sized:
        return failed(f"no run with >= {p['min_requests']} requests to judge lengths from",
                      runs=len(ev.loadtest_stats))
    for s in sized:
        prompt_cv = _cv(s["prompt_mean"], s["prompt_std"])
        output_cv = _cv(s["output_mean"], s["output_std"])
        if (prompt_cv or 0) >= p["min_prompt_cv"] and (output_cv or 0) >= p["min_output_cv"]:
            name = run_name(runs.get((s["run_id"], s["label"]), s))
            return passed(f"{name}: {_spread(s, 'prompt')}; {_spread(s, 'output')}",
                          run_id=s["run_id"], prompt_cv=prompt_cv, output_cv=output_cv)
    shown = "; ".join(f"{run_name(runs.get((s['run_id'], s['label']), s))}: "
                      f"{_spread(s, 'prompt')}, {_spread(s, 'output')}" for s in sized[:3])
    return failed(f"no run with prompt CV >= {p['min_prompt_cv']:g} and output CV >="
                  f" {p['min_output_cv']:g} (fixed lengths hide what real traffic does): "
                  f"{shown}", runs=len(sized))


@dataclass(frozen=True)
class Judged:
    """One set of latencies judged by latency_under_slo: a run's, or one lane's of it."""

    name: str  # the run (and lane), for a failure
    short: str  # "" or "LANE ", before each figure that passed
    summary: dict[str, Any]  # a Summary as stored: ttft/tpot/e2e -> {p95: ..}
    targets: dict[str, float]  # metric -> seconds


TARGETS = ("lanes", "fixed")  # latency_under_slo: each lane's own SLO, or the params'
METRICS = ("ttft", "tpot", "e2e")


@register("latency_under_slo", targets="lanes", ttft_s=None, tpot_s=None, e2e_s=None,
          percentiles=[95, 99], label=None, min_requests=20, choices={"targets": TARGETS},
          nullable={"ttft_s": float, "tpot_s": float, "e2e_s": float, "label": str})
def latency_under_slo(ev: Evidence, p: dict[str, Any]) -> Verdict:
    """targets lanes: each lane the server ran requests in, against the SLO it reported for
    that lane, whatever the scenario's (a number in ttft_s / tpot_s / e2e_s overrides it
    for every lane); fixed: the run's percentiles against ttft_s / tpot_s / e2e_s (null:
    not judged)."""
    if not ev.loadtest_runs:
        return no_results(ev)
    rows = [r for r in ev.loadtest_runs if r["requests"] >= p["min_requests"]
            and (p["label"] is None or r["label"] == p["label"])]
    if not rows:
        return needs(f"no stored run with >= {p['min_requests']} requests"
                     + (f" and config {p['label']!r}" if p["label"] else ""))
    latest = [r for r in rows if r["run_id"] == rows[0]["run_id"]]
    judged: list[Judged] = []
    untargeted: set[str] = set()
    for row in latest:
        if p["targets"] == "fixed":
            fixed = {m: p[f"{m}_s"] for m in METRICS if p[f"{m}_s"] is not None}
            judged.append(Judged(run_name(row), "", row["summary"], fixed))
            continue
        lanes = row["summary"].get("by_server_lane")
        if not lanes:
            return needs(f"{run_name(row)}: {_NO_LANES[lanes is None]}")
        for lane, group in sorted(lanes.items()):
            targets = _lane_targets(lane, group, p)
            if targets:
                judged.append(Judged(f"{run_name(row)} lane {lane}", f"{lane} ", group,
                                     targets))
            else:
                untargeted.add(lane)
    if not judged:
        return needs(f"{run_name(latest[0])}: no SLO on the lanes it ran in"
                     f" ({', '.join(sorted(untargeted))}): set one (item slo_set,"
                     " `batchpilot ctl set lanes.interactive.slo.ttft_s=2`)")
    return _percentiles_verdict(judged, p["percentiles"], run_name(latest[0]), untargeted)


_NO_LANES = {  # by_server_lane missing (True) or empty (False)
    True: "stored before load tests recorded the lane each request ran in; run it again,"
          " or set params.targets: fixed with ttft_s and tpot_s",
    False: "the server reported no lane (batchpilot.lane) for any request it served: not a"
           " batchpilot server? Set params.targets: fixed with ttft_s and tpot_s"}


def _lane_targets(lane: str, group: dict[str, Any], p: dict[str, Any]) -> dict[str, float]:
    """The targets a lane's group is judged by: the SLO the server reported for the lane
    (not the scenario's, which is the load test's own), each overridden by a number in the
    params."""
    own = ((group.get("slo") or {}).get("by_lane") or {}).get(lane) or {}
    targets = {m: p[f"{m}_s"] if p[f"{m}_s"] is not None else own.get(f"{m}_s")
               for m in METRICS}
    return {m: v for m, v in targets.items() if v is not None}


def _percentiles_verdict(judged: list[Judged], percentiles: list[int], run: str,
                         untargeted: set[str]) -> Verdict:
    over, within, unmeasured = [], [], []
    for group in judged:
        for metric, slo in group.targets.items():
            for q in percentiles:
                value = (group.summary.get(metric) or {}).get(f"p{q}")
                text = f"{metric} p{q} {fmt(value)} s"
                if value is None:
                    unmeasured.append(f"{group.short}{metric} p{q}")
                elif value > slo:
                    over.append(f"{group.name} {text} > {slo:g} s")
                else:
                    within.append(f"{group.short}{text} <= {slo:g}")
    if over:
        return failed("; ".join(over), over=over)
    if not within:
        return needs(f"{run}: nothing measured ({', '.join(unmeasured)};"
                     " TTFT and TPOT need streamed requests)")
    note = f" (not measured: {', '.join(unmeasured)})" if unmeasured else ""
    if untargeted:
        note += f" (no SLO, not judged: lane {', '.join(sorted(untargeted))})"
    return passed(f"{run}: {', '.join(within)}{note}", within=within)


def _gaps_measured(row: dict[str, Any]) -> bool:
    return any((row["summary"].get(g) or {}).get("count") for g in ("ttft_gap", "e2e_gap"))


@register("latency_reconciled", ttft_gap_p99_s=0.1, e2e_gap_p99_s=0.1, label=None,
          nullable={"ttft_gap_p99_s": float, "e2e_gap_p99_s": float, "label": str})
def latency_reconciled(ev: Evidence, p: dict[str, Any]) -> Verdict:
    """The gap (client-measured minus server-reported TTFT / E2E, seconds) of the newest
    run whose results carry the server's timing: p99 at most the threshold per config."""
    if not ev.loadtest_runs:
        return no_results(ev)
    rows = [r for r in ev.loadtest_runs if _gaps_measured(r)
            and (p["label"] is None or r["label"] == p["label"])]
    if not rows:
        return needs("no stored load-test run carries the server's timing next to the"
                     " client's (results from an older `batchpilot loadtest`, or a server"
                     " that sends no batchpilot.timing): run `batchpilot loadtest` again"
                     + (f" with config {p['label']!r}" if p["label"] else ""))
    over, within, unmeasured = [], [], []
    for row in (r for r in rows if r["run_id"] == rows[0]["run_id"]):
        for gap, name in (("ttft_gap", "TTFT"), ("e2e_gap", "E2E")):
            limit, dist = p[f"{gap}_p99_s"], row["summary"].get(gap) or {}
            if limit is None:
                continue
            if not dist.get("count"):
                unmeasured.append(f"{name} gap")
                continue
            text = (f"{name} gap p50 {fmt(dist.get('p50'))} s, p99 {fmt(dist['p99'])} s"
                    f" ({dist['count']} requests)")
            if dist["p99"] > limit:
                over.append(f"{run_name(row)}: {text} > {limit:g} s")
            else:
                within.append(f"{text} <= {limit:g} s")
    if over:
        return failed("; ".join(over) + ": the server under-reports what clients wait"
                      " (see `batchpilot trace slow`, docs/traces.md)", over=over)
    if not within:
        return needs(f"{run_name(rows[0])}: nothing measured ({', '.join(unmeasured)};"
                     " a TTFT gap needs streamed requests)")
    note = f" (not measured: {', '.join(unmeasured)})" if unmeasured else ""
    return passed(f"{run_name(rows[0])}: {'; '.join(within)}{note}", within=within)


@register("long_prompts_dont_stall_decode", long_prompt_tokens=512, min_long_prompts=3,
          itl_p99_s=0.5)
def long_prompts_dont_stall_decode(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if not ev.loadtest_stats:
        return no_results(ev)
    runs = _scenarios(ev)
    for s in ev.loadtest_stats:
        row = runs.get((s["run_id"], s["label"]))
        if row is None or s["long_prompts"] < p["min_long_prompts"] or not s["streamed"]:
            continue
        itl = (row["summary"].get("itl") or {}).get("p99")
        if itl is None:
            continue
        shown = (f"{run_name(row)}: {s['long_prompts']} prompts of >= {p['long_prompt_tokens']}"
                 f" tokens, {s['streamed']} streamed; ITL p99 {fmt(itl)} s")
        if itl > p["itl_p99_s"]:
            return failed(f"{shown} > {p['itl_p99_s']:g} s: streams stalled behind long"
                          " prefills (chunked prefill on? a smaller prefill_chunk_size?)",
                          itl_p99_s=itl, run_id=s["run_id"])
        return passed(f"{shown} <= {p['itl_p99_s']:g} s", itl_p99_s=itl, run_id=s["run_id"])
    return needs(f"no stored run with >= {p['min_long_prompts']} prompts of >="
                 f" {p['long_prompt_tokens']} tokens and streamed requests: run"
                 " playbooks/scenarios/chat-long-prompts.yaml")
