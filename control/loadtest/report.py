"""Load-test results for people: a terminal table, a Markdown report, a percentile plot.

Every table puts the configs side by side (one column each) with the ratio of each to the
first config, so a change is read off one run rather than two (STYLE.md, rule 9). Latencies
are seconds, each followed by its client-vs-server gap (`ttft_gap_*`, `e2e_gap_*`: what the
client measured minus what the server reported); matplotlib is imported only by
plot_percentiles.
"""

from __future__ import annotations

from pathlib import Path

from control.loadtest.metrics import AUTO_LANE, LATENCIES, Summary, compare

_STATS = ("p50", "p90", "p95", "p99")


def _labels(summaries: list[Summary]) -> list[str]:
    return [s.label or f"config {i}" for i, s in enumerate(summaries)]


def fmt_value(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _side_by_side(summaries: list[Summary]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: metric, unit, one value per config, one ratio per other config."""
    labels = _labels(summaries)
    header = ["metric", "unit", *labels, *(f"{lab} / {labels[0]}" for lab in labels[1:])]
    rows = [[row["metric"], row["unit"], *map(fmt_value, row["values"]),
             *map(fmt_ratio, row["ratios"][1:])] for row in compare(summaries)]
    return header, rows


def _text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(w) for cell, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, rows)])


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def text_table(summaries: list[Summary]) -> str:
    """Metrics as rows, configs as columns, then each config's ratio to the first."""
    return _text(*_side_by_side(summaries))


_GROUP_HEADER = ["config", "requests", "ok", "rejected", "timeout", "cancelled", "error",
                 "goodput req/s", "req/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 s",
                 "TPOT p99 s", "ITL p99 s", "E2E p99 s", "TTFT gap p99 s", "E2E gap p99 s"]


def _group_row(group: str, label: str, s: Summary) -> list[str]:
    counts = [s.outcomes.get(o, 0) for o in ("rejected", "timeout", "cancelled", "error")]
    return [group, label, str(s.requests), str(s.ok), *map(str, counts),
            *map(fmt_value, (s.goodput_rps, s.request_rps, s.ttft.p50, s.ttft.p99, s.tpot.p50,
                             s.tpot.p99, s.itl.p99, s.e2e.p99, s.ttft_gap.p99, s.e2e_gap.p99))]


def _group_table(summaries: list[Summary], attr: str, title: str) -> str:
    """One row per (group, config): the groups of every config, in name order."""
    labels = _labels(summaries)
    groups = sorted({g for s in summaries for g in getattr(s, attr)})
    rows = [_group_row(g, lab, getattr(s, attr)[g]) for g in groups
            for lab, s in zip(labels, summaries, strict=True) if g in getattr(s, attr)]
    if not rows:
        return "(no requests)"
    return _markdown([title, *_GROUP_HEADER], rows)


def _slo_text(slo: dict | None) -> str:
    if slo and "by_lane" in slo:
        lanes = "; ".join(f"{lane} {_slo_text(s)}" for lane, s in slo["by_lane"].items())
        return f"each lane's own, as the server sent them: {lanes}"
    if not slo or all(v is None for v in slo.values()):
        return "none given (goodput not computed)"
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    return ", ".join(f"{names.get(k, k)} <= {v:g} s" for k, v in slo.items() if v is not None)


def markdown_report(scenario_name: str, scenario_description: str, summaries: list[Summary],
                    notes: list[str]) -> str:
    """The whole report; `notes`: how lengths and times were scaled, anything to know."""
    labels = _labels(summaries)
    slos = [f"- {lab}: {_slo_text(s.slo)}" for lab, s in zip(labels, summaries, strict=True)]
    configs = [f"- {lab}: {s.requests} requests over {s.duration_s:g} s"
               for lab, s in zip(labels, summaries, strict=True)]
    parts = [
        f"# Load test: {scenario_name}", scenario_description.strip(),
        "## Configs", "\n".join(configs),
        "## Side by side",
        f"Latencies in seconds over the ok requests (TTFT, TPOT and ITL over the streamed"
        f" ones); ratios are each config / {labels[0]}. A gap (`ttft_gap_*`, `e2e_gap_*`)"
        " is the client's time minus the server's own `batchpilot.timing`: delay the"
        " server does not report (`-`: the server sent no timing).",
        _markdown(*_side_by_side(summaries)),
        "## By lane",
        f"Requests sent without a lane (the server routes them) are under `{AUTO_LANE}`;"
        " throughputs divide by the whole run's duration.",
        _group_table(summaries, "by_lane", "lane"),
        "## By tenant", _group_table(summaries, "by_tenant", "tenant"),
        "## SLOs", "\n".join(slos),
        "## Scaling and notes", "\n".join(f"- {n}" for n in notes) or "- none",
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def plot_percentiles(summaries: list[Summary], path: str | Path) -> str | Path:
    """One PNG: a panel per latency (TTFT, TPOT, ITL, E2E), bars of p50/p90/p95/p99 grouped
    by percentile, one bar per config; log scale where the values span more than 20x."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = _labels(summaries)
    fig = Figure(figsize=(11, 8), layout="constrained")
    FigureCanvasAgg(fig)  # Agg, whatever backend pyplot would pick
    width = 0.8 / max(len(summaries), 1)  # of one percentile's slot
    for ax, name in zip(fig.subplots(2, 2).flat, LATENCIES, strict=True):
        seen: list[float] = []
        for i, (label, s) in enumerate(zip(labels, summaries, strict=True)):
            dist = getattr(s, name)
            values = [getattr(dist, stat) for stat in _STATS]
            heights = [float("nan") if v is None else v for v in values]
            seen += [v for v in values if v is not None and v > 0]
            xs = [x + (i - (len(summaries) - 1) / 2) * width for x in range(len(_STATS))]
            ax.bar(xs, heights, width, label=label)
        if seen and max(seen) / min(seen) > 20:
            ax.set_yscale("log")
        if not seen:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(range(len(_STATS)), _STATS)
        ax.set_title(f"{name.upper()} percentiles (ok requests)")
        ax.set_xlabel("percentile")
        ax.set_ylabel("seconds" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    handles, names = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 6) or 1)
    fig.suptitle("Latency percentiles by config (TTFT, TPOT, ITL: streamed requests)")
    fig.savefig(path, format="png", dpi=100)
    return path
