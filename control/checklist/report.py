"""The checklist's results as text (a terminal, a CI log), Markdown (a go-live review)
and JSON (the dashboard, a pipeline)."""

from __future__ import annotations

import json
from typing import Any

from control.checklist.result import FAIL, NEEDS, PASS, STATUSES, ItemResult

SYMBOLS = {PASS: "✓", FAIL: "✗", NEEDS: "?"}
ASCII_SYMBOLS = {PASS: "+", FAIL: "x", NEEDS: "?"}
MD_SYMBOLS = {PASS: "✅", FAIL: "❌", NEEDS: "❔"}


def summary(results: list[ItemResult]) -> dict[str, Any]:
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    ready = counts[FAIL] == 0 and counts[NEEDS] == 0
    return {"items": len(results), **counts, "ready": ready}


def summary_line(results: list[ItemResult]) -> str:
    s = summary(results)
    verdict = ("ready to go live" if s["ready"] else
               "NOT ready: items fail" if s[FAIL] else "not decided: evidence missing")
    return (f"{s[PASS]} pass, {s[FAIL]} fail, {s[NEEDS]} need evidence"
            f" ({s['items']} items): {verdict}")


def _sections(results: list[ItemResult]) -> dict[str, list[ItemResult]]:
    grouped: dict[str, list[ItemResult]] = {}
    for r in results:
        grouped.setdefault(r.section, []).append(r)
    return grouped


def to_text(results: list[ItemResult], *, ascii_only: bool = False) -> str:
    """Sections of aligned lines: symbol, status, id, title; the evidence under each."""
    symbols = ASCII_SYMBOLS if ascii_only else SYMBOLS
    id_width = max((len(r.id) for r in results), default=0)
    lines = []
    for section, items in _sections(results).items():
        lines.append(section)
        for r in items:
            status = r.status.upper() if r.status == FAIL else r.status
            lines.append(f"  {symbols[r.status]} {status:<14} {r.id:<{id_width}}  {r.title}")
            lines.append(f"  {'':<16} {'':<{id_width}}  {r.evidence}")
        lines.append("")
    lines.append(summary_line(results))
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def to_markdown(results: list[ItemResult], *, title: str = "Go-live checklist",
                source: str = "") -> str:
    """A table per section, then the summary line."""
    lines = [f"# {title}", ""]
    if source:
        lines += [f"Evidence from {source}.", ""]
    lines += [f"**{summary_line(results)}**", ""]
    for section, items in _sections(results).items():
        lines += [f"## {section}", "", "| | Item | Status | Evidence |", "|---|---|---|---|"]
        for r in items:
            item = f"**{_cell(r.title)}** (`{r.id}`)" + (f"<br>{_cell(r.why)}" if r.why else "")
            lines.append(f"| {MD_SYMBOLS[r.status]} | {item} | {r.status} |"
                         f" {_cell(r.evidence)} |")
        lines.append("")
    return "\n".join(lines)


def to_json(results: list[ItemResult]) -> str:
    return json.dumps({"summary": summary(results), "items": [r.to_dict() for r in results]},
                      indent=2, default=str)
