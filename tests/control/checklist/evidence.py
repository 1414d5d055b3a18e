"""The go-live checklist tests' evidence: a deployment that did everything the checklist asks
(`good`), and ways to change one field of it or of the default spec."""

from __future__ import annotations

from pathlib import Path

import yaml

from control.checklist import DEFAULT_SPEC, Evidence, evaluate, load_spec
from control.checklist.checks_ops import grafana_series
from control.checklist.spec import parse_spec
from engine.config import LaneConfig, LaneSLO, LiveConfig
from engine.config.patch import live_to_dict

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_spec(DEFAULT_SPEC)
GRAFANA_PARAMS = {"dashboards_dir": "grafana/dashboards", "alerts_file": "grafana/alerts.yml"}


def metrics_text(drop: str = "", **gauges: float) -> str:
    """An exposition with every series the Grafana files query, and idle gauges."""
    values = {"batchpilot_running_requests": 0, "batchpilot_waiting_requests": 0,
              "batchpilot_kv_blocks_used": 0, "batchpilot_kv_blocks_cached": 5, **gauges}
    lines = []
    for name in sorted(set(grafana_series(ROOT, GRAFANA_PARAMS)) | set(values)):
        if name != drop:
            lines += [f"# TYPE {name} gauge", f'{name}{{model="m"}} {values.get(name, 1)}']
    return "\n".join(lines) + "\n"


def good() -> Evidence:
    """A deployment that did everything the checklist asks."""
    lanes = (LaneConfig("interactive", weight=4.0, policy="priority",
                        slo=LaneSLO(ttft_s=1.0, tpot_s=0.1)),
             LaneConfig("long_context", weight=2.0),
             LaneConfig("batch", weight=1.0, max_running=16, preempt_first=True))
    live = LiveConfig(max_num_seqs=64, max_num_batched_tokens=4096, prefill_chunk_size=1024,
                      lanes=lanes)
    summary = {"ttft": {"p95": 0.8, "p99": 1.5}, "tpot": {"p95": 0.05, "p99": 0.08},
               "itl": {"p99": 0.12}, "e2e": {"p95": 9.0, "p99": 12.0},
               "ttft_gap": {"count": 70, "p50": 0.004, "p99": 0.03},
               "e2e_gap": {"count": 84, "p50": 0.002, "p99": 0.02}}
    # each lane the server ran requests in, with the SLO it reported for it (targets: lanes)
    summary["by_server_lane"] = {
        "interactive": {"ttft": {"p95": 0.8, "p99": 1.5}, "tpot": {"p95": 0.05, "p99": 0.08},
                        "slo": {"by_lane": {"interactive": {"ttft_s": 2.0, "tpot_s": 0.2,
                                                            "e2e_s": None}}}},
        "batch": {"ttft": {"p95": 30.0, "p99": 41.0}, "tpot": {"p95": 0.9, "p99": 1.2},
                  "slo": {"by_lane": {}}}}
    return Evidence(
        config=live_to_dict(live), config_from="GET /control/config, version 3",
        static={"block_size": 16, "num_kv_blocks": 2048, "max_model_len": 8192},
        history=[{"version": 1, "time": 1000.0, "actor": "server", "source": "startup"},
                 {"version": 2, "time": 1100.0, "actor": "ops", "source": "api"},
                 {"version": 3, "time": 1200.0, "actor": "ops", "source": "rollback:1",
                  "reason": "drill"}],
        config_changes=[  # version 2 was predicted (POST /v1/whatif) before it was made
            {"time": 1050.0, "version": 1, "source": "whatif", "actor": "ops",
             "change": '{"max_num_seqs": [32, 64]}', "note": "what-if 'proposed'"},
            {"time": 1100.0, "version": 2, "source": "api", "actor": "ops",
             "change": '{"max_num_seqs": [32, 64]}', "note": "tuning"}],
        metrics_text=metrics_text(), trace_available=True,
        trace_from="the trace of http://x",
        trace_facts={"run": {"run_id": "r1"}, "last_step": {"step_id": 500}, "cancelled": 4,
                     "idle_after_cancel": {"step_id": 480, "kv_blocks_used": 0,
                                           "kv_blocks_cached": 12}},
        loadtest_runs=[{"run_id": "lt1", "label": "", "scenario": "mixed", "started": 1.0,
                        "requests": 90, "ok": 84, "summary": summary}],
        loadtest_stats=[{"run_id": "lt1", "label": "", "requests": 90, "streamed": 72,
                         "cancelled": 4, "prompt_mean": 300.0, "prompt_std": 210.0,
                         "prompt_min": 8, "prompt_max": 1000, "output_mean": 28.0,
                         "output_std": 11.0, "output_min": 8, "output_max": 48,
                         "long_prompts": 12, "first_sent": 1.0}],
        loadtest_from="the trace of http://x", repo_root=ROOT)


def spec_with(item_id: str, **params):
    """The default spec with these params of one item changed, loaded as a file would be."""
    data = yaml.safe_load(Path(DEFAULT_SPEC).read_text())
    for section in data["sections"]:
        for item in section["items"]:
            if item["id"] == item_id:
                item["params"] = {**item.get("params", {}), **params}
    return parse_spec(data)


def result(ev: Evidence, item_id: str, spec=SPEC):
    return next(r for r in evaluate(spec, ev) if r.id == item_id)


def set_evidence(ev: Evidence, path: str, value) -> None:
    """Set one field of `ev` by a dotted path ("config.lanes.batch.max_running", list
    indices as numbers)."""
    keys = path.split(".")
    node = getattr(ev, keys[0])
    for key in keys[1:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[keys[-1]] = value
