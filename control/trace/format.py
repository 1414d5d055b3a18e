"""Text for `batchpilot trace`: the JSON of the trace read API (control/trace/queries.py, the
same dicts from a file or a server) as tables an operator reads in a terminal.

Times print as local clock times (HH:MM:SS.mmm); durations as us, ms or s.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

LATENCY_ROWS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"),
                ("queue", "queue_delay_s"))
PREEMPTED_NOTE = "preempted: seconds re-queued after a preemption, inside prefill/decode"


def dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0"
    size = abs(seconds)
    if size >= 1:
        return f"{seconds:.2f} s"
    if size >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def clock(t: float | None, date: bool = False) -> str:
    """Local wall-clock time of epoch seconds `t`, to the millisecond."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t).strftime(
        "%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")[:-3]


def clock_span(since: float, until: float) -> str:
    """'2026-12-07 03:49:33.611 .. 03:49:45.414 (11.8 s)': local clock times, dated once."""
    return f"{clock(since, date=True)} .. {clock(until)} ({until - since:.1f} s)"


def pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def table(headers: list[str], rows: list[list[Any]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; a header starting with '>' is right-aligned."""
    right = [h.startswith(">") for h in headers]
    cells = [[h.lstrip(">") for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [indent + "  ".join(c.rjust(w) if r else c.ljust(w)
                               for c, w, r in zip(row, widths, right, strict=True)).rstrip()
            for row in cells]


def main_wait(reasons: dict[str, float] | None) -> str:
    """The reason a request spent the most queued seconds on, with those seconds."""
    if not reasons:
        return "-"
    reason = max(reasons, key=reasons.__getitem__)
    return f"{reason} {dur(reasons[reason])}"


STEP_SIZES_NOTE = ("steps until 1st token: the steps from arrival to first token, by why each"
                   " had its size (the commonest step_reason / all; docs/traces.md)")


def step_sizes(reasons: dict[str, int] | None) -> str:
    """'grow_for_throughput 12/30': the commonest step_reason while a request waited."""
    if not reasons:
        return "-"
    reason = max(reasons, key=reasons.__getitem__)
    return f"{reason} {reasons[reason]}/{sum(reasons.values())}"


def _outcome(row: dict[str, Any]) -> str:
    reason = row.get("finish_reason") or ""
    return row["outcome"] if reason in ("", row["outcome"]) else f"{row['outcome']}/{reason}"


def _target(row: dict[str, Any]) -> str:
    if row.get("target_step_s") is None:
        return "-"
    return f"{dur(row['target_step_s'])} {row.get('step_reason') or ''}".rstrip()


def _by_reason(counts: dict[str, int] | None) -> str:
    return ",".join(f"{k}:{v}" for k, v in (counts or {}).items() if v) or "-"


# ---- summary ---------------------------------------------------------------------------
def summary(data: dict[str, Any]) -> str:
    s = data["steps"]
    asked = ""
    if data["since"] is not None or data["until"] is not None:
        asked = f"  (asked: {clock(data['since'], True)} .. {clock(data['until'], True)})"
    if not s["steps"]:
        lines = [f"window       no steps recorded{asked}"]
    else:
        busy = (s["last"] or 0) - (s["first"] or 0)
        tps = "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.0f}"
        lines = [
            f"window       {clock(s['first'], True)} .. {clock(s['last'], True)}"
            f" ({dur(busy)}){asked}",
            f"steps        {s['steps']}, {tps} tokens/s ({s['prefill_tokens']} prefill +"
            f" {s['decode_tokens']} decode tokens)",
            f"step time    mean {dur(s['step_s_mean'])}, p99 {dur(s['step_s_p99'])}",
            f"KV usage     max {pct(s['kv_usage_max'])}, mean {pct(s['kv_usage_mean'])};"
            f" token budget used {pct(s['budget_use_mean'])} on average",
            f"preemptions  {s['preemptions'] or 0}",
            f"config       {s['config_versions']} version(s) in use"]
    lines += [f"run          {r['run_id']} (model {r['model']}, started"
              f" {clock(r['started'], True)})" for r in data["runs"]]
    lines += _outcomes(data["outcomes"]) + _deferred(data.get("deferred", []))
    lines += _latency(data["latency"]) + _waits(data["waits"])
    if data["config_changes"]:
        lines += ["", "config changes"] + table(
            ["time", ">version", "source", "actor", "change"],
            [[clock(c["time"]), c["version"], c["source"], c["actor"], c["change"]]
             for c in data["config_changes"]])
    return "\n".join(lines)


def _outcomes(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["", "no requests ended in this window"]
    return ["", "outcomes"] + table(["outcome", "reason", ">requests"], [
        [r["outcome"], r["reason"] or "-", r["requests"]] for r in rows])


def _deferred(rows: list[dict[str, Any]]) -> list[str]:
    """Admitted behind the requests on time (a server's summary before this field: none)."""
    if not rows:
        return []
    return ["", "admitted deferred (behind the requests that can still meet their SLO)"] + \
        table(["reason", ">requests"], [[r["reason"], r["requests"]] for r in rows])


def _latency(groups: list[dict[str, Any]]) -> list[str]:
    lines = []
    for g in groups:
        lines += ["", f"latency of {g['group']}: {g['requests']} requests ({g['finished']}"
                  f" finished, {g['rejected']} rejected, {g['failed']} failed)"]
        lines += table(["", ">p50", ">p90", ">p99"], [
            [name] + [dur(g[f"{col}_{p}"]) for p in ("p50", "p90", "p99")]
            for name, col in LATENCY_ROWS])
        lines.append(f"  mean: queue {dur(g['queue_s_mean'])}, prefill"
                     f" {dur(g['prefill_s_mean'])}, decode {dur(g['decode_s_mean'])},"
                     f" preempted {dur(g['preempted_s_mean'])}")
    return lines


def _waits(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    return ["", "queue waits by main reason"] + table(
        ["reason", ">waits", ">total", ">mean"],
        [[r["reason"] or "(none)", r["waits"], dur(r["wait_s"]),
          dur(r["wait_s"] / r["waits"] if r["waits"] else None)] for r in rows])


# ---- slow ------------------------------------------------------------------------------
def slow(rows: list[dict[str, Any]], by: str = "e2e_s") -> str:
    if not rows:
        return "no requests ended in this window"
    key = by.removesuffix("_s").replace("queue_delay", "queue")
    extra = [] if by in ("e2e_s", "queue_delay_s") else [f">{key}"]
    body = [[r["request_id"]] + ([dur(r[by])] if extra else []) + [
        dur(r["e2e_s"]), dur(r["queue_s"]), dur(r["prefill_s"]), dur(r["decode_s"]),
        dur(r["preempted_s"]), main_wait(r["wait_reasons"]), step_sizes(r.get("step_reasons")),
        _outcome(r), r["lane"], r["tenant"]] for r in rows]
    headers = ["request", *extra, ">e2e", ">queue", ">prefill", ">decode", ">preempted",
               "main wait", "steps until 1st token", "outcome", "lane", "tenant"]
    _replica_column(headers, body, rows)
    return "\n".join([f"slowest by {key}"] + table(headers, body) + [PREEMPTED_NOTE,
                                                                      STEP_SIZES_NOTE])


def _replica_column(headers: list[str], body: list[list[Any]],
                    rows: list[dict[str, Any]]) -> None:
    """Rows a fleet's ingress gathered carry `replica` (docs/fleet.md): a last column."""
    if any("replica" in r for r in rows):
        headers.append("replica")
        for line, r in zip(body, rows, strict=True):
            line.append(r.get("replica", "-"))


# ---- steps -----------------------------------------------------------------------------
def steps(rows: list[dict[str, Any]], batch: bool = False, at: float | None = None) -> str:
    """One line per step; `batch` adds the ids that ran; `at` draws a line at that moment."""
    if not rows:
        return "no steps in this window"
    headers = ["time", ">step", ">dur", "target", ">prefill", ">decode", ">tokens", ">KV",
               "waiting", ">adm", ">pre", ">fin"]
    body = [[
        clock(r["start_time"]), r["step_id"], dur(r["duration_s"]), _target(r),
        f"{r['num_prefill_seqs']}/{r['num_prefill_tokens']}t", r["num_decode_seqs"],
        f"{r['tokens_used']}/{r['token_budget']}", pct(r["kv_usage"]),
        _by_reason(r["waiting_by_reason"]), len(r["admitted"]), len(r["preempted"]),
        len(r["finished"])] for r in rows]
    _replica_column(headers, body, rows)
    lines = table(headers, body)
    out = [lines[0]]
    marked = at is None
    for r, line in zip(rows, lines[1:], strict=True):
        if not marked and r["start_time"] > at:
            out.append(f"  ---- {clock(at)} ----")
            marked = True
        out.append(line)
        if batch:
            out += _batch_lines(r)
    if not marked:
        out.append(f"  ---- {clock(at)} ----")
    out.append("  target: the step's time target and why (step_reason); prefill: seqs/tokens;"
               " tokens: used/budget; adm/pre/fin: requests admitted, preempted, finished")
    return "\n".join(out)


OTHER = "(other)"  # a request of another tenant, its id not shown to a tenant-bound token


def _ids(ids: list[str | None]) -> list[str]:
    return [OTHER if rid is None else rid for rid in ids]


def _batch_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    if r.get("prefill_ids"):
        lines.append("      prefill " + " ".join(
            f"{rid}:{n}" for rid, n in zip(_ids(r["prefill_ids"]), r["prefill_tokens"],
                                           strict=True)))
    if r.get("decode_ids"):
        lines.append("      decode  " + " ".join(_ids(r["decode_ids"])))
    if r["preempted"]:
        lines.append("      preempted " + " ".join(_ids(r["preempted"])))
    if r["finished"]:
        lines.append("      finished " + " ".join(
            f"{rid}({why})" for rid, why in zip(_ids(r["finished"]), r["finish_reasons"],
                                                strict=True)))
    return lines


def spans(ids: list[int], most: int = 8) -> str:
    """Step ids as ranges: [3, 4, 5, 9] -> '3-5, 9'; at most `most` ranges shown."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    text = [f"{a}-{b}" if b > a else str(a) for a, b in out]
    if len(text) > most:  # the first most-1 and the last shown: len - most hidden
        hidden = len(text) - most
        text = text[:most - 1] + [f"... {hidden} more range{'s' * (hidden > 1)}", text[-1]]
    return ", ".join(text)


def as_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
