"""The config a trace file tells (control/checklist/trace_config.py): the run's settings
with its config changes replayed over them, a lane removed by a change included."""

from __future__ import annotations

import json

from control.checklist.trace_config import config_from_trace


def test_a_lane_removed_by_a_replayed_change_is_gone_from_the_config():
    lanes = {"interactive": {"ttft_s": 0.5}, "batch": {"ttft_s": 30.0}}
    facts = {"run": {"run_id": "r1", "started": 100.0,
                     "settings": json.dumps({"engine_overrides": {"lanes": lanes}})}}
    changes = [{"time": 150.0, "source": "api", "version": 2,
                "change": json.dumps({"lanes.batch": [lanes["batch"], None],
                                      "lanes.interactive.ttft_s": [0.5, 0.4]})}]
    config, _, where = config_from_trace(facts, changes)
    assert config["lanes"] == {"interactive": {"ttft_s": 0.4}}
    assert "2 config change(s) replayed" in where
