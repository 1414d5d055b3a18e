"""The go-live checklist: each item passes on a deployment that did everything, fails for
each reason it names (with the offending value in the evidence), and needs evidence where
none was given; the reports. The spec's errors: test_checklist_spec.py; the CLI:
test_checklist_cli.py."""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import yaml

from control.checklist import (
    evaluate,
    exit_code,
    to_markdown,
    to_text,
)
from control.checklist.spec import parse_spec
from engine.config.patch import live_to_dict
from engine.config.yaml_loader import load_config_file
from tests.control.checklist.evidence import (
    ROOT,
    SPEC,
    good,
    metrics_text,
    result,
    set_evidence,
    spec_with,
)


def test_a_deployment_that_did_everything_passes_every_item():
    results = evaluate(SPEC, good())
    assert [r.id for r in results if r.status != "pass"] == []
    assert exit_code(results) == 0 and exit_code(results, strict=True) == 0
    by_id = {r.id: r for r in results}
    assert "lanes.batch.max_running 16" in by_id["limits_set"].evidence
    assert "version 3 (rollback:1)" in by_id["rollback"].evidence
    assert "kv_blocks_used 0, cached prefix blocks 12" in by_id["cancellation_frees_kv"].evidence
    assert by_id["latency_reconciled"].evidence == (
        "run lt1 (scenario mixed): TTFT gap p50 0.004 s, p99 0.03 s (70 requests) <= 0.1 s;"
        " E2E gap p50 0.002 s, p99 0.02 s (84 requests) <= 0.1 s")
    assert by_id["latency_slo"].evidence == (
        "run lt1 (scenario mixed): interactive ttft p95 0.8 s <= 2, interactive ttft p99 1.5 s"
        " <= 2, interactive tpot p95 0.05 s <= 0.2, interactive tpot p99 0.08 s <= 0.2"
        " (no SLO, not judged: lane batch)")
    assert {r.section for r in results} == {s.title for s in SPEC.sections}


