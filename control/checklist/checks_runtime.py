"""Checks on behaviour exercised before go-live: cancelled requests gave their KV blocks
back, and a config rollback was done (and audited).

KV semantics (engine/kv/block_manager.py): `used` blocks are held by requests; a finished or
cancelled request's full blocks stay in the prefix cache as `cached`, which counts as
free (reclaimable). So once nothing runs, every block a request held is back: `used` must
be 0, whatever `cached` is. Waiting requests hold none (a preempted one is recomputed).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from control.checklist.checks_ops import gauge_sum
from control.checklist.evidence import Evidence
from control.checklist.registry import fmt, register
from control.checklist.result import Verdict, failed, needs, passed


def _when(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.datetime.fromtimestamp(float(t)).isoformat(sep=" ", timespec="seconds")


def _idle_observations(ev: Evidence) -> list[tuple[str, float, float]]:
    """(where, blocks used, blocks cached) at moments nothing ran, after cancellations."""
    seen = []
    facts = ev.trace_facts or {}
    step = facts.get("idle_after_cancel")
    if step:
        seen.append((f"trace step {step['step_id']} (first with nothing running after the"
                     " last cancel)", step["kv_blocks_used"], step["kv_blocks_cached"]))
    if ev.metrics_text is not None:
        running = gauge_sum(ev.metrics_text, "batchpilot_running_requests")
        waiting = gauge_sum(ev.metrics_text, "batchpilot_waiting_requests")
        used = gauge_sum(ev.metrics_text, "batchpilot_kv_blocks_used")
        if running == 0 and waiting == 0 and used is not None:
            cached = gauge_sum(ev.metrics_text, "batchpilot_kv_blocks_cached") or 0
            seen.append(("/metrics now (nothing running or waiting)", used, cached))
    return seen


@register("cancellation_frees_kv", min_cancelled=1)
def cancellation_frees_kv(ev: Evidence, p: dict[str, Any]) -> Verdict:
    facts = ev.trace_facts or {}
    in_trace = facts.get("cancelled", 0) or 0
    in_loadtest = sum(s.get("cancelled") or 0 for s in ev.loadtest_stats)
    cancelled = max(in_trace, in_loadtest)
    counts = f"{in_trace} cancelled request(s) in the trace, {in_loadtest} in load tests"
    if cancelled < p["min_cancelled"]:
        if not ev.trace_available and not ev.loadtest_stats:
            return needs(f"no trace or load-test results to find cancellations in"
                         f" ({ev.missing.get('trace', 'no trace')})")
        return needs(f"{counts}: cancel some (playbooks/scenarios/mixed.yaml cancels 5%)")
    seen = _idle_observations(ev)
    if not seen:
        return needs(f"{counts}, but no moment with nothing running was observed after"
                     " them: let the server go idle, then check again with --url")
    leaks = [(where, used, cached) for where, used, cached in seen if used > 0]
    if leaks:
        shown = "; ".join(f"{where}: kv_blocks_used {fmt(used)} (cached {fmt(cached)})"
                          for where, used, cached in leaks)
        return failed(f"{counts}; KV still held with nothing running: {shown}: blocks of"
                      " ended requests were not freed", leaks=leaks)
    shown = "; ".join(f"{where}: kv_blocks_used 0, cached prefix blocks {fmt(cached)}"
                      " (free, reclaimable)" for where, _, cached in seen)
    return passed(f"{counts}; {shown}", cancelled=cancelled)


@register("rollback_exercised")
def rollback_exercised(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if ev.history is None and ev.config_changes is None:
        why = [ev.missing.get(k) for k in ("history", "trace") if ev.missing.get(k)]
        return needs("no audit log read: " + ("; ".join(why) or "no history and no trace"))
    found = [(v, "/control/history") for v in ev.history or ()
             if str(v.get("source", "")).startswith("rollback")]
    found += [(c, "trace config_changes") for c in ev.config_changes or ()
              if str(c.get("source", "")).startswith("rollback")]
    if found:
        entry, where = max(found, key=lambda f: f[0].get("time") or 0.0)
        reason = entry.get("reason") or entry.get("note") or ""
        return passed(f"version {entry['version']} ({entry['source']}) at"
                      f" {_when(entry.get('time'))} by {entry.get('actor') or '?'}"
                      + (f", reason {reason!r}" if reason else "") + f" [{where}]",
                      rollbacks=len(found))
    sources = [str(v.get("source")) for v in (ev.history or [])]
    sources += [str(c.get("source")) for c in (ev.config_changes or [])]
    return failed(f"no rollback in the audit log ({len(sources)} entries, sources:"
                  f" {', '.join(sorted(set(sources))) or 'none'}): exercise one with"
                  " `batchpilot ctl rollback VERSION --reason drill`", sources=sources)


@register("step_cost_steady", max_drift=1.5)
def step_cost_steady(ev: Evidence, p: dict[str, Any]) -> Verdict:
    """Served steps cost what they did when the server began (engine/calibration/drift.py):
    a load test, a what-if and a capacity figure measured then still describe it."""
    if ev.metrics_text is None:
        return needs(f"no /metrics read ({ev.missing.get('metrics', 'no --url')})")
    scale = gauge_sum(ev.metrics_text, "batchpilot_step_law_scale")
    drift = gauge_sum(ev.metrics_text, "batchpilot_step_cost_drift_ratio")
    if scale is None:
        return passed("no step law (the budgets are set, or target_step_ms is 0): steps are"
                      " sized by token budgets alone, nothing to drift from")
    if drift is None or math.isnan(drift):
        return needs(f"step law scale {fmt(scale)}, but no drift reading yet: it needs the"
                     " server's first 60 steps and 10 in the last 20 s; check under load")
    shown = (f"served steps cost {fmt(drift)}x what they did at start-up (limit"
             f" {fmt(p['max_drift'])}x); the scheduler divides its step target by"
             f" {fmt(scale)}")
    if drift > p["max_drift"]:
        return failed(f"{shown}: the device got slower (another process, throttling); runbook"
                      " playbooks/runbooks/step-cost-drift.md", drift=drift)
    return passed(shown, drift=drift)
