"""`batchpilot ctl` with a fleet's canary (against the stand-in control API, fake_control.py):
what it sends, what it shows while the canary runs, and its exit code for the decision."""

from __future__ import annotations

import json
from typing import Any

SIDE = {"replicas": [0], "requests": 12, "ttft_p99_s": 0.4, "tpot_p99_s": 0.02,
        "error_rate": 0.0, "goodput_share": 1.0}


def canary_run(status: str, polls: int) -> dict[str, Any]:
    return {"canary_id": "canary-3", "version": 8, "base_version": 7, "status": status,
            "watch_s": 60.0, "poll_s": 5.0, "diff": {"max_num_seqs": [128, 64]},
            "canaries": [0], "baseline": [1, 2],
            "polls": [{"time": float(i), "elapsed_s": 10.0 * i, "canary": SIDE,
                       "baseline": SIDE, "decision": f"continue-{i}", "why": "watching",
                       "checks": []} for i in range(1, polls + 1)],
            "decision": None if status == "watching" else {
                "why": "regression: ttft_p99_s", "canary": SIDE, "baseline": SIDE,
                "fleet_version": 7, "checks": []}}


def test_following_a_canary_that_rolled_back_exits_4(fake, ctl):
    """A pipeline gates on the exit code: a rolled-back change is not a success."""
    fake.answers[("GET", "/control/canary")] = (200, {"canary": canary_run("rolled_back", 2)})
    code, out, _ = ctl("canary", "--follow")
    assert code == 4
    assert "canary-3: rolled_back (regression: ttft_p99_s)" in out
    fake.answers[("GET", "/control/canary")] = (200, {"canary": canary_run("promoted", 2)})
    assert ctl("canary", "--follow")[0] == 0


def test_a_running_canary_shows_its_latest_polls(fake, ctl):
    fake.answers[("GET", "/control/canary")] = (200, {"canary": canary_run("watching", 8)})
    code, out, _ = ctl("canary")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("canary-3: fleet version 8")
    assert [line.split("->")[-1].strip() for line in lines[1:]] == [
        f"continue-{i}" for i in range(4, 9)]  # the last five, oldest first


def test_set_with_canary_and_json_prints_the_started_run_and_returns(fake, ctl):
    """--json is for a script: the run as the ingress started it, not a followed stream."""
    fake.answers[("POST", "/control/canary")] = (202, canary_run("watching", 0))
    code, out, err = ctl("set", "max_num_seqs=64", "--canary", "1", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["canary_id"] == "canary-3"
    assert [(m, p) for m, p, *_ in fake.seen] == [("GET", "/control/config"),
                                                  ("POST", "/control/canary")]


def test_set_with_canary_sends_the_replicas_window_and_min_requests(fake, ctl):
    """--watch defaults to 5 minutes; --min-requests reaches the ingress's rule."""
    fake.answers[("POST", "/control/canary")] = (202, canary_run("watching", 0))
    assert ctl("set", "max_num_seqs=64", "--canary", "2", "--detach")[0] == 0
    assert ctl("set", "max_num_seqs=64", "--canary", "1", "--watch", "90s",
               "--min-requests", "40", "--detach")[0] == 0
    bodies = [body for m, p, _, _, body in fake.seen if p == "/control/canary"]
    assert [(b["replicas"], b["watch_s"], b.get("min_requests")) for b in bodies] == [
        (2, 300.0, None), (1, 90.0, 40)]