# (item, [(evidence path, value)], text the evidence must show)
FAILURES = {
    "batch lane uncapped": ("limits_set", [("config.lanes.batch.max_running", None)],
                            "lanes.batch.max_running unset"),
    "no queue": ("limits_set", [("config.max_waiting_requests", 0)],
                 "max_waiting_requests 0 < 1"),
    "watermarks misordered": ("watermarks", [("config.kv_cache_high_watermark", 0.96)],
                              "kv_cache_high_watermark 0.96, kv_cache_reject_watermark 0.95"),
    "watermarks too close": ("watermarks", [("config.kv_cache_high_watermark", 0.945)],
                             "apart"),
    "chunk over budget": ("chunked_prefill", [("config.prefill_chunk_size", 8192)],
                          "prefill_chunk_size 8192 > max_num_batched_tokens 4096"),
    "unchunked budget under max_model_len": (
        "chunked_prefill", [("config.chunked_prefill", False)],
        "max_num_batched_tokens 4096 < max_model_len 8192"),
    "budget over the KV pool": ("budget_fits_kv", [("static.num_kv_blocks", 128)],
                                "max_num_batched_tokens 4096 > 2048 tokens (the KV pool)"),
    "interactive lane outweighed": ("lanes", [("config.lanes.interactive.weight", 0.5)],
                                    "lanes.interactive.weight 0.5 < 1 x lanes.long_context"),
    "metrics missing a family": ("metrics", [("metrics_text", metrics_text(
        drop="batchpilot_kv_usage_ratio"))], "batchpilot_kv_usage_ratio (used by"),
    "no load test": ("loadtest_run", [("loadtest_runs", []), ("loadtest_stats", [])],
                     "no load-test results stored in the trace of http://x"),
    "load test too small": ("loadtest_run", [("loadtest_runs.0.requests", 6)],
                            "sent 6"),
    "load test with no request answered": ("loadtest_run", [("loadtest_runs.0.ok", 0)],
                                           "sent 90, ok 0"),
    "fixed-length prompts only": ("real_lengths", [
        ("loadtest_stats.0.prompt_std", 0.0), ("loadtest_stats.0.prompt_min", 128),
        ("loadtest_stats.0.prompt_max", 128), ("loadtest_stats.0.prompt_mean", 128.0)],
        "prompt tokens all 128, CV 0"),
    "p99 over the lane's SLO": ("latency_slo", [
        ("loadtest_runs.0.summary.by_server_lane.interactive.ttft.p99", 3.5)],
        "run lt1 (scenario mixed) lane interactive ttft p99 3.5 s > 2 s"),
    "p99 over a target the spec sets for every lane": ("latency_slo", [
        ("items.latency_slo.tpot_s", 0.07)],
        "run lt1 (scenario mixed) lane interactive tpot p99 0.08 s > 0.07 s"),
    "p99 over the spec's fixed SLO": ("latency_slo", [
        ("items.latency_slo.targets", "fixed"), ("items.latency_slo.ttft_s", 2.0),
        ("loadtest_runs.0.summary.ttft.p99", 3.5)], "ttft p99 3.5 s > 2 s"),
    "server under-reports TTFT": ("latency_reconciled", [
        ("loadtest_runs.0.summary.ttft_gap.p99", 0.4)],
        "run lt1 (scenario mixed): TTFT gap p50 0.004 s, p99 0.4 s (70 requests) > 0.1 s"),
    "server under-reports E2E": ("latency_reconciled", [
        ("loadtest_runs.0.summary.e2e_gap.p99", 0.25)], "E2E gap p50 0.002 s, p99 0.25 s"),
    "long prompts stall decode": ("long_prompts", [("loadtest_runs.0.summary.itl.p99", 1.8)],
                                  "12 prompts of >= 512 tokens, 72 streamed; ITL p99 1.8 s"),
    "just min_long_prompts long prompts stall decode": ("long_prompts", [
        ("loadtest_stats.0.long_prompts", 3), ("loadtest_runs.0.summary.itl.p99", 1.8)],
        "3 prompts of >= 512 tokens, 72 streamed; ITL p99 1.8 s"),
    "cancellation leaked KV (trace)": (
        "cancellation_frees_kv", [("trace_facts.idle_after_cancel.kv_blocks_used", 7)],
        "trace step 480 (first with nothing running after the last cancel): kv_blocks_used 7"),
    "cancellation leaked KV (metrics)": (
        "cancellation_frees_kv", [("metrics_text", metrics_text(
            batchpilot_kv_blocks_used=3))], "/metrics now (nothing running or waiting):"
        " kv_blocks_used 3"),
    "device slowed since start-up": (
        "step_cost_steady", [("metrics_text", metrics_text(
            batchpilot_step_cost_drift_ratio=2.3, batchpilot_step_law_scale=2.1))],
        "served steps cost 2.3x what they did at start-up (limit 1.5x); the scheduler"
        " divides its step target by 2.1: the device got slower"),
    "no rollback in the history": ("rollback", [("history.2.source", "api")],
                                   "no rollback in the audit log (5 entries, sources: api,"
                                   " startup, whatif)"),
    "tracing off": ("tracing", [("trace_available", False), ("missing", {
        "trace": "the server answered 404: tracing is off: start the server with --trace-db"})],
        "tracing is off"),
}


@pytest.mark.parametrize("case", FAILURES, ids=str)
def test_each_reason_fails_its_item_and_shows_the_value(case):
    item_id, changes, shown = FAILURES[case]
    ev, params = good(), {}
    for path, value in changes:
        if path.startswith("items."):  # a parameter of the spec's item
            params[path.removeprefix(f"items.{item_id}.")] = value
        elif "." in path:
            set_evidence(ev, path, value)
        else:
            setattr(ev, path, value)
    results = evaluate(spec_with(item_id, **params) if params else SPEC, ev)
    got = next(r for r in results if r.id == item_id)
    assert got.status == "fail", got
    assert shown in got.evidence, got.evidence
    assert exit_code(results) == 1


def test_a_single_server_is_not_asked_for_the_fleet_ingress_series():
    """The boards' fleet series (routing, autoscaling) exist on an ingress's /metrics only:
    a single server passes without them; an ingress missing one fails, naming it."""
    ev = good()
    ev.metrics_text = "".join(line + "\n" for line in ev.metrics_text.splitlines()
                              if "batchpilot_fleet_" not in line)
    got = result(ev, "metrics")
    assert got.status == "pass", got.evidence
    assert "fleet ingress series not asked of a single server" in got.evidence
    ev.metrics_text = metrics_text(drop="batchpilot_fleet_scale_events_total",
                                   batchpilot_fleet_replica_healthy=1)  # an ingress's
    got = result(ev, "metrics")
    assert got.status == "fail" and "batchpilot_fleet_scale_events_total" in got.evidence


