"""Checks on monitoring and alerting: every series the Grafana boards and alert rules
query is exported on /metrics, the boards and the required alert rules exist in the
repository (grafana/), and the scheduler trace is on."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from control.checklist.evidence import Evidence
from control.checklist.registry import register
from control.checklist.result import Verdict, failed, needs, passed

SERIES_RE = re.compile(r"\bbatchpilot_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                             "_created"),
            "summary": ("_count", "_sum", "_created"), "gauge": (), "info": ("_info",)}


# ---- /metrics --------------------------------------------------------------------------
def exported_series(text: str) -> set[str]:
    """Every series name /metrics exports or declares (a family with no sample yet, e.g. a
    counter no request has labelled, still counts: its # TYPE line is there)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                base = parts[2].removesuffix("_total") if parts[3] == "counter" else parts[2]
                names |= {base, parts[2], *(base + s for s in SUFFIXES.get(parts[3], ()))}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


FLEET_PREFIX = "batchpilot_fleet_"
INGRESS_SERIES = "batchpilot_fleet_replica_healthy"  # control/fleet/metrics_merge.py


def gauge_sum(text: str, name: str) -> float | None:
    """The sum over labels of a gauge's samples; None when it is not exported."""
    values = [float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+(\S+)", text, re.MULTILINE)]
    return sum(values) if values else None


def grafana_series(root: Path, p: dict[str, Any]) -> dict[str, list[str]]:
    """batchpilot_ series name -> the Grafana files that query it."""
    used: dict[str, list[str]] = {}
    files = sorted((root / p["dashboards_dir"]).glob("*.json")) + [root / p["alerts_file"]]
    for path in files:
        if path.is_file():
            for name in sorted(set(SERIES_RE.findall(path.read_text(errors="replace")))):
                used.setdefault(name, []).append(os.path.relpath(path, root))
    return used


@register("metrics_present", required=[], dashboards_dir="grafana/dashboards",
          alerts_file="grafana/alerts.yml")
def metrics_present(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if ev.metrics_text is None:
        return needs(ev.missing.get("metrics", "/metrics was not read") + ": run with --url")
    used = grafana_series(ev.repo_root, p)
    for name in p["required"]:
        used.setdefault(name, []).append("the checklist spec")
    if not used:
        return needs(f"no series to look for: no Grafana files under {ev.repo_root} and no"
                     " `required` list in the spec")
    exported = exported_series(ev.metrics_text)
    # a fleet ingress's own series (routing, autoscaling) exist only on an ingress's
    # /metrics (which always has INGRESS_SERIES): a single server is not asked for them
    fleet = INGRESS_SERIES in exported
    skipped = [] if fleet else sorted(n for n in used if n.startswith(FLEET_PREFIX))
    absent = sorted(name for name in used if name not in exported and name not in skipped)
    if absent:
        shown = "; ".join(f"{n} (used by {', '.join(used[n])})" for n in absent)
        return failed(f"{len(absent)} of {len(used)} series not on /metrics: {shown}",
                      absent=absent)
    note = (f" ({len(skipped)} fleet ingress series not asked of a single server)"
            if skipped else "")
    return passed(f"all {len(used) - len(skipped)} batchpilot_ series the boards and alerts"
                  f" query are on /metrics{note}", series=sorted(used), skipped=skipped)


@register("grafana_boards", dashboards_dir="grafana/dashboards",
          boards=["overview.json", "scheduler.json"])
def grafana_boards(ev: Evidence, p: dict[str, Any]) -> Verdict:
    folder = ev.repo_root / p["dashboards_dir"]
    if not folder.is_dir():
        return failed(f"{p['dashboards_dir']}/ does not exist under {ev.repo_root}")
    found, problems = [], []
    for name in p["boards"]:
        path = folder / name
        if not path.is_file():
            problems.append(f"{p['dashboards_dir']}/{name} missing")
            continue
        try:
            panels = [x for x in json.loads(path.read_text())["panels"] if x["type"] != "row"]
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{name} is not a Grafana board ({type(exc).__name__}: {exc})")
            continue
        found.append(f"{name} ({len(panels)} panels)")
    if problems:
        return failed("; ".join(problems), problems=problems)
    return passed(f"{p['dashboards_dir']}: {', '.join(found)}", boards=p["boards"])


@register("alert_rules", alerts_file="grafana/alerts.yml", alerts={})
def alert_rules(ev: Evidence, p: dict[str, Any]) -> Verdict:
    path = ev.repo_root / p["alerts_file"]
    if not path.is_file():
        return failed(f"{p['alerts_file']} does not exist under {ev.repo_root}")
    try:
        groups = yaml.safe_load(path.read_text())["groups"]
        rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        return failed(f"{p['alerts_file']} is not a Prometheus rules file"
                      f" ({type(exc).__name__}: {exc})")
    absent = {purpose: name for purpose, name in p["alerts"].items() if name not in rules}
    if absent:
        shown = ", ".join(f"{purpose} ({name})" for purpose, name in absent.items())
        return failed(f"{p['alerts_file']} lacks {len(absent)} required alert(s): {shown}"
                      f" (it has: {', '.join(rules) or 'none'})", absent=absent)
    return passed(f"{p['alerts_file']}: all {len(p['alerts'])} required alerts among"
                  f" {len(rules)} rules: " + ", ".join(p["alerts"].values()),
                  alerts=sorted(rules))


@register("tracing_on")
def tracing_on(ev: Evidence, p: dict[str, Any]) -> Verdict:
    if ev.trace_available:
        step = (ev.trace_facts or {}).get("last_step") or {}
        run = (ev.trace_facts or {}).get("run") or {}
        return passed(f"{ev.trace_from}: run {run.get('run_id', '?')}, last step"
                      f" {step.get('step_id', 'none yet')}")
    why = ev.missing.get("trace", "no trace was read")
    if "tracing is off" in why:
        return failed(f"{why}: without it no postmortem can say why a request was slow")
    return needs(why)
