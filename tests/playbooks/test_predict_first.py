"""Every budget change the playbooks make (`batchpilot ctl set` of a budget, dry run or
not) is predicted first: an earlier `batchpilot whatif ... --set` on the same page sets
the same KEY=VALUE. The commands themselves run in test_runbooks.py."""

from __future__ import annotations

import shlex

import pytest
from fixtures.runbook_steps import TUNING, all_runbooks, runbook_steps

BUDGETS = ("max_num_seqs", "max_num_batched_tokens", "max_batched_tokens",
           "prefill_chunk_size", "max_waiting_requests")
PAGES = [*all_runbooks(), TUNING]


def assignments(command: str, verb: tuple[str, ...]) -> set[str] | None:
    """The KEY=VALUE words of a `batchpilot VERB ...` command (None: another command)."""
    words = shlex.split(command)
    if tuple(words[1:1 + len(verb)]) != verb or words[0] != "batchpilot":
        return None
    return {w for w in words if "=" in w and not w.startswith("-")}


def budget_changes(page) -> list[tuple[int, set[str]]]:
    out = []
    for i, step in enumerate(runbook_steps(page)):
        sets = assignments(step.command, ("ctl", "set"))
        if sets and any(s.split("=")[0] in BUDGETS for s in sets):
            out.append((i, sets))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_budget_change_is_predicted_before_it(page):
    steps = runbook_steps(page)
    for i, sets in budget_changes(page):
        predicted = [assignments(s.command, ("whatif",)) or set() for s in steps[:i]]
        assert any(sets <= p for p in predicted), \
            f"{page.name}: `{steps[i].command}` has no `batchpilot whatif --set` before it"


def test_the_pages_that_change_budgets_are_the_ones_expected():
    changing = {p.name for p in PAGES if budget_changes(p)}
    assert changing == {"ttft-spike.md", "kv-pressure.md", "rejection-storm.md", "tuning.md"}