def test_no_interactive_lane_fails():
    ev = good()
    del ev.config["lanes"]["interactive"]
    got = result(ev, "lanes")
    assert got.status == "fail" and "no lane 'interactive' (lanes: long_context, batch)" \
        in got.evidence


def test_slos_are_shown_and_a_lane_without_targets_or_fixed_steps_fail():
    got = result(good(), "slo_set")
    assert got.status == "pass"
    assert "interactive TTFT 1 s, TPOT 0.1 s; long_context no SLO" in got.evidence
    ev = good()
    ev.config["lanes"]["interactive"]["slo"] = None  # the default: no targets
    got = result(ev, "slo_set")
    assert got.status == "fail" and "lanes.interactive.slo has no ttft_s" in got.evidence
    ev = good()
    ev.config["default_slo"] = {"ttft_s": 2.0, "tpot_s": 0.3}
    ev.config["lanes"]["interactive"]["slo"] = None
    ev.config["step_policy"] = "fixed"
    got = result(ev, "slo_set")
    assert got.status == "fail" and "interactive TTFT 2 s, TPOT 0.3 s" in got.evidence
    assert "step_policy fixed (not goodput)" in got.evidence


def test_the_playbooks_serving_config_sets_the_slos_the_checklist_asks_for():
    """playbooks/serving.yaml, the production starting point, once set no SLO on its lanes:
    under the default goodput policy its server sized steps for nothing and shed nothing,
    and its own go-live checklist failed it."""
    loaded = load_config_file(ROOT / "playbooks" / "serving.yaml")
    ev = good()
    ev.config = live_to_dict(loaded.config.live)
    got = result(ev, "slo_set")
    assert got.status == "pass", got.evidence
    assert "interactive TTFT 5 s, TPOT 0.5 s; long_context TTFT 30 s, TPOT 1 s" in got.evidence


def grafana_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "grafana", tmp_path / "grafana")
    return tmp_path


def test_grafana_files_missing_fail_boards_and_alerts(tmp_path):
    ev = dataclasses.replace(good(), repo_root=tmp_path)
    assert result(ev, "grafana_boards").evidence.startswith("grafana/dashboards/ does not")
    assert result(ev, "alert_rules").status == "fail"
    assert "grafana/alerts.yml does not exist" in result(ev, "alert_rules").evidence
    (grafana_copy(tmp_path) / "grafana/dashboards/scheduler.json").unlink()
    got = result(ev, "grafana_boards")
    assert got.status == "fail" and got.evidence == "grafana/dashboards/scheduler.json missing"


def test_an_alert_missing_fails_naming_it(tmp_path):
    alerts = grafana_copy(tmp_path) / "grafana/alerts.yml"
    rules = yaml.safe_load(alerts.read_text())
    for group in rules["groups"]:
        group["rules"] = [r for r in group["rules"] if r.get("alert") != "BatchpilotEngineStalled"]
    alerts.write_text(yaml.safe_dump(rules))
    got = result(dataclasses.replace(good(), repo_root=tmp_path), "alert_rules")
    assert got.status == "fail"
    assert "lacks 1 required alert(s): engine_stalled (BatchpilotEngineStalled)" in got.evidence


