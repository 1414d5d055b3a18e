"""The checklist's verdict as a reader sees it (control/checklist/report.py): an item that
needs evidence keeps the deployment from being "ready", the summary says why, and the
Markdown table holds evidence with a `|` in one cell; the JSON keeps why each item matters."""

from __future__ import annotations

import json

from control.checklist.report import summary_line, to_json, to_markdown
from control.checklist.result import FAIL, NEEDS, PASS, ItemResult


def _item(item_id: str, status: str, evidence: str = "seen") -> ItemResult:
    return ItemResult(item_id, "Section", f"title {item_id}", status, evidence)


def test_evidence_missing_is_not_ready_and_says_so():
    results = [_item("a", PASS), _item("b", NEEDS)]
    assert json.loads(to_json(results))["summary"] == {
        "items": 2, PASS: 1, FAIL: 0, NEEDS: 1, "ready": False}
    assert summary_line(results).endswith("not decided: evidence missing")
    assert summary_line(results + [_item("c", FAIL)]).endswith("NOT ready: items fail")
    assert summary_line([_item("a", PASS)]).endswith("ready to go live")
    assert json.loads(to_json([_item("a", PASS)]))["summary"]["ready"] is True


def test_a_pipe_in_the_evidence_stays_in_its_markdown_cell():
    md = to_markdown([_item("a", FAIL, "lanes: interactive|batch over target")])
    row = next(line for line in md.splitlines() if "`a`" in line)
    assert "interactive\\|batch" in row
    assert row.replace("\\|", "").count("|") == 5  # four cells


def test_the_json_report_says_why_each_item_matters():
    item = ItemResult("a", "Section", "title a", FAIL, "seen", why="a stalled engine pages no one")
    assert json.loads(to_json([item]))["items"][0]["why"] == "a stalled engine pages no one"
