"""`batchpilot trace report`: a postmortem draft in Markdown, from a trace file or a server.

    batchpilot trace --db trace.duckdb report --since 14:00 --until 14:30 --out pm.md

Everything comes from named questions (sources.py), so --db and --url give the same
report. The report names the config change that caused a latency regression: each change
is judged by the requests that arrived up to `compare_s` before it against those that
arrived up to `compare_s` after it (neither side crossing another change or the window's
edge). A change made latency worse when a judged p99 (TTFT, E2E, queue delay) grew by at
least WORSE_RATIO and WORSE_ABS_S, with MIN_REQUESTS on each side; the suspect is the one
whose p99 grew the most, in seconds. A later change restored latency when, for the
requests after it, each p99 the suspect made worse is back near its value before the
suspect (RESTORED_SHARE). "During" is the span from the suspect to that change; "before"
and "after" are the rest of the window.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from control.trace.audit_sources import is_config_version
from control.trace.sources import FileSource, TraceError

COMPARE_S = 300.0  # seconds of arrivals judged on each side of a change (at most)
MIN_REQUESTS = 10  # requests with a TTFT needed on each side to judge a change
WORSE_RATIO = 1.5  # a p99 is worse when it is at least 1.5x what it was ...
WORSE_ABS_S = 0.02  # ... and at least 20 ms more: below that it is noise
RESTORED_SHARE = 0.5  # restored: each worse p99 is back within noise of where it was, or
# has at most this share of its growth left (so one stall after a rollback does not count)
JUDGED = ("ttft_s_p99", "e2e_s_p99", "queue_delay_s_p99")
MAX_JUDGED_CHANGES = 50  # two questions each
BURST_BUCKETS = 120  # rejection counts per bucket over the window
BURST_MIN = 3  # a burst: a bucket with at least this many rejections ...
BURST_FACTOR = 3.0  # ... and this many times the window's mean per bucket
SLOWEST = 10


# ---- building the report ----------------------------------------------------------------
def build_report(source: Any, since: float | None = None, until: float | None = None,
                 compare_s: float = COMPARE_S) -> dict[str, Any]:
    """The report's data (JSON-ready); report_format.markdown() writes it out."""
    if since is not None and until is not None and since > until:
        raise TraceError("--since must not be after --until", 2)
    if not compare_s > 0:  # NaN too
        raise TraceError(f"--compare-s {compare_s} must be > 0", 2)
    summary = source.ask("summary", since=since, until=until)
    changes = [_parse(c) for c in source.ask("config_changes", since=since, until=until)]
    # only config versions are suspects: audit rows (a drain, a prediction, a law refit,
    # a fleet's canary or scale event) stay in the list, unjudged
    judged = [c for c in changes if is_config_version(c.get("source"))][:MAX_JUDGED_CHANGES]
    for i, change in enumerate(judged):
        change.update(judge_change(source, judged, i, since, until, compare_s))
    suspect = pick_suspect(judged)
    return {
        "since": since, "until": until, "compare_s": compare_s,
        "first": summary["steps"]["first"], "last": summary["steps"]["last"],
        "summary": summary, "changes": changes, "judged": len(judged),
        "suspect": suspect, "phases": phase_latency(source, suspect, since, until),
        "kv_crossings": source.ask("kv_crossings", since=since, until=until),
        "rejection_bursts": rejection_bursts(source, summary, since, until),
        "slowest": [r for r in source.ask("slow", since=since, until=until, limit=SLOWEST,
                                          by="e2e_s") if r["outcome"] != "rejected"],
        "thresholds": {"min_requests": MIN_REQUESTS, "worse_ratio": WORSE_RATIO,
                       "worse_abs_s": WORSE_ABS_S, "judged": list(JUDGED)},
    }


def _parse(change: dict[str, Any]) -> dict[str, Any]:
    diff = change.get("change")
    if isinstance(diff, str):
        try:
            diff = json.loads(diff) if diff else {}
        except ValueError:
            diff = {"(unparsed)": diff}
    return {**change, "change": diff or {}}


def judge_change(source: Any, changes: list[dict[str, Any]], i: int, since: float | None,
                 until: float | None, compare_s: float) -> dict[str, Any]:
    """Latency of the requests that arrived before change i against those after it."""
    change = changes[i]
    if change["source"] == "startup":
        return {"verdict": "startup"}
    t = change["time"]
    lo = max(x for x in (t - compare_s, since,
                         changes[i - 1]["time"] if i else None) if x is not None)
    hi = min(x for x in (t + compare_s, until,
                         changes[i + 1]["time"] if i + 1 < len(changes) else None)
             if x is not None)
    before = source.ask("cohort_latency", since=lo, until=t)["all"]
    after = source.ask("cohort_latency", since=t, until=hi)["all"]
    verdict = {"before": before, "after": after, "windows": [[lo, t], [t, hi]]}
    if min(_served(before), _served(after)) < MIN_REQUESTS:
        return {**verdict, "verdict": "too few requests"}
    worse = {m: [before[m], after[m]] for m in JUDGED if is_worse(before[m], after[m])}
    better = {m: [before[m], after[m]] for m in JUDGED if is_worse(after[m], before[m])}
    kind = "worse" if worse else "better" if better else "no clear change"
    return {**verdict, "verdict": kind, "worse": worse, "better": better}


