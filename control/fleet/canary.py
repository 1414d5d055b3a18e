"""A canary's decision rule: canary replicas against the rest over the same window.

Each side pools its replicas' ended requests (control/fleet/replica_window.py: only those
that ran under that side's fleet version), then

    regression  when, with at least `min_requests` on each side, any of
      TTFT p99  canary > baseline * (1 + ttft_rel)  AND  canary - baseline > ttft_floor_s
      TPOT p99  canary > baseline * (1 + tpot_rel)  AND  canary - baseline > tpot_floor_s
      error + timeout rate        canary - baseline > error_points  (fractions: 0.02 = 2 pts)
      goodput share               baseline - canary > goodput_points
    -> roll back at once (at any poll: a bad canary is not left serving for the window)
    at the window's end, no regression and enough requests on both sides -> promote
    at the window's end, too few requests -> extend the window (up to `max_extensions`
      times), then "inconclusive": roll back (a change nobody could show safe is not pushed
      to the whole fleet; apply it with a plain `ctl set` to do that on purpose)

Relative AND absolute: on a fast model a 2 ms -> 3 ms TTFT is +50% and harmless; on a
slow one +40 ms may be noise at p99. Rates are in points, not ratios: 0 -> 1 error in 200
requests is not "infinitely worse". Goodput is compared as a share of requests (finished
within their own deadline and their lane's SLO / requests that ended, cancellations
excluded), since routing
splits traffic unevenly between the sides; goodput in req/s per replica is reported too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FAILED = ("error", "timeout", "rejected")  # the canary's fault; "cancelled": the client's


@dataclass(frozen=True)
class CanaryRule:
    ttft_rel: float = 0.25
    ttft_floor_s: float = 0.05
    tpot_rel: float = 0.25
    tpot_floor_s: float = 0.01
    error_points: float = 0.02
    goodput_points: float = 0.05
    min_requests: int = 10  # per side, cancellations excluded
    max_extensions: int = 1

    def validate(self) -> CanaryRule:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"{name}={value} must be >= 0")
        if self.min_requests < 1:
            raise ValueError(f"min_requests={self.min_requests} must be >= 1")
        return self


@dataclass(frozen=True)
class SideStats:
    replicas: list[int]
    requests: int  # ended, cancellations excluded
    finished: int
    errors: int  # error + rejected at arrival
    timeouts: int
    cancelled: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    error_rate: float | None  # (errors + timeouts) / requests
    goodput_share: float | None  # good / requests
    goodput_rps: float | None  # good / window / replica

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def side_stats(windows: list[dict[str, Any]], replicas: list[int],
               duration_s: float) -> SideStats:
    """Pool replicas' windows (RequestWindow.since answers) into one side's figures."""
    outcomes: dict[str, int] = {}
    ttft: list[float] = []
    tpot: list[float] = []
    good = 0
    for w in windows:
        for outcome, n in w.get("outcomes", {}).items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
        ttft += w.get("ttft", [])
        tpot += w.get("tpot", [])
        good += w.get("good", 0)
    cancelled = outcomes.get("cancelled", 0)
    requests = sum(outcomes.values()) - cancelled
    errors = outcomes.get("error", 0) + outcomes.get("rejected", 0)
    timeouts = outcomes.get("timeout", 0)
    per_replica_s = duration_s * max(len(replicas), 1)
    return SideStats(
        replicas=list(replicas), requests=requests, finished=outcomes.get("finished", 0),
        errors=errors, timeouts=timeouts, cancelled=cancelled,
        ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), tpot_p99_s=_pct(tpot, 99),
        error_rate=(errors + timeouts) / requests if requests else None,
        goodput_share=good / requests if requests else None,
        goodput_rps=good / per_replica_s if per_replica_s > 0 else None)


@dataclass(frozen=True)
class Check:
    metric: str
    canary: float | None
    baseline: float | None
    limit: float | None  # the canary value beyond which it regressed (None: not compared)
    regressed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    decision: str  # continue | extend | promote | rollback
    why: str
    checks: list[Check]

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "why": self.why,
                "checks": [c.to_dict() for c in self.checks]}


def _latency(metric: str, c: float | None, b: float | None, rel: float,
             floor: float) -> Check:
    if c is None or b is None:
        return Check(metric, c, b, None, False)
    limit = max(b * (1 + rel), b + floor)  # worse than both the ratio and the floor
    return Check(metric, c, b, limit, c > limit)


def checks(canary: SideStats, baseline: SideStats, rule: CanaryRule) -> list[Check]:
    out = [_latency("ttft_p99_s", canary.ttft_p99_s, baseline.ttft_p99_s, rule.ttft_rel,
                    rule.ttft_floor_s),
           _latency("tpot_p99_s", canary.tpot_p99_s, baseline.tpot_p99_s, rule.tpot_rel,
                    rule.tpot_floor_s)]
    ce, be = canary.error_rate, baseline.error_rate
    limit = None if be is None else be + rule.error_points
    out.append(Check("error_timeout_rate", ce, be, limit,
                     ce is not None and limit is not None and ce > limit))
    cg, bg = canary.goodput_share, baseline.goodput_share
    limit = None if bg is None else bg - rule.goodput_points
    out.append(Check("goodput_share", cg, bg, limit,
                     cg is not None and limit is not None and cg < limit))
    return out


def decide(canary: SideStats, baseline: SideStats, rule: CanaryRule, *, window_over: bool,
           extensions: int) -> Verdict:
    """The rule in the module docstring, at one poll. `extensions`: windows added so far."""
    found = checks(canary, baseline, rule)
    enough = min(canary.requests, baseline.requests) >= rule.min_requests
    counts = (f"{canary.requests} canary / {baseline.requests} baseline requests"
              f" (min {rule.min_requests} each)")
    if enough:
        bad = [c.metric for c in found if c.regressed]
        if bad:
            return Verdict("rollback", f"regression: {', '.join(bad)}; {counts}", found)
    if not window_over:
        return Verdict("continue", f"watching; {counts}", found)
    if enough:
        return Verdict("promote", f"no regression over the window; {counts}", found)
    if extensions < rule.max_extensions:
        return Verdict("extend", f"too few requests: {counts}; extending the window", found)
    return Verdict("rollback", f"inconclusive: too few requests after {extensions}"
                   f" extension(s): {counts}", found)
