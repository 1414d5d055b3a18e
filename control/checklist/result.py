"""What a check decides: a `Verdict` (status, the values that decided it), and the
`ItemResult` the checklist reports for one item."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, NEEDS = "pass", "fail", "needs-evidence"
STATUSES = (PASS, FAIL, NEEDS)


class ChecklistError(Exception):
    """A failure to report on stderr in one line, with the exit code it gets (2: usage:
    a bad spec, an unreadable file, an unreachable server, a refused token)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Verdict:
    status: str  # one of STATUSES
    evidence: str  # the values that decided it, for a human
    details: dict[str, Any] = field(default_factory=dict)  # the same values, as data


def passed(evidence: str, **details: Any) -> Verdict:
    return Verdict(PASS, evidence, details)


def failed(evidence: str, **details: Any) -> Verdict:
    return Verdict(FAIL, evidence, details)


def needs(evidence: str, **details: Any) -> Verdict:
    return Verdict(NEEDS, evidence, details)


@dataclass(frozen=True)
class ItemResult:
    """One checklist item, decided."""

    id: str
    section: str
    title: str
    status: str  # pass | fail | needs-evidence
    evidence: str  # the values that decided it
    details: dict[str, Any] = field(default_factory=dict)
    why: str = ""  # why the item matters, from the spec

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
