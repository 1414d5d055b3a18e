"""What-if results for people: a terminal table and a PNG, both from the JSON result
(control/whatif/compare.py), so a result fetched from a server prints the same.

Columns: recorded, predicted (the recorded config replayed), each proposal; then the
ratios predicted / recorded (the prediction's own error) and proposal / predicted (the
change). Latencies in seconds. matplotlib is imported only by `plot`.
"""

from __future__ import annotations

from pathlib import Path

from control.loadtest.report import fmt_ratio, fmt_value
from control.trace.format import clock_span
from control.whatif.compare import PREDICTED, RECORDED, ratio_rows

GROUP_METRICS = ("requests", "finished", "rejected", "timeout", "goodput_rps", "ttft_p50_s",
                 "ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "queue_p99_s")


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([cells[0].ljust(widths[0]), *rest]).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def _ratio_columns(columns: list[str], baseline: str) -> list[str]:
    """The columns with a ratio: predicted, and every other but the baseline itself."""
    return [c for c in columns[1:] if c == PREDICTED or c != baseline]


def _header(columns: list[str], baseline: str = PREDICTED) -> list[str]:
    ratios = [f"{PREDICTED}/{RECORDED}" if c == PREDICTED else f"{c}/{baseline}"
              for c in _ratio_columns(columns, baseline)]
    return ["metric", *columns, *ratios]


def _cells(row: dict, columns: list[str], baseline: str = PREDICTED) -> list[str]:
    return [row["metric"], *(fmt_value(row["values"][c]) for c in columns),
            *(fmt_ratio(row["ratios"][c]) for c in _ratio_columns(columns, baseline))]


def _groups(result: dict, attr: str) -> list[str]:
    columns, baseline = result["columns"], result.get("baseline", PREDICTED)
    names = sorted({g for c in columns for g in result["summaries"][c][attr]})
    out = []
    for name in names:
        sub = {c: result["summaries"][c][attr].get(name) for c in columns}
        if any(s is None for s in sub.values()):
            continue  # a group only one side has (a lane the proposal removed)
        rows = [r for r in ratio_rows(sub, baseline=baseline) if r["metric"] in GROUP_METRICS]
        out.append(f"\n{attr.removeprefix('by_')} {name}\n"
                   + _table(_header(columns, baseline),
                            [_cells(r, columns, baseline) for r in rows]))
    return out


def text_report(result: dict) -> str:
    w, cal = result["window"], result["calibration"]
    fit, held = cal["in_sample"], cal["held_out"]
    lines = [f"what-if over {w['requests']} requests,"
             f" {clock_span(w['since'], w['until'])}, run {w['run_id']}",
             f"step-time law ({cal['group']}): "
             + ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in cal["coef_s"].items())
             + f"; gap {cal['gap_s'] * 1e3:.3g} ms",
             f"fit on {fit['steps']} steps: R^2 {fmt_value(fit['r2'])}, median |err|"
             f" {fmt_value(fit['median_abs_pct'])}%, p90 {fmt_value(fit['p90_abs_pct'])}%; held out"
             f" ({held['steps']} steps): median {fmt_value(held['median_abs_pct'])}%, p90"
             f" {fmt_value(held['p90_abs_pct'])}%"]
    against = ("the window's config" if w.get("config_version") is None
               else f"the window's config, version {w['config_version']}")
    for name, c in result["configs"].items():
        changes = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in c["diff"].items())
        lines.append(f"{name}: {changes or 'no change'} (against {against})")
    columns, baseline = result["columns"], result.get("baseline", PREDICTED)
    if baseline != PREDICTED:
        replicas = result.get("replicas", 1)
        lines.append(f"rate scale {result['rate_scale']:g}: the recorded arrivals at"
                     f" {result['rate_scale']:g}x their rate, on {replicas} replica"
                     f"{'s' if replicas > 1 else ''}; proposals divide by {baseline!r}")
    lines += ["", _table(_header(columns, baseline),
                         [_cells(r, columns, baseline) for r in result["rows"]])]
    lines += _groups(result, "by_lane") + _groups(result, "by_tenant")
    if result.get("capacity"):
        lines += ["", *capacity_lines(result["capacity"])]
    lines += [""] + [f"WARNING: {w}" for w in result["warnings"]]
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines).rstrip() + "\n"


