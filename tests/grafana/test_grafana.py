"""grafana/: the alert rules pass promtool and fire (and stay quiet) on the series they
are about; the boards' JSON is consistent (datasource, variables, ids, units); the
provisioning and compose files point at files that exist.

The boards' and rules' queries against a real Prometheus: test_grafana_live.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from fixtures.grafana import BOARDS, DS_UID, GRAFANA, binary, board_queries

BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
VAR_RE = re.compile(r"\$\{?(\w+)")


def datasource_uids(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["datasource"].get("uid")] if isinstance(node.get("datasource"),
                                                            dict) else []
        return own + [u for v in node.values() for u in datasource_uids(v)]
    if isinstance(node, list):
        return [u for v in node for u in datasource_uids(v)]
    return []


def test_promtool_checks_the_rules():
    result = subprocess.run([binary("promtool"), "check", "rules", str(GRAFANA / "alerts.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_board_is_consistent(path):
    board = json.loads(path.read_text())
    assert board["schemaVersion"] >= 39 and board["uid"].startswith("batchpilot-")
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in panels:
        if p["type"] == "row":
            assert not p.get("targets") and p["gridPos"]["w"] == 24, p["title"]
            continue
        assert p["type"] in ("timeseries", "stat"), p["title"]
        assert p["title"] and p["description"], p["id"]
        assert p["fieldConfig"]["defaults"]["unit"], f"{p['title']!r} has no unit"
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    uids = datasource_uids(board)
    assert uids and set(uids) == {DS_UID}
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"model", "replica", "lane", "tenant"}
    for v in variables.values():
        assert v["includeAll"] and v["allValue"] == ".*", v["name"]
        assert v["query"].startswith("label_values("), v["name"]
    used = set()
    for where, expr in board_queries(board):
        names = set(VAR_RE.findall(expr))
        assert names <= set(variables) | BUILTIN_VARS, (where, names)
        used |= names
        for name in names & set(variables):  # every variable selects with a regex match
            assert re.search(rf'\w+=~"\${name}"', expr), (where, expr)
    assert set(variables) <= used, "a variable no query uses"


def _compose() -> dict:
    return yaml.safe_load((GRAFANA / "docker-compose.yml").read_text())


def _host_path(service: dict, container_path: str) -> Path:
    """The file on this machine that a compose service sees at container_path."""
    mounts = [v.split(":")[:2] for v in service["volumes"] if v.startswith("./")]
    best = max((m for m in mounts if container_path == m[1]
                or container_path.startswith(m[1].rstrip("/") + "/")),
               key=lambda m: len(m[1]), default=None)
    assert best is not None, f"{container_path} is not mounted from the repository"
    return (GRAFANA / best[0]) / Path(container_path).relative_to(best[1])


def test_provisioning_and_compose_point_at_real_files(tmp_path):
    services = _compose()["services"]
    grafana, prometheus = services["grafana"], services["prometheus"]
    for service in (grafana, prometheus):
        for volume in service["volumes"]:
            if volume.startswith("./"):
                assert (GRAFANA / volume.split(":")[0]).exists(), volume
    provisioning = GRAFANA / "provisioning"
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "batchpilot.yml").read_text())["providers"]
    assert provider["type"] == "file"
    folder = _host_path(grafana, provider["options"]["path"])
    assert sorted(folder.glob("*.json")) == BOARDS and len(BOARDS) == 2
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert _host_path(grafana, home).is_file()
    (source,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["uid"] == DS_UID and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "9090:9090" in prometheus["ports"]
    # prometheus.yml as the container reads it: rule files mapped to this machine
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert _host_path(prometheus, "/etc/prometheus/prometheus.yml").samefile(
        GRAFANA / "prometheus.yml")
    rules = [_host_path(prometheus, p) for p in config["rule_files"]]
    assert [p.resolve() for p in rules] == [(GRAFANA / "alerts.yml").resolve()]
    config["rule_files"] = [str(p) for p in rules]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    result = subprocess.run([binary("promtool"), "check", "config", str(local)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "host.docker.internal:host-gateway" in prometheus["extra_hosts"]
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["host.docker.internal:8000"]


def test_latency_panels_show_exemplars_that_link_to_the_trace():
    """Each latency panel's p99 query asks for exemplars; Prometheus stores them; the data
    source links an exemplar's trace_id to the compose file's Jaeger (its OTLP ports are
    the ones docs/opentelemetry.md tells `batchpilot serve` to export to)."""
    board = json.loads((GRAFANA / "dashboards" / "overview.json").read_text())
    latency = {"Time to first token (TTFT)", "Time per output token (TPOT)",
               "End-to-end latency", "Queue delay"}
    panels = [p for p in board["panels"] if p["title"] in latency]
    assert len(panels) == len(latency)
    for panel in panels:
        marked = [t for t in panel["targets"] if t.get("exemplar")]
        assert [t["refId"] for t in marked] == ["C"] and "0.99" in marked[0]["expr"], panel
    services = _compose()["services"]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    (source,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" /
                                "prometheus.yml").read_text())["datasources"]
    (link,) = source["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id"  # the exemplar label batchpilot writes
    ui = link["url"].split("/trace/")[0].rsplit(":", 1)[1]
    jaeger = services["jaeger"]
    assert f"{ui}:{ui}" in jaeger["ports"] and "4318:4318" in jaeger["ports"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_every_rule_has_severity_for_and_a_runbook():
    groups = yaml.safe_load((GRAFANA / "alerts.yml").read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 6
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert re.fullmatch(r"\d+[sm]", rule["for"]), name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert re.fullmatch(r"playbooks/runbooks/[a-z-]+\.md", notes["runbook_url"]), name


# ---- the alerts fire on the series they are about (promtool unit tests, 1m samples) ----
A = 'job="batchpilot", instance="a:8000", model="m"'  # a server in trouble
B = 'job="batchpilot", instance="b:8000", model="m"'  # a healthy one, or one not in scope
WHO = {"job": "batchpilot", "instance": "a:8000", "model": "m"}
TTFT = "batchpilot_time_to_first_token_seconds"
REQ = "batchpilot_requests_total"
SERIES = {  # alert -> (input series {labels} -> values, extra labels of the alert on A)
    "BatchpilotTTFTAboveSLO": ({
        # lane interactive on A: every request over 2.5 s; B's interactive lane under 1 s;
        # A's batch lane as slow as interactive, but batch has no TTFT SLO
        **{f'{TTFT}_bucket{{{who}, lane="{lane}", tenant="t", le="{le}"}}': values
           for who, lane, slow in ((A, "interactive", True), (B, "interactive", False),
                                   (A, "batch", True))
           for le, values in (("1.0", "0+0x20" if slow else "0+60x20"),
                              ("2.5", "0+0x20" if slow else "0+60x20"),
                              ("+Inf", "0+60x20"))},
        **{f'{TTFT}_count{{{who}, lane="{lane}", tenant="t"}}': "0+60x20"
           for who, lane in ((A, "interactive"), (B, "interactive"), (A, "batch"))},
    }, {"lane": "interactive"}),
    "BatchpilotCancelOrTimeoutSpike": ({
        f'{REQ}{{{A}, lane="chat", tenant="t", outcome="finished", reason="stop"}}': "0+60x20",
        f'{REQ}{{{A}, lane="chat", tenant="t", outcome="cancelled", '
        'reason="client_disconnected"}': "0+20x20",
        f'{REQ}{{{B}, lane="chat", tenant="t", outcome="finished", reason="stop"}}': "0+60x20",
        f'{REQ}{{{B}, lane="chat", tenant="t", outcome="cancelled", '
        'reason="server_shutting_down"}': "0+20x20",
    }, {"lane": "chat"}),
    "BatchpilotRejectionStorm": ({
        f'{REQ}{{{A}, lane="chat", tenant="t", outcome="finished", reason="stop"}}': "0+60x20",
        f'{REQ}{{{A}, lane="chat", tenant="t", outcome="rejected", reason="queue_full"}}':
            "0+30x20",
        f'{REQ}{{{B}, lane="chat", tenant="t", outcome="finished", reason="stop"}}': "0+60x20",
        f'{REQ}{{{B}, lane="chat", tenant="t", outcome="rejected", reason="too_long"}}':
            "0+30x20",
    }, {"lane": "chat"}),
    "BatchpilotKVNearRejectWatermark": ({
        f"batchpilot_kv_usage_ratio{{{A}}}": "0.93x20",
        f"batchpilot_kv_usage_ratio{{{B}}}": "0.5x20",
        f"batchpilot_config_kv_cache_reject_watermark_ratio{{{A}}}": "0.95x20",
        f"batchpilot_config_kv_cache_reject_watermark_ratio{{{B}}}": "0.95x20",
    }, {}),
    "BatchpilotKVHeldWhileIdle": ({
        f"batchpilot_kv_blocks_used{{{A}}}": "12x20",
        f"batchpilot_kv_blocks_used{{{B}}}": "12x20",
        f'batchpilot_running_requests{{{A}, lane="chat"}}': "0x20",
        f'batchpilot_running_requests{{{B}, lane="chat"}}': "1x20",
        f'batchpilot_waiting_requests{{{A}, lane="chat"}}': "0x20",
        f'batchpilot_waiting_requests{{{B}, lane="chat"}}': "0x20",
    }, {}),
    "BatchpilotEngineStalled": ({
        f'batchpilot_waiting_requests{{{A}, lane="chat"}}': "3x20",
        f'batchpilot_waiting_requests{{{B}, lane="chat"}}': "3x20",
        f'batchpilot_running_requests{{{A}, lane="chat"}}': "0x20",
        f'batchpilot_running_requests{{{B}, lane="chat"}}': "0x20",
        f"batchpilot_engine_steps_total{{{A}}}": "100x20",
        f"batchpilot_engine_steps_total{{{B}}}": "100+600x20",
    }, {}),
    "BatchpilotStepCostDrift": ({
        f"batchpilot_step_cost_drift_ratio{{{A}}}": "1x5 2.1x15",
        f"batchpilot_step_cost_drift_ratio{{{B}}}": "1.4x20",  # noisy, under the share
    }, {}),
    "BatchpilotDown": ({
        'up{job="batchpilot", instance="a:8000"}': "0x20",
        'up{job="batchpilot", instance="b:8000"}': "1x20",
    }, {"model": None}),
    "BatchpilotTraceRecordsDropped": ({
        f'batchpilot_trace_records_dropped_total{{{A}, table="steps"}}': "0x13 5x6",
        f'batchpilot_trace_records_dropped_total{{{A}, table="requests"}}': "0x20",
    }, {"table": "steps"}),
    "BatchpilotObserverErrors": ({
        f"batchpilot_observer_errors_engine_thread_total{{{A}}}": "0x13 1x6",
        f"batchpilot_metrics_records_dropped_total{{{B}}}": "0x20",
    }, {}),
}


def _unit_test(alert: str, rules: Path) -> dict:
    series, extra = SERIES[alert]
    rule = next(r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
                if r["alert"] == alert)
    labels = {k: v for k, v in {**WHO, **extra, "severity": rule["labels"]["severity"]}
              .items() if v is not None}
    return {"interval": "1m", "name": alert,
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{"eval_time": "1m", "alertname": alert, "exp_alerts": []},
                                {"eval_time": "16m", "alertname": alert,
                                 "exp_alerts": [{"exp_labels": labels}]}]}


def test_each_alert_fires_on_its_trouble_only(tmp_path):
    """At 16 min each alert fires for server A (in trouble) and not for B; at 1 min its
    `for:` still holds it back. Annotations are left out (promtool would compare their
    rendered text); `promtool check rules` has parsed their templates."""
    source = yaml.safe_load((GRAFANA / "alerts.yml").read_text())
    alerts = {r["alert"] for g in source["groups"] for r in g["rules"]}
    assert alerts == set(SERIES), "a rule without a unit test, or a test without a rule"
    for group in source["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(source))
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": "1m",
        "tests": [_unit_test(alert, rules) for alert in sorted(SERIES)]}))
    result = subprocess.run([binary("promtool"), "test", "rules", str(tests)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