def _served(stats: dict[str, Any] | None) -> int:
    return (stats or {}).get("ttft_s_n") or 0


def is_worse(before: float | None, after: float | None) -> bool:
    """`after` is a regression from `before` beyond noise."""
    if before is None or after is None:
        return False
    return after >= before * WORSE_RATIO and after - before >= WORSE_ABS_S


def pick_suspect(changes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The change whose judged p99 grew the most; and the first later change after which
    those p99s are no longer worse than before the suspect (None: not restored)."""
    worse = [c for c in changes if c.get("verdict") == "worse"]
    if not worse:
        return None

    def growth(c: dict[str, Any]) -> float:
        return max(a - b for b, a in c["worse"].values())
    suspect = max(worse, key=growth)
    restored_by = None
    for later in changes[changes.index(suspect) + 1:]:
        after = later.get("after")
        if _served(after) >= MIN_REQUESTS and all(
                _back(b, a, after[m]) for m, (b, a) in suspect["worse"].items()):
            restored_by = later["version"], later["time"]
            break
    return {"version": suspect["version"], "time": suspect["time"],
            "growth_s": growth(suspect),
            "restored_by": None if restored_by is None else
            {"version": restored_by[0], "time": restored_by[1]},
            "also_worse": [c["version"] for c in worse if c is not suspect]}


def _back(before: float, worse: float, now: float | None) -> bool:
    """A p99 that went from `before` to `worse` is back when it is `now`."""
    return now is not None and (not is_worse(before, now)
                                or now - before <= RESTORED_SHARE * (worse - before))


def phase_latency(source: Any, suspect: dict[str, Any] | None, since: float | None,
                  until: float | None) -> dict[str, Any]:
    """Before / during / after the suspect (by arrival); the whole window without one."""
    if suspect is None:
        return {"window": source.ask("cohort_latency", since=since, until=until)}
    t0 = suspect["time"]
    t1 = suspect["restored_by"]["time"] if suspect["restored_by"] else None
    phases = {"before": source.ask("cohort_latency", since=since, until=t0),
              "during": source.ask("cohort_latency", since=t0,
                                   until=t1 if t1 is not None else until)}
    if t1 is not None:
        phases["after"] = source.ask("cohort_latency", since=t1, until=until)
    return phases


def rejection_bursts(source: Any, summary: dict[str, Any], since: float | None,
                     until: float | None) -> dict[str, Any]:
    """Buckets where rejections spike (BURST_MIN and BURST_FACTOR x the window's mean per
    bucket), adjacent ones merged, with their reasons; and the window's total."""
    data = source.ask("series_outcomes", since=since, until=until, buckets=BURST_BUCKETS)
    bucket_s = data["bucket_s"]
    counts: dict[float, dict[str, int]] = {}
    for row in data["rows"]:
        if row["outcome"] == "rejected":
            reasons = counts.setdefault(row["time"], {})
            reasons[row["reason"]] = reasons.get(row["reason"], 0) + row["requests"]
    total = sum(sum(r.values()) for r in counts.values())
    lo = since if since is not None else summary["steps"]["first"]
    hi = until if until is not None else summary["steps"]["last"]
    span_buckets = max(len(counts), int((hi - lo) // bucket_s) + 1 if lo is not None
                       and hi is not None and hi > lo else 1)
    floor = max(BURST_MIN, BURST_FACTOR * total / span_buckets)
    bursts: list[dict[str, Any]] = []
    for t in sorted(counts):
        n = sum(counts[t].values())
        if n < floor:
            continue
        if bursts and abs(bursts[-1]["end"] - t) < 1e-6:
            burst = bursts[-1]
        else:
            burst = {"start": t, "rejected": 0, "reasons": {}}
            bursts.append(burst)
        burst["end"] = t + bucket_s
        burst["rejected"] += n
        for reason, k in counts[t].items():
            burst["reasons"][reason] = burst["reasons"].get(reason, 0) + k
    return {"bucket_s": bucket_s, "total": total, "threshold": floor, "bursts": bursts}


# ---- the CLI subcommand -----------------------------------------------------------------
def add_options(parser: argparse.ArgumentParser) -> None:
    """--out and --compare-s (the window options come from the CLI's _window)."""
    parser.add_argument("--out", metavar="FILE.md", help="write the Markdown here, making its"
                        " folder if missing (default: print it)")
    parser.add_argument("--compare-s", type=float, default=COMPARE_S, metavar="S",
                        help="seconds of requests judged on each side of a config change"
                        " (default %(default)s)")


def command(args: argparse.Namespace, source: Any) -> tuple[Any, Any]:
    """`batchpilot trace report`: build, write --out if given; returns (data, text)."""
    from control.trace.report_format import markdown

    data = build_report(source, args.since, args.until, args.compare_s)
    data["source"] = f"--db {source.path}" if isinstance(source, FileSource) else \
        f"--url {source.url}"
    text = markdown(data)
    if args.out is None:
        return data, lambda _: text
    try:  # into a folder of its own, as the runbooks' evidence folder is: made if missing
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    except OSError as exc:
        raise TraceError(f"--out {args.out!r}: {exc.strerror or exc}", 2) from None
    cause = data["suspect"]
    said = f"suspected cause: config version {cause['version']}" if cause else \
        "no config change explains a latency regression"
    return data, lambda _: f"wrote {os.path.abspath(args.out)} ({said})"