NEEDS = {
    # file mode: the trace told the budgets and watermarks, not the queue limits
    "partial config": ("limits_set", lambda ev: setattr(ev, "config", {
        "max_num_seqs": 8, "max_num_batched_tokens": 512,
        "lanes": {"interactive": {}, "batch": {}}}),
        "not known: max_waiting_requests, queue_timeout_ms, lanes.batch.max_running"),
    "no metrics": ("metrics", lambda ev: (setattr(ev, "metrics_text", None), ev.missing.update(
        metrics="no server to ask (--url): /metrics not read")), "/metrics not read"),
    "no load-test source": ("latency_slo", lambda ev: (
        setattr(ev, "loadtest_runs", []), setattr(ev, "loadtest_from", ""),
        ev.missing.update(loadtest="tracing is off")), "tracing is off"),
    "no streamed requests": ("latency_slo", lambda ev: ev.loadtest_runs[0].update(
        summary={"ttft": {}, "tpot": {}, "by_server_lane": {"interactive": {
            "ttft": {}, "tpot": {}, "slo": {"by_lane": {"interactive": {"ttft_s": 2.0}}}}}}),
        "nothing measured"),
    "a run stored before lanes were recorded": ("latency_slo", lambda ev: ev.loadtest_runs[
        0]["summary"].pop("by_server_lane"), "run it again, or set params.targets: fixed"),
    "a server that reports no lane": ("latency_slo", lambda ev: ev.loadtest_runs[0][
        "summary"].update(by_server_lane={}), "not a batchpilot server?"),
    "no lane with an SLO": ("latency_slo", lambda ev: ev.loadtest_runs[0]["summary"][
        "by_server_lane"]["interactive"].update(slo={"by_lane": {"interactive": {
            "ttft_s": None, "tpot_s": None}}}),
        "no SLO on the lanes it ran in (batch, interactive): set one (item slo_set"),
    "no server timing in the results": ("latency_reconciled", lambda ev: [
        ev.loadtest_runs[0]["summary"].pop(g) for g in ("ttft_gap", "e2e_gap")],
        "no stored load-test run carries the server's timing"),
    "no load-test results for the gap": ("latency_reconciled", lambda ev: (
        setattr(ev, "loadtest_runs", []), setattr(ev, "loadtest_from", ""),
        ev.missing.update(loadtest="tracing is off")), "tracing is off"),
    "no long prompts": ("long_prompts", lambda ev: ev.loadtest_stats[0].update(
        long_prompts=0), "chat-long-prompts.yaml"),
    "nothing cancelled": ("cancellation_frees_kv", lambda ev: (
        ev.trace_facts.update(cancelled=0), ev.loadtest_stats[0].update(cancelled=0)),
        "0 cancelled request(s) in the trace, 0 in load tests"),
    "never idle after cancelling": ("cancellation_frees_kv", lambda ev: (
        ev.trace_facts.update(idle_after_cancel=None),
        setattr(ev, "metrics_text", metrics_text(batchpilot_running_requests=2))),
        "no moment with nothing running"),
    "no drift reading yet": ("step_cost_steady", lambda ev: setattr(
        ev, "metrics_text", metrics_text(batchpilot_step_cost_drift_ratio=math.nan)),
        "step law scale 1, but no drift reading yet"),
    "no audit log": ("rollback", lambda ev: (
        setattr(ev, "history", None), setattr(ev, "config_changes", None),
        ev.missing.update(history="GET /control/history answered 404")), "answered 404"),
}


@pytest.mark.parametrize("case", NEEDS, ids=str)
def test_missing_evidence_is_needs_evidence_saying_what_is_missing(case):
    item_id, change, shown = NEEDS[case]
    ev = good()
    change(ev)
    results = evaluate(SPEC, ev)
    got = next(r for r in results if r.id == item_id)
    assert got.status == "needs-evidence", got
    assert shown in got.evidence, got.evidence
    assert exit_code(results) == 0 and exit_code(results, strict=True) == 1


def test_a_rollback_found_only_in_the_trace_counts():
    ev = good()
    ev.history = None
    ev.config_changes = [{"time": 5.0, "version": 7, "source": "rollback:5", "actor": "bob",
                          "change": "{}", "note": "drill"}]
    got = result(ev, "rollback")
    assert got.status == "pass" and "version 7 (rollback:5)" in got.evidence
    assert "[trace config_changes]" in got.evidence


ITEM = {"id": "x", "title": "X", "why": "because", "check": "watermarks_ordered"}


def test_gap_thresholds_come_from_the_spec():
    ev = good()
    ev.loadtest_runs[0]["summary"]["ttft_gap"]["p99"] = 0.4

    def decide(**params):
        spec = parse_spec({"sections": [{"id": "s", "title": "S", "items": [
            {**ITEM, "check": "latency_reconciled", "params": params}]}]})
        return evaluate(spec, ev)[0]

    assert decide().status == "fail"  # the default: 0.1 s
    assert decide(ttft_gap_p99_s=0.5).status == "pass"
    off = decide(ttft_gap_p99_s=None)
    assert off.status == "pass" and "TTFT" not in off.evidence
    ev.loadtest_runs[0]["summary"]["ttft_gap"] = {"count": 0}  # nothing streamed
    got = decide()
    assert got.status == "pass" and got.evidence.endswith("(not measured: TTFT gap)")


