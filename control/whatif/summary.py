"""The same summary of what was recorded and of what a replay predicts, overall and per
lane and tenant: latency percentiles, outcomes, goodput under the SLOs, KV and preemptions.

Latencies count from arrival, as the server's own (`requests.ttft_s` ...): TTFT, TPOT and
E2E over finished requests; queue delay over every request that was scheduled; ITL over
every gap between consecutive tokens of finished requests. Goodput: finished requests that
meet every SLO given (control/loadtest/records.py's SLO), per second of the window. The SLO
is one for every request, or by lane (`LaneSLOs`: the config's lanes' targets, the default
when the caller gives none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from control.loadtest.records import SLO
from control.whatif.replay import Prediction
from control.whatif.window import Window

PERCENTILES = (50, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
OUTCOMES = ("finished", "rejected", "timeout", "cancelled", "error")
LaneSLOs = Mapping[str, SLO]  # lane -> its targets (lanes without any left out)
SLOs = SLO | LaneSLOs | None


@dataclass(frozen=True)
class Row:
    """One request, recorded or predicted, in the fields a summary reads."""

    lane: str
    tenant: str
    outcome: str
    ttft: float | None
    tpot: float | None
    e2e: float | None
    queue: float | None
    itl: tuple[float, ...]


def recorded_rows(window: Window) -> list[Row]:
    return [Row(r.lane, r.tenant, r.outcome, r.ttft_s, r.tpot_s, r.e2e_s, r.queue_delay_s,
                tuple(window.itl_s.get(r.request_id, ())) if r.outcome == "finished" else ())
            for r in window.requests]


def predicted_rows(prediction: Prediction) -> list[Row]:
    rows = []
    for rec in prediction.records:
        t = rec.token_times
        rows.append(Row(rec.lane, rec.tenant, rec.outcome, rec.ttft_s, rec.tpot_s, rec.e2e_s,
                        rec.queue_delay_s,
                        tuple(b - a for a, b in zip(t, t[1:], strict=False))
                        if rec.outcome == "finished" else ()))
    return rows


def _dist(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ps = np.percentile(values, PERCENTILES)
    return {"count": len(values), "mean": float(np.mean(values)),
            **{f"p{p}": float(v) for p, v in zip(PERCENTILES, ps, strict=True)}}


def _meets(row: Row, slo: SLO) -> bool:
    if slo.ttft_s is not None and (row.ttft is None or row.ttft > slo.ttft_s):
        return False
    if slo.e2e_s is not None and (row.e2e is None or row.e2e > slo.e2e_s):
        return False
    return slo.tpot_s is None or row.tpot is None or row.tpot <= slo.tpot_s


def _slo_of(slo: SLOs, lane: str) -> SLO | None:
    if slo is None or isinstance(slo, SLO):
        return slo
    return slo.get(lane)


def _checked(slo: SLOs) -> bool:
    """Whether any target is set (else goodput is not reported)."""
    if slo is None or isinstance(slo, SLO):
        return slo is not None and any(v is not None for v in asdict(slo).values())
    return any(_checked(s) for s in slo.values())


def _group(rows: list[Row], duration_s: float, slo: SLOs) -> dict:
    done = [r for r in rows if r.outcome == "finished"]
    out: dict = {"requests": len(rows),
                 **{o: sum(r.outcome == o for r in rows) for o in OUTCOMES}}
    for name in ("ttft", "tpot", "e2e"):
        out[name] = _dist([getattr(r, name) for r in done if getattr(r, name) is not None])
    out["queue"] = _dist([r.queue for r in rows if r.queue is not None])
    out["itl"] = _dist([g for r in done for g in r.itl])
    checked = _checked(slo)
    good = sum(_meets(r, s) for r in done if (s := _slo_of(slo, r.lane)) is not None) \
        if checked else 0
    out["goodput_rps"] = good / duration_s if checked else None
    out["slo_met_share"] = good / len(done) if checked and done else None
    return out


def _by(rows: Iterable[Row], key: str, duration_s: float, slo: SLOs) -> dict:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(getattr(r, key), []).append(r)
    return {name: _group(groups[name], duration_s, slo) for name in sorted(groups)}


def summarize(rows: list[Row], duration_s: float, slo: SLOs, *, kv_total_blocks: int,
              kv_peak_blocks: int, preempted: int) -> dict:
    """JSON-ready: overall metrics, then by_lane and by_tenant with the same keys."""
    out = _group(rows, duration_s, slo)
    out["kv_peak_blocks"] = kv_peak_blocks
    out["kv_peak_usage"] = kv_peak_blocks / kv_total_blocks if kv_total_blocks else None
    out["preempted"] = preempted
    out["by_lane"] = _by(rows, "lane", duration_s, slo)
    out["by_tenant"] = _by(rows, "tenant", duration_s, slo)
    return out


def recorded_summary(window: Window, slo: SLOs) -> dict:
    f = window.facts
    return summarize(recorded_rows(window), window.duration_s, slo,
                     kv_total_blocks=f.num_kv_blocks, kv_peak_blocks=f.kv_peak_blocks,
                     preempted=f.preempted)


def predicted_summary(prediction: Prediction, duration_s: float, slo: SLOs) -> dict:
    return summarize(predicted_rows(prediction), duration_s, slo,
                     kv_total_blocks=prediction.kv_total_blocks,
                     kv_peak_blocks=prediction.kv_peak_blocks,
                     preempted=prediction.preempted)
