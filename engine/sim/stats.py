"""Percentiles and per-lane latency summaries of finished requests."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from engine.records import RequestRecord

LATENCY_FIELDS = ("queue_delay_s", "ttft_s", "tpot_s", "e2e_s")


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (q in 0..100) of a non-empty list."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_table(records: Iterable[RequestRecord], by: str = "lane",
                  quantiles: tuple[float, ...] = (50, 95, 99)) -> dict[str, dict[str, float]]:
    """{group: {"n": count, "ttft_s_p95": ..., ...}} for the finished records."""
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for rec in records:
        groups[getattr(rec, by)].append(rec)
    table = {}
    for name, recs in sorted(groups.items()):
        row: dict[str, float] = {"n": len(recs)}
        for fld in LATENCY_FIELDS:
            values = [getattr(r, fld) for r in recs if getattr(r, fld) is not None]
            for q in quantiles:
                row[f"{fld}_p{q:g}"] = percentile(values, q)
        table[name] = row
    return table


def format_latency_table(table: dict[str, dict[str, float]], by: str = "lane") -> str:
    """A fixed-width text table, milliseconds."""
    cols = [("queue_delay_s", "queue"), ("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")]
    head = f"{by:<14}{'n':>6}" + "".join(f"{label + ' p50/p95/p99 (ms)':>30}" for _, label in cols)
    lines = [head, "-" * len(head)]
    for name, row in table.items():
        cells = []
        for fld, _ in cols:
            vals = [row[f"{fld}_p{q}"] * 1000 for q in (50, 95, 99)]
            cells.append(f"{' / '.join(_fmt(v) for v in vals):>30}")
        lines.append(f"{name:<14}{int(row['n']):>6}" + "".join(cells))
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.0f}" if v >= 10 else f"{v:.1f}"
