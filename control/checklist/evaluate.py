"""Decide every item of a spec on one body of evidence."""

from __future__ import annotations

from control.checklist.catalog import CHECKS
from control.checklist.evidence import Evidence
from control.checklist.result import FAIL, NEEDS, ItemResult, Verdict
from control.checklist.spec import Spec


def evaluate(spec: Spec, evidence: Evidence) -> list[ItemResult]:
    """One ItemResult per item, in the spec's order. A check that cannot read its
    evidence (a malformed row) gives needs-evidence saying so, never an exception."""
    results = []
    for section in spec.sections:
        for item in section.items:
            try:
                verdict = CHECKS[item.check].fn(evidence, item.params)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                verdict = Verdict(NEEDS, f"could not decide from the evidence given:"
                                  f" {type(exc).__name__}: {exc}", {"error": str(exc)})
            results.append(ItemResult(item.id, section.title, item.title, verdict.status,
                                      verdict.evidence, verdict.details, item.why))
    return results


def exit_code(results: list[ItemResult], strict: bool = False) -> int:
    """0 when nothing fails, 1 when an item fails (with `strict`: or needs evidence)."""
    bad = {FAIL, NEEDS} if strict else {FAIL}
    return 1 if any(r.status in bad for r in results) else 0