def test_markdown_and_text_reports():
    ev = good()
    ev.config["prefill_chunk_size"] = 8192
    ev.metrics_text = None
    results = evaluate(SPEC, ev)
    md = to_markdown(results, source="http://x")
    assert md.startswith("# Go-live checklist\n\nEvidence from http://x.")
    assert "**16 pass, 1 fail, 2 need evidence (19 items): NOT ready: items fail**" in md
    assert md.count("| | Item | Status | Evidence |") == len(SPEC.sections)
    assert "## Capacity and configuration" in md and "## Rollout and rollback" in md
    assert "| ❌ | **Chunked prefill decided** (`chunked_prefill`)<br>Either" in md
    assert "| ❔ |" in md
    text = to_text(results, ascii_only=True)
    assert "  x FAIL           chunked_prefill" in text
    assert "  ? needs-evidence metrics " in text
    assert text.splitlines()[-1].startswith("16 pass, 1 fail, 2 need evidence")


def test_an_interactive_lane_weighing_exactly_the_ratio_passes():
    ev = good()  # interactive 4, long_context 2, batch 1
    set_evidence(ev, "config.lanes.interactive.weight", 2.0)
    assert result(ev, "lanes").status == "pass"  # 2 == 1 x 2: not below
    got = result(ev, "lanes", spec_with("lanes", min_weight_ratio=1.5))
    assert got.status == "fail" and "2 < 1.5 x lanes.long_context.weight 2" in got.evidence


def test_latency_is_judged_on_the_latest_run_only():
    """An older run over its SLO is history, not the deployment's latency now: the latest
    run (its every config) decides."""
    ev = good()
    old = copy.deepcopy(ev.loadtest_runs[0])
    old.update(run_id="lt0", started=0.5)
    old["summary"]["by_server_lane"]["interactive"]["ttft"]["p99"] = 9.0
    ev.loadtest_runs.append(old)  # newest first, as the evidence is gathered
    got = result(ev, "latency_slo")
    assert got.status == "pass" and "lt0" not in got.evidence, got.evidence
    ev.loadtest_runs.reverse()  # were it the latest, it would fail
    got = result(ev, "latency_slo")
    assert got.status == "fail" and "run lt0 (scenario mixed) lane interactive ttft p99 9 s" \
        in got.evidence


def test_a_malformed_evidence_row_is_needs_evidence_not_a_crash():
    """A stored load-test run missing a column: that item says it could not decide, and the
    rest of the checklist is still decided."""
    ev = good()
    del ev.loadtest_runs[0]["requests"]
    results = evaluate(SPEC, ev)
    got = next(r for r in results if r.id == "loadtest_run")
    assert got.status == "needs-evidence"
    assert got.evidence.startswith("could not decide from the evidence given: KeyError")
    assert next(r for r in results if r.id == "tracing").status == "pass"


def test_the_boards_panel_count_leaves_out_their_rows():
    import json

    got = result(good(), "grafana_boards")
    for name in ("overview.json", "scheduler.json"):
        panels = json.loads((ROOT / "grafana/dashboards" / name).read_text())["panels"]
        rows = sum(p["type"] == "row" for p in panels)
        assert rows > 0  # else this test shows nothing
        assert f"{name} ({len(panels) - rows} panels)" in got.evidence, got.evidence


def test_a_recording_rule_beside_the_alerts_is_not_a_broken_rules_file(tmp_path):
    alerts = grafana_copy(tmp_path) / "grafana/alerts.yml"
    rules = yaml.safe_load(alerts.read_text())
    rules["groups"].append({"name": "recorded", "rules": [
        {"record": "batchpilot:ttft:p99", "expr": "histogram_quantile(0.99, x)"}]})
    alerts.write_text(yaml.safe_dump(rules))
    got = result(dataclasses.replace(good(), repo_root=tmp_path), "alert_rules")
    assert got.status == "pass", got.evidence


def test_a_gauge_is_summed_over_its_labels():
    from control.checklist.checks_ops import gauge_sum

    text = ('batchpilot_kv_blocks_cached{model="m",replica="0"} 5.0\n'
            'batchpilot_kv_blocks_cached{model="m",replica="1"} 7.0\n')
    assert gauge_sum(text, "batchpilot_kv_blocks_cached") == 12.0
    assert gauge_sum(text, "batchpilot_kv_blocks_used") is None


def test_a_series_the_spec_requires_is_looked_for_too():
    """params.required: series no board queries yet (a new alert's), asked of /metrics."""
    spec = spec_with("metrics", required=["batchpilot_not_exported_total"])
    got = result(good(), "metrics", spec)
    assert got.status == "fail"
    assert "batchpilot_not_exported_total (used by the checklist spec)" in got.evidence
