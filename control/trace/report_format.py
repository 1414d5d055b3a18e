"""Markdown for `batchpilot trace report`: the dict of report.build_report() as a
postmortem draft. Times are local clock times; durations as us, ms or s."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from control.trace.audit_sources import is_config_version
from control.trace.format import clock, dur, main_wait, pct

METRICS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"),
           ("queue delay", "queue_delay_s"))
JUDGED_NAMES = {"ttft_s_p99": "TTFT p99", "e2e_s_p99": "E2E p99",
                "queue_delay_s_p99": "queue delay p99"}


def markdown(r: dict[str, Any]) -> str:
    """The whole draft: suspected cause first, then the evidence."""
    sections = [_header(r), _cause(r), _summary(r), _timeline(r), _latency(r),
                _kv(r["kv_crossings"]), _bursts(r["rejection_bursts"]), _slowest(r["slowest"]),
                _todo()]
    return "\n\n".join(s.rstrip() for s in sections)


def cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, newlines flattened."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A header starting with '>' is right-aligned."""
    head = "| " + " | ".join(h.lstrip(">") for h in headers) + " |"
    rule = "|" + "|".join("---:" if h.startswith(">") else "---" for h in headers) + "|"
    return "\n".join([head, rule] + ["| " + " | ".join(cell(c) for c in row) + " |"
                                     for row in rows])


def diff_text(change: dict[str, Any]) -> str:
    """{"max_num_seqs": [128, 1]} -> 'max_num_seqs: 128 -> 1'."""
    def show(v: Any) -> str:
        return json.dumps(v, separators=(",", ":")) if isinstance(v, dict | list) else str(v)
    parts = [f"{k}: {show(pair[0])} -> {show(pair[1])}"
             if isinstance(pair, list) and len(pair) == 2 else f"{k}: {show(pair)}"
             for k, pair in change.items()]
    return ", ".join(parts) or "(no change)"


def _span(a: float | None, b: float | None, date: bool = True) -> str:
    return f"{clock(a, date)} .. {clock(b, date)}"


def _arrow(pair: list[float | None]) -> str:
    before, after = pair
    ratio = ""
    if before and after is not None:
        ratio = f" (x{after / before:.1f})" if after >= before else \
            f" (x{after / before:.2f})"
    return f"{dur(before)} -> {dur(after)}{ratio}"


# ---- sections ---------------------------------------------------------------------------
def _header(r: dict[str, Any]) -> str:
    zone = datetime.now().astimezone().strftime("%Z, UTC%z")
    if r["first"] is None:
        window = "no steps recorded in this window"
    else:
        window = _span(r["first"], r["last"])
    asked = f"; asked for {_span(r['since'], r['until'])}" if (
        r["since"] is not None or r["until"] is not None) else ""
    return (f"# Postmortem draft: {window}\n\n"
            f"_Drafted by `batchpilot trace report` from `{r.get('source', 'a trace')}`"
            f"{asked}. Times are local ({zone}). Check every claim against the evidence"
            " below before publishing._")


def _cause(r: dict[str, Any]) -> str:
    s = r["suspect"]
    if s is None:
        return "## Suspected cause\n\n" + _no_cause(r)
    change = _change(r, s["version"], s["time"])
    lines = ["## Suspected cause", "",
             f"**Config version {change['version']}**, {clock(change['time'], True)}, by"
             f" `{change['actor']}` (source `{change['source']}`)"
             + (f", reason: \"{change['note']}\"" if change.get("note") else ""), "",
             f"- diff: `{diff_text(change['change'])}`",
             f"- requests judged: {change['before']['ttft_s_n']} that arrived before it,"
             f" {change['after']['ttft_s_n']} after (arrived {_span(*change['windows'][0], False)},"
             f" against {_span(*change['windows'][1], False)})"]
    lines += [f"- {JUDGED_NAMES[m]}: {_arrow([change['before'][m], change['after'][m]])}"
              for m in JUDGED_NAMES]
    back = s["restored_by"]
    if back is None:
        lines += ["", "Latency was **not restored** by a later config change in this window."]
    else:
        fix = _change(r, back["version"], back["time"])
        lines += ["", f"**Restored** by config version {fix['version']} at"
                  f" {clock(fix['time'])} (source `{fix['source']}`, by `{fix['actor']}`"
                  + (f", reason: \"{fix['note']}\"" if fix.get("note") else "") + "): "
                  + "; ".join(f"{JUDGED_NAMES[m]} {dur(fix['after'][m])} (it was"
                              f" {dur(change['before'][m])} before version"
                              f" {change['version']})" for m in change["worse"]) + "."]
    if s["also_worse"]:
        lines.append(f"Other changes that also made latency worse: versions"
                     f" {', '.join(map(str, s['also_worse']))} (see the timeline).")
    return "\n".join(lines)


