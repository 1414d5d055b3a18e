"""The go-live item `change_predicted`: the latest planned config change passes only when a
what-if prediction of the same values preceded it (recorded by POST /v1/whatif in the
trace's config_changes); every other case fails or needs evidence, saying why."""

from __future__ import annotations

import json

import pytest

from control.checklist import DEFAULT_SPEC, Evidence, evaluate, load_spec
from control.checklist.trace_config import config_from_trace

SPEC = load_spec(DEFAULT_SPEC)


def row(time: float, source: str, change: dict, version: int = 1, actor: str = "ops"
        ) -> dict:
    return {"time": time, "version": version, "source": source, "actor": actor,
            "change": json.dumps(change), "note": "what-if 'proposed' over 60 requests"
            if source == "whatif" else ""}


def verdict(changes: list[dict] | None, **missing: str):
    ev = Evidence(config_changes=changes, missing=dict(missing))
    return next(r for r in evaluate(SPEC, ev) if r.id == "change_predicted")


PREDICTION = row(1000.0, "whatif", {"max_num_seqs": [16, 64], "prefill_chunk_size": [512, 256]})


def test_a_change_predicted_before_it_was_made_passes():
    got = verdict([row(10.0, "startup", {}), PREDICTION,
                   row(1200.0, "api", {"max_num_seqs": [16, 64.0]}, version=2)])
    assert got.status == "pass", got.evidence
    assert "version 2 (api)" in got.evidence and "max_num_seqs -> 64.0" in got.evidence
    assert "what-if 'proposed' over 60 requests" in got.evidence
    assert "1 of 1 planned change(s) predicted" in got.evidence


@pytest.mark.parametrize(("changes", "shown"), [
    ([PREDICTION, row(1200.0, "api", {"max_num_seqs": [16, 32]}, version=2)],
     "max_num_seqs -> 32 was not predicted"),  # predicted 64, applied 32
    ([PREDICTION, row(1200.0, "api", {"max_num_batched_tokens": [512, 1024]}, version=2)],
     "max_num_batched_tokens -> 1024 was not predicted"),  # a key the prediction lacked
    ([PREDICTION, row(1200.0, "api", {"max_num_seqs": [16, 64],
                                      "max_num_batched_tokens": [512, 1024]}, version=2)],
     "max_num_batched_tokens -> 1024 was not predicted"),  # one of its keys unpredicted
    ([row(1300.0, "api", {"max_num_seqs": [16, 64]}, version=2),  # predicted afterwards
      row(1400.0, "whatif", {"max_num_seqs": [16, 64]}, version=2)], "was not predicted"),
    ([PREDICTION, row(1000.0 + 2 * 86400, "api", {"max_num_seqs": [16, 64]}, version=2)],
     "in the 86400 s before it"),  # a prediction two days old
    ([PREDICTION, row(1100.0, "api", {"max_num_seqs": [16, 64]}, version=2),
      row(1500.0, "profile:degrade", {"max_num_seqs": [64, 8]}, version=3)],
     "version 3 (profile:degrade)"),  # the latest planned change was not predicted
])
def test_an_unpredicted_latest_change_fails_naming_it(changes, shown):
    got = verdict(changes)
    assert got.status == "fail" and shown in got.evidence, got.evidence
    assert "batchpilot whatif --url URL" in got.evidence


def test_no_planned_change_fails_and_rollbacks_or_drains_are_not_plans():
    got = verdict([row(10.0, "startup", {}), PREDICTION,
                   row(1100.0, "rollback:1", {"max_num_seqs": [64, 16]}, version=3),
                   row(1200.0, "drain", {"admission": ["open", "paused"]})])
    assert got.status == "fail"
    assert "no planned config change in the audit log (4 entries, 1 what-if" in got.evidence


def test_without_a_trace_it_needs_evidence():
    got = verdict(None, trace="the server answered 404: tracing is off")
    assert got.status == "needs-evidence" and "tracing is off" in got.evidence


def test_a_prediction_is_not_replayed_as_a_config_version():
    facts = {"run": {"run_id": "r1", "started": 0.0, "settings": "{}"}}
    config, _, where = config_from_trace(facts, [row(5.0, "whatif", {"max_num_seqs": [4, 64]})])
    assert config.get("max_num_seqs") != 64 and "replayed" not in where