CAPACITY_COLUMNS = ("rate_scale", "offered_rps", "goodput_rps", "met_share_of_offered",
                    "finished", "rejected", "timeout", "ttft_p99_s", "e2e_p99_s")


def capacity_lines(capacity: dict) -> list[str]:
    """The sweep as one table per config, and each config's capacity."""
    share = capacity["met_share_for_capacity"]
    lines = [f"capacity: every config at each rate scale (capacity: the highest rate up to"
             f" which >= {share:.0%} of offered requests meet their SLO)"]
    for name, rows in capacity["configs"].items():
        cap = capacity["capacity"][name]
        top = cap is not None and cap == capacity["rates"][-1]  # a floor: no higher rate tried
        lines += ["", f"{name}: capacity "
                  + (f"{'at least ' if top else ''}{cap:g}x the recorded rate"
                     if cap is not None else
                     f"under {capacity['rates'][0]:g}x (none of the swept rates)"),
                  _table(list(CAPACITY_COLUMNS), [[fmt_value(r[c]) for c in CAPACITY_COLUMNS]
                                                  for r in rows])]
    return lines


def plot(result: dict, path: str | Path) -> str | Path:
    """One PNG: with a rate sweep, goodput and p99 TTFT against rate; else a panel per
    latency, bars of p50/p95/p99, one bar per column."""
    if result.get("capacity"):
        return plot_capacity(result["capacity"], path)
    return plot_latencies(result, path)


def plot_capacity(capacity: dict, path: str | Path) -> str | Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(fig)
    good, ttft = fig.subplots(1, 2)
    offered = None
    for name, rows in capacity["configs"].items():
        rates = [r["rate_scale"] for r in rows]
        offered = [r["offered_rps"] for r in rows]
        good.plot(rates, [float("nan") if r["goodput_rps"] is None else r["goodput_rps"]
                          for r in rows], marker="o", label=name)
        ttft.plot(rates, [float("nan") if r["ttft_p99_s"] is None else r["ttft_p99_s"]
                          for r in rows], marker="o", label=name)
    if offered:
        good.plot(rates, offered, linestyle=":", color="grey", label="offered")
    good.set(title="goodput (requests meeting their SLO /s)", xlabel="x the recorded rate",
             ylabel="requests / s")
    ttft.set(title="TTFT p99 (s)", xlabel="x the recorded rate", ylabel="seconds")
    good.legend()
    fig.suptitle("what-if: the recorded arrivals, faster")
    fig.savefig(path, format="png", dpi=100)
    return path


def plot_latencies(result: dict, path: str | Path) -> str | Path:
    """One PNG: a panel per latency, bars of p50/p95/p99, one bar per column."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = result["columns"]
    stats = ("p50", "p95", "p99")
    fig = Figure(figsize=(12, 8), layout="constrained")
    FigureCanvasAgg(fig)
    width = 0.8 / len(columns)
    for ax, name in zip(fig.subplots(2, 3).flat, ("ttft", "tpot", "itl", "e2e", "queue", ""),
                        strict=True):
        if not name:
            ax.axis("off")
            continue
        for i, col in enumerate(columns):
            dist = result["summaries"][col][name]
            heights = [float("nan") if dist[s] is None else dist[s] for s in stats]
            xs = [x + (i - (len(columns) - 1) / 2) * width for x in range(len(stats))]
            ax.bar(xs, heights, width, label=col)
        ax.set_xticks(range(len(stats)), stats)
        ax.set_title(f"{name.upper()} (s)")
    handles, names = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 6))
    fig.suptitle("what-if: recorded, predicted (recorded config), proposals")
    fig.savefig(path, format="png", dpi=100)
    return path
