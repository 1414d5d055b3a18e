"""`batchpilot ctl` against a stand-in control API (fake_control.py, which records what the
CLI sent): KEY=VALUE into a merge patch, the requests and exit codes, the output."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
from fake_control import CONFIG, HISTORY, LANES, PATCHED, T0, refusal

from control.cli.ctl import build_patch, parse_value
from control.cli.main import main


# ---- KEY=VALUE -> merge patch ------------------------------------------------------------
@pytest.mark.parametrize(("args", "patch"), [
    (["max_num_seqs=64"], {"max_num_seqs": 64}),
    (["max_active_sequences=64", "max_batched_tokens=2048"],
     {"max_num_seqs": 64, "max_num_batched_tokens": 2048}),
    (["lanes.batch.weight=2", "lanes.batch.batching=static", "lanes.interactive.weight=0.5"],
     {"lanes": {"batch": {"weight": 2, "batching": "static"}, "interactive": {"weight": 0.5}}}),
    (["lanes.batch=null", "lanes.bulk.weight=1", "tenant_lanes.acme=bulk"],
     {"lanes": {"batch": None, "bulk": {"weight": 1}}, "tenant_lanes": {"acme": "bulk"}}),
    (["chunked_prefill=false", "long_context_lane=null", 'default_lane="42"', "x=a=b"],
     {"chunked_prefill": False, "long_context_lane": None, "default_lane": "42", "x": "a=b"}),
])
def test_assignments_build_one_nested_merge_patch(args, patch):
    assert build_patch(args) == patch


@pytest.mark.parametrize(("text", "value"), [
    ("64", 64), ("0.9", 0.9), ("true", True), ("null", None), ('"64"', "64"),
    ("static", "static"), ("", ""), ("NaN", "NaN"), ('{"weight": 2}', {"weight": 2}),
])
def test_values_are_json_when_they_parse_else_text(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize(("args", "named"), [
    (["max_num_seqs"], "'max_num_seqs'"), (["=3"], "'=3'"),
    (["lanes..weight=1"], "'lanes..weight=1'"),
    ([".x=1"], "'.x=1'"), (["lanes.batch.=1"], "'lanes.batch.=1'"),
    (["lanes.batch=null", "lanes.batch.weight=2"], "'lanes.batch.weight=2'"),
    (["max_num_seqs=1", "max_active_sequences=2"], "'max_active_sequences=2'"),
    (["max_num_seqs=1", "--move", "bulk"], "--move 'bulk'"),
])
def test_bad_arguments_are_usage_errors_that_name_them(fake, ctl, args, named):
    code, out, err = ctl("set", *args)
    assert (code, out) == (2, "")
    assert err.startswith("batchpilot ctl: error: ") and named in err
    assert fake.seen == []  # refused before asking the server anything


@pytest.mark.parametrize("argv", [["--token", "s3cret", "get"], ["get", "--token=s3cret"]])
def test_the_token_is_never_a_flag(fake, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["ctl", *argv])
    assert exc.value.code == 2 and "shell history" in capsys.readouterr().err
    assert fake.seen == []


# ---- requests sent, exit codes -----------------------------------------------------------
def test_set_reads_the_version_then_patches_with_it(fake, ctl, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_TOKEN", "adm1n-secret")
    fake.answers[("PATCH", "/control/config")] = (200, PATCHED)
    code, out, err = ctl("set", "max_active_sequences=64", "lanes.batch.batching=null",
                         "--reason", "incident 42", "--move", "bulk=batch")
    assert (code, err) == (0, "")
    (m1, p1, _, h1, _), (m2, p2, query, h2, body) = fake.seen
    assert (m1, p1, m2, p2, query) == ("GET", "/control/config", "PATCH", "/control/config", "")
    assert h1["authorization"] == h2["authorization"] == "Bearer adm1n-secret"
    assert h2["if-match"] == "7"
    assert body == {"changes": {"max_num_seqs": 64, "lanes": {"batch": {"batching": None}}},
                    "lane_moves": {"bulk": "batch"}, "reason": "incident 42"}
    assert out.splitlines() == ["max_num_seqs: 128 -> 64", "lanes.batch.batching: static -> null",
                                "applied: now version 8 (was 7)"]


def test_set_on_a_fleet_says_how_long_its_replicas_took(fake, ctl):
    fake.answers[("PATCH", "/control/config")] = (200, {**PATCHED, "converged": True,
                                                        "converge_s": 0.25})
    code, out, _ = ctl("set", "max_num_seqs=64")
    assert code == 0 and out.splitlines()[-1] == "fleet: every replica took it in 250 ms"
    fake.answers[("PATCH", "/control/config")] = (200, {**PATCHED, "converged": False,
                                                        "converge_s": 0.25})
    code, out, _ = ctl("set", "max_num_seqs=64")
    assert code == 0 and out.splitlines()[-1].startswith("fleet: not every replica took it")


def test_set_with_if_match_and_dry_run_sends_no_get(fake, ctl, monkeypatch):
    monkeypatch.setenv("OPS_TOKEN", "other-secret")
    fake.answers[("PATCH", "/control/config")] = (200, {**PATCHED, "applied": False,
                                                        "version": 5})
    code, out, _ = ctl("--token-env", "OPS_TOKEN", "set", "max_num_seqs=64", "--if-match",
                       "5", "--dry-run")
    assert code == 0
    [(method, _, query, headers, _)] = fake.seen
    assert (method, query, headers["if-match"]) == ("PATCH", "dry_run=1", "5")
    assert headers["authorization"] == "Bearer other-secret"
    assert out.splitlines()[-1] == "dry run: nothing was applied (still version 5)"


@pytest.mark.parametrize(("status", "exit_code"), [
    (400, 2), (401, 3), (403, 3), (404, 1), (409, 2), (412, 2), (428, 2), (500, 1), (503, 1)])
def test_http_status_maps_to_exit_code(fake, ctl, status, exit_code):
    fake.answers[("PATCH", "/control/config")] = (status, refusal(f"it said {status}"))
    code, out, err = ctl("set", "max_num_seqs=64")
    assert (code, out) == (exit_code, "")
    assert err.startswith(f"batchpilot ctl: error: the server answered {status}: it said")


def test_unreachable_or_not_json_exits_1(fake, ctl):
    fake.answers[("GET", "/control/config")] = (200, b"<html>hi</html>")
    code, _, err = ctl("get")
    assert code == 1 and "did not answer with JSON" in err
    code, _, err = ctl("--url", "http://127.0.0.1:1", "get")
    assert code == 1 and "cannot reach the server at http://127.0.0.1:1" in err
    assert ctl("--url", "127.0.0.1:8000", "get")[0] == 2


def test_stale_version_says_what_to_do(fake, ctl):
    fake.answers[("PATCH", "/control/config")] = (412, refusal(
        "stale", "version_mismatch", current_version=9))
    code, _, err = ctl("set", "max_num_seqs=64")
    assert code == 2
    assert "the config changed since version 7 (now 9): get it again and retry" in err


def test_auth_failures_exit_3_with_a_hint(fake, ctl, monkeypatch):
    fake.answers[("GET", "/control/config")] = (401, refusal("needs a token"))
    code, _, err = ctl("get")
    assert code == 3 and "needs a token" in err
    assert "$BATCHPILOT_TOKEN is not set" in err and "--token-env" in err
    monkeypatch.setenv("BATCHPILOT_TOKEN", "read-only-token")
    fake.answers[("POST", "/control/drain")] = (403, refusal("token 'g' is read-only"))
    code, _, err = ctl("drain")
    assert code == 3 and "read-only" in err and "$BATCHPILOT_TOKEN may only read" in err


# ---- output --------------------------------------------------------------------------------
def test_get_shows_version_settings_lanes_and_profiles(fake, ctl):
    code, out, _ = ctl("get")
    assert code == 0
    assert out.startswith("version 7   admission open\n")
    assert re.search(r"^  max_num_seqs\s+128$", out, re.M)
    assert re.search(r"^  long_context_lane\s+null$", out, re.M)
    assert "tenant_lanes  acme -> batch" in out
    assert re.search(r"^  batch\s+1\.0\s+8\s+-\s+fcfs\s+true\s+60000\s+true\s+false\s+static"
                     r"\s+TTFT 10 s \(default\)\s+0\s+12$", out, re.M)  # default_slo's
    assert re.search(r"^  interactive\s.*\s-\s+TTFT 1 s/TPOT 0\.1 s\s+3\s+1$", out, re.M)
    assert "profiles  degrade, night" in out
    code, out, _ = ctl("get", "--json")
    assert json.loads(out) == CONFIG


def test_lanes_prints_only_the_lanes(fake, ctl):
    code, out, _ = ctl("lanes")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[0].split()[0] == "lane"
    assert lines[1].split()[0] == "interactive" and lines[1].split()[-2:] == ["3", "1"]
    code, out, _ = ctl("lanes", "--json")
    assert json.loads(out)["batch"] == {**LANES["batch"], "running": 0, "waiting": 12}


def test_history_shows_local_time_actor_reason_and_changes(fake, ctl):
    fake.answers[("GET", "/control/history")] = (200, HISTORY)
    code, out, _ = ctl("history")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    local = datetime.fromtimestamp(T0 + 60).strftime("%Y-%m-%d %H:%M:%S")
    assert lines[2].split()[:4] == ["2", *local.split(), "alice"]
    assert "incident 42" in lines[2] and "max_num_seqs 128->64, a 1->2, b 1->2, +1 more" in lines[2]


def test_profile_rollback_drain_resume_send_the_contract(fake, ctl):
    for route in ("/control/profiles/degrade", "/control/rollback/3"):
        fake.answers[("POST", route)] = (200, PATCHED)
    fake.answers[("POST", "/control/drain")] = (200, {"admission": "draining"})
    fake.answers[("POST", "/control/resume")] = (200, {"admission": "open"})
    assert ctl("profile", "degrade", "--reason", "overload")[0] == 0
    code, out, _ = ctl("rollback", "3", "--dry-run", "--move", "bulk=batch")
    assert code == 0 and "dry run: nothing was applied" in out
    assert ctl("drain", "--reason", "deploy")[1] == "admission: draining\n"
    assert ctl("resume")[1] == "admission: open\n"
    sent = [(m, p, q, body) for m, p, q, _, body in fake.seen]
    assert sent == [
        ("POST", "/control/profiles/degrade", "", {"reason": "overload", "lane_moves": {}}),
        ("POST", "/control/rollback/3", "dry_run=1",
         {"reason": "", "lane_moves": {"bulk": "batch"}}),
        ("POST", "/control/drain", "", {"reason": "deploy"}),
        ("POST", "/control/resume", "", {"reason": ""})]
    assert all("if-match" not in h and "authorization" not in h for *_, h, _ in fake.seen)
    code, _, err = ctl("profile", "nope")
    assert code == 1 and "404" in err


def test_rollback_previous_undoes_the_only_change(fake, ctl):
    """Two versions in the history (start-up, one change): `previous` is version 1."""
    fake.answers[("GET", "/control/history")] = (200, HISTORY)
    fake.answers[("POST", "/control/rollback/1")] = (200, PATCHED)
    code, _, err = ctl("rollback", "previous", "--reason", "undo")
    assert (code, err) == (0, "")
    assert [(m, p) for m, p, *_ in fake.seen] == [("GET", "/control/history"),
                                                  ("POST", "/control/rollback/1")]