def _no_cause(r: dict[str, Any]) -> str:
    t = r["thresholds"]
    rule = (f"none made a p99 (TTFT, E2E or queue delay) at least {t['worse_ratio']}x and"
            f" {dur(t['worse_abs_s'])} worse, with at least {t['min_requests']} requests on"
            " each side")
    real = [c for c in r["changes"] if c["source"] != "startup"]
    if not real:
        return ("**No config change in this window**, so none can explain a latency"
                " regression. Look at load, KV usage and rejections below.")
    return (f"**No config change explains a latency regression**: {len(real)} change(s) in"
            f" this window, but {rule}. Look at load, KV usage and rejections below.")


def _change(r: dict[str, Any], version: int, time: float) -> dict[str, Any]:
    return next(c for c in r["changes"] if c["version"] == version and c["time"] == time)


def _summary(r: dict[str, Any]) -> str:
    sm = r["summary"]
    s = sm["steps"]
    lines = ["## Summary", ""]
    if not s["steps"]:
        lines.append("- No engine steps recorded in this window.")
    else:
        tps = "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.0f}"
        lines += [f"- Steps: {s['steps']} ({tps} tokens/s), step time mean"
                  f" {dur(s['step_s_mean'])}, p99 {dur(s['step_s_p99'])}",
                  f"- KV usage: max {pct(s['kv_usage_max'])}, mean {pct(s['kv_usage_mean'])};"
                  f" preemptions: {s['preemptions'] or 0}"]
    lines += [f"- Run `{run['run_id']}`: model `{run['model']}`, started"
              f" {clock(run['started'], True)}" for run in sm["runs"]]
    outcomes = sm["outcomes"]
    if outcomes:
        told = ", ".join(f"{o['outcome']}" + (f" ({o['reason']})" if o["reason"] else "")
                         + f" {o['requests']}" for o in outcomes)
        lines.append(f"- Requests that ended: {sum(o['requests'] for o in outcomes)}:"
                     f" {told}")
    else:
        lines.append("- No requests ended in this window.")
    return "\n".join(lines)


def _timeline(r: dict[str, Any]) -> str:
    changes = r["changes"]
    head = "## Timeline of config changes"
    if not changes:
        return f"{head}\n\nNo config changes in this window."
    rows = [[clock(c["time"]), c["version"], c["source"], c["actor"], c.get("note") or "",
             diff_text(c["change"]) if c["source"] != "startup" else "(starting config)",
             _effect(c)] for c in changes]
    versions = sum(is_config_version(c["source"]) for c in changes)
    note = "" if r["judged"] == versions else \
        f"\n\nOnly the first {r['judged']} changes were judged."
    return (f"{head}\n\nEffect: latency of the requests that arrived before the change"
            f" against those after it (up to {dur(r['compare_s'])} each side, not crossing"
            " another change).\n\n"
            + md_table(["time", ">version", "source", "actor", "reason", "diff", "effect"],
                       rows) + note)


def _effect(c: dict[str, Any]) -> str:
    if not is_config_version(c["source"]):
        return "an audit row, not a config change: not judged"
    verdict = c.get("verdict", "not judged")
    if verdict == "startup":
        return ""
    if verdict == "too few requests":
        return (f"too few requests to judge ({c['before']['ttft_s_n']} before,"
                f" {c['after']['ttft_s_n']} after)")
    moved = c.get("worse") or c.get("better") or {}
    told = "; ".join(f"{JUDGED_NAMES[m]} {_arrow(p)}" for m, p in moved.items())
    return f"**{verdict}**: {told}" if told else verdict


def _latency(r: dict[str, Any]) -> str:
    phases = r["phases"]
    head = "## Latency by lane"
    if "window" in phases:
        intro = "Requests by arrival time, over the whole window (no suspected change)."
    else:
        intro = ("Requests by arrival time: before the suspected change, during (until the"
                 " change that restored latency, or the window's end), and after.")
    lanes = sorted({row["lane"] for p in phases.values() for row in p["lanes"]})
    if all(p["all"] is None or not p["all"]["requests"] for p in phases.values()):
        return f"{head}\n\nNo requests arrived in this window."
    groups = [("all lanes", lambda p: p["all"])] if len(lanes) != 1 else []
    groups += [(f"lane `{lane}`", lambda p, lane=lane: next(
        (x for x in p["lanes"] if x["lane"] == lane), None)) for lane in lanes]
    out = [head, "", intro]
    for title, pick in groups:
        stats = {name: pick(p) for name, p in phases.items()}
        out += ["", f"### {title}", "", _latency_table(stats)]
    return "\n".join(out)


