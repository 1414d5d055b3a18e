"""The go-live checklist: playbooks/checklist.yaml's items decided from the evidence a
server (or a trace file) and the repository give, each pass, fail or needs-evidence.

    spec = load_spec(DEFAULT_SPEC)
    ev = gather_evidence(UrlSource(url), ControlClient(url), repo_root=".", spec=spec)
    results = evaluate(spec, ev)
    print(to_text(results)); Path("go-live.md").write_text(to_markdown(results))

`batchpilot checklist` (control/checklist/cli.py) does the same and exits 1 on a failure.
"""

from __future__ import annotations

from control.checklist.client import ControlClient
from control.checklist.evaluate import evaluate, exit_code
from control.checklist.evidence import Evidence, LoadtestFile, gather_evidence
from control.checklist.report import summary, to_json, to_markdown, to_text
from control.checklist.result import ChecklistError, ItemResult
from control.checklist.spec import DEFAULT_SPEC, Spec, load_spec

__all__ = ["DEFAULT_SPEC", "ChecklistError", "ControlClient", "Evidence", "ItemResult",
           "LoadtestFile", "Spec", "evaluate", "exit_code", "gather_evidence", "load_spec",
           "summary", "to_json", "to_markdown", "to_text"]