def _latency_table(stats: dict[str, dict[str, Any] | None]) -> str:
    names = list(stats)
    rows = [["requests (finished / rejected / failed)"] + [
        "no requests" if not s or not s["requests"] else
        f"{s['requests']} ({s['finished']} / {s['rejected']} / {s['failed']})"
        for s in stats.values()]]
    for label, col in METRICS:
        rows.append([f"{label} n"] + [str(s[f"{col}_n"]) if s else "0"
                                     for s in stats.values()])
        for q in ("p50", "p95", "p99"):
            rows.append([f"{label} {q}"] + [dur(s[f"{col}_{q}"]) if s else "-"
                                           for s in stats.values()])
    return md_table([""] + [f">{n}" for n in names], rows)


def _kv(rows: list[dict[str, Any]]) -> str:
    head = "## KV watermark crossings"
    if not rows:
        return f"{head}\n\nKV usage crossed no watermark in this window."
    return f"{head}\n\n" + md_table(
        ["time", ">step", "crossing", ">usage", ">blocks used", "watermarks high / reject"],
        [[clock(k["time"]), k["step_id"], k["trigger"].replace("_", " "), pct(k["usage"]),
          f"{k['used']}/{k['total']}",
          f"{pct(k['high_watermark'])} / {pct(k['reject_watermark'])}"] for k in rows])


def _bursts(b: dict[str, Any]) -> str:
    head = "## Rejection bursts"
    if not b["total"]:
        return f"{head}\n\nNo requests were rejected in this window."
    rule = (f"{b['total']} rejections in the window; a burst is a {dur(b['bucket_s'])} bucket"
            f" with at least {b['threshold']:.0f}.")
    if not b["bursts"]:
        return f"{head}\n\n{rule} None."
    return f"{head}\n\n{rule}\n\n" + md_table(
        ["from", "to", ">rejected", "reasons"],
        [[clock(x["start"]), clock(x["end"]), x["rejected"],
          ", ".join(f"{k} {n}" for k, n in sorted(x["reasons"].items(), key=lambda kv: -kv[1]))]
         for x in b["bursts"]])


def _slowest(rows: list[dict[str, Any]]) -> str:
    head = "## Slowest requests"
    if not rows:
        return f"{head}\n\nNo requests ended in this window."
    table = md_table(
        ["request", "lane", "arrived", ">e2e", ">ttft", ">queue", ">prefill", ">decode",
         ">preempted", "waits by reason", "outcome"],
        [[x["request_id"], x["lane"], clock(x["arrival_time"]), dur(x["e2e_s"]),
          dur(x["ttft_s"]), dur(x["queue_s"]), dur(x["prefill_s"]), dur(x["decode_s"]),
          dur(x["preempted_s"]), _waits(x["wait_reasons"]), x["outcome"]] for x in rows])
    return f"{head}\n\n{_where_time_went(rows)}\n\n{table}"


def _waits(reasons: dict[str, float] | None) -> str:
    return ", ".join(f"{k} {dur(v)}" for k, v in sorted(
        (reasons or {}).items(), key=lambda kv: -kv[1]) if v) or "-"


def _where_time_went(rows: list[dict[str, Any]]) -> str:
    total = sum(x["e2e_s"] or 0 for x in rows)
    parts = {k: sum(x[k] or 0 for x in rows) for k in ("queue_s", "prefill_s", "decode_s")}
    share = ", ".join(f"{k.removesuffix('_s')} {v / total * 100:.0f}%"
                      for k, v in parts.items()) if total > 0 else "-"
    waits: dict[str, float] = {}
    for x in rows:
        for k, v in (x["wait_reasons"] or {}).items():
            waits[k] = waits.get(k, 0.0) + v
    return (f"Where the time of these {len(rows)} went: {share} (preempted time is inside"
            f" prefill and decode); queued mostly for {main_wait(waits)}"
            + (f" of {dur(sum(waits.values()))} queued." if waits else "."))


def _todo() -> str:
    blank = "_(for the author to fill in)_"
    return (f"## To write\n\n- Impact (who noticed, for how long): {blank}\n"
            f"- Detection (alert, dashboard, report): {blank}\n"
            f"- Why the change was made, and why it hurt: {blank}\n- Action items: {blank}")
