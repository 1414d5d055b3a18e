"""`batchpilot ctl`: KEY=VALUE into a merge patch, exit codes and output against a fake
control API (records what the CLI sent), then the same commands against the real server."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from control.cli.ctl import build_patch, parse_value
from control.cli.main import main

LANES = {"interactive": {"weight": 4.0, "max_running": None, "max_waiting": None,
                         "policy": "priority", "tenant_fair_share": False,
                         "queue_timeout_ms": None, "preempt_first": False, "batching": None,
                         "preempt_to_start": True, "slo": {"ttft_s": 1.0, "tpot_s": 0.1}},
         "batch": {"weight": 1.0, "max_running": 8, "max_waiting": None, "policy": "fcfs",
                   "tenant_fair_share": True, "queue_timeout_ms": 60000,
                   "preempt_first": True, "batching": "static", "preempt_to_start": False,
                   "slo": None}}
CONFIG = {"version": 7, "admission": "open",
          "config": {"max_num_seqs": 128, "kv_cache_high_watermark": 0.88,
                     "schedule_policy": "decode_first", "long_context_lane": None,
                     "tenant_lanes": {"acme": "batch"}, "lanes": LANES,
                     "default_slo": {"ttft_s": 10.0, "tpot_s": None}},
          "static": {"block_size": 16, "num_kv_blocks": 4096},
          "profiles": {"degrade": {"max_num_seqs": 32}, "night": {"batching": "static"}},
          "lanes_state": {"interactive": {"running": 3, "waiting": 1},
                          "batch": {"running": 0, "waiting": 12}}}
PATCHED = {"applied": True, "version": 8, "diff": {"max_num_seqs": [128, 64],
                                                   "lanes.batch.batching": ["static", None]},
           "config": CONFIG["config"]}
T0 = 1_700_000_000.0
HISTORY = {"versions": [
    {"version": 1, "time": T0, "actor": "server", "source": "startup", "reason": "",
     "diff": {}},
    {"version": 2, "time": T0 + 60, "actor": "alice", "source": "api", "reason": "incident 42",
     "diff": {"max_num_seqs": [128, 64], "a": [1, 2], "b": [1, 2], "c": [1, 2]}}]}


def refusal(message: str, code: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}, **extra}


class FakeControl:
    """The control API on 127.0.0.1:<free port>: `answers[(method, path)] = (status, JSON
    or bytes)`; every request lands in `seen` as (method, path, query, headers, body)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {
            ("GET", "/control/config"): (200, CONFIG)}
        self.seen: list[tuple[str, str, str, dict[str, str], Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urllib.parse.urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.seen.append((self.command, url.path, url.query, headers,
                                  json.loads(raw) if raw else None))
                status, body = fake.answers.get((self.command, url.path),
                                                (404, refusal("no such route")))
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def fake(monkeypatch):
    server = FakeControl()
    thread = threading.Thread(target=server.server.serve_forever, args=(0.05,),
                              daemon=True)
    thread.start()
    monkeypatch.setenv("BATCHPILOT_URL", server.url)
    monkeypatch.delenv("BATCHPILOT_TOKEN", raising=False)
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def ctl(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["ctl", *argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


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


# ---- against the real server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tiny_loaded, tmp_path_factory):
    """A real server (uvicorn in a thread) with one profile; no tokens: loopback, open."""
    from fixtures.serving import LiveServer, make_engine

    config = {"profiles": {"degrade": {"max_active_sequences": 2}}}
    engine, _, settings = make_engine(tiny_loaded, config=config,
                                      tmp_path=tmp_path_factory.mktemp("ctl"))
    with LiveServer(engine, settings.replace(watch_config=False)) as url:
        yield url


def test_ctl_steers_the_real_server(live, ctl, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_URL", live)
    code, out, _ = ctl("get")
    assert code == 0 and out.startswith("version 1   admission open\n")
    before = json.loads(ctl("get", "--json")[1])["config"]["max_num_seqs"]
    code, out, err = ctl("set", "max_num_seqs=3", "--reason", "test")
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"max_num_seqs: {before} -> 3", "applied: now version 2 (was 1)"]
    assert re.search(r"^  max_num_seqs\s+3$", ctl("get")[1], re.M)
    history = ctl("history")[1].splitlines()
    assert history[-1].split()[0] == "2" and "test" in history[-1]
    assert f"max_num_seqs {before}->3" in history[-1]

    code, out, _ = ctl("set", "max_active_sequences=5", "--dry-run")
    assert code == 0 and out.splitlines() == [
        "max_num_seqs: 3 -> 5", "dry run: nothing was applied (still version 2)"]
    code, out, _ = ctl("set", "lanes.bulk.weight=0.5", "lanes.bulk.batching=static",
                       "tenant_lanes.acme=bulk")
    assert code == 0 and "applied: now version 3 (was 2)" in out
    assert re.search(r"^bulk\s+0\.5\s+-\s+-\s+fcfs\s+false\s+-\s+false\s+false\s+static"
                     r"\s+none\s+0\s+0$", ctl("lanes")[1], re.M)
    code, out, _ = ctl("set", "lanes.bulk=null", "tenant_lanes.acme=null",
                       "--move", "bulk=batch")
    assert code == 0 and "lanes.bulk: {" in out and "tenant_lanes.acme: bulk -> null" in out
    assert "bulk" not in ctl("lanes")[1]

    code, out, _ = ctl("profile", "degrade", "--reason", "overload")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 3 -> 2", "applied: now version 5"]
    code, out, _ = ctl("rollback", "2", "--reason", "undo")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 2 -> 3", "applied: now version 6"]
    rows = [line.split() for line in ctl("history")[1].splitlines()[1:]]
    assert [(r[0], r[4]) for r in rows[-2:]] == [("5", "profile:degrade"), ("6", "rollback:2")]
    code, out, _ = ctl("rollback", "previous", "--reason", "undo the undo")
    assert code == 0 and out.splitlines() == ["max_num_seqs: 3 -> 2", "applied: now version 7"]
    code, _, err = ctl("rollback", "latest")
    assert code == 2 and "'latest' is not a version number or 'previous'" in err


def test_ctl_refusals_from_the_real_server(live, ctl, monkeypatch):
    monkeypatch.setenv("BATCHPILOT_URL", live)
    version = json.loads(ctl("get", "--json")[1])["version"]
    code, out, err = ctl("set", "max_num_seqs=0")
    assert (code, out) == (2, "") and "max_num_seqs" in err and "400" in err
    code, _, err = ctl("set", "max_num_seqs=4", "--if-match", str(version + 7))
    assert code == 2
    assert f"changed since version {version + 7} (now {version}): get it again" in err
    assert ctl("profile", "nope")[0] == 1
    code, _, err = ctl("rollback", "999")
    assert code == 1 and "no version 999" in err
    assert json.loads(ctl("get", "--json")[1])["version"] == version  # nothing changed
    assert ctl("drain", "--reason", "deploy")[1] == "admission: draining\n"
    assert "admission draining" in ctl("get")[1]
    assert ctl("resume")[1] == "admission: open\n"


def test_ctl_tokens_against_the_real_server(tiny_loaded, tmp_path, ctl, monkeypatch):
    from fixtures.serving import LiveServer, make_engine

    tokens = tmp_path / "tokens"
    tokens.write_text("alice admin adm1n-secret\ngrafana read r3ad-secret\n")
    engine, _, settings = make_engine(tiny_loaded)
    with LiveServer(engine, settings.replace(control_tokens_path=str(tokens))) as url:
        monkeypatch.setenv("BATCHPILOT_URL", url)
        code, _, err = ctl("get")
        assert code == 3 and "$BATCHPILOT_TOKEN is not set" in err
        monkeypatch.setenv("BATCHPILOT_TOKEN", "r3ad-secret")
        assert ctl("get")[0] == 0
        code, _, err = ctl("set", "max_num_seqs=3")
        assert code == 3 and "read-only" in err and "may only read" in err
        monkeypatch.setenv("OPS_TOKEN", "adm1n-secret")
        code, out, _ = ctl("--token-env", "OPS_TOKEN", "set", "max_num_seqs=3")
        assert code == 0 and "applied" in out
        assert ctl("history")[1].splitlines()[-1].split()[3] == "alice"


def test_rollback_previous_undoes_the_only_change(fake, ctl):
    """Two versions in the history (start-up, one change): `previous` is version 1."""
    fake.answers[("GET", "/control/history")] = (200, HISTORY)
    fake.answers[("POST", "/control/rollback/1")] = (200, PATCHED)
    code, _, err = ctl("rollback", "previous", "--reason", "undo")
    assert (code, err) == (0, "")
    assert [(m, p) for m, p, *_ in fake.seen] == [("GET", "/control/history"),
                                                  ("POST", "/control/rollback/1")]


# ---- a fleet's canary ----------------------------------------------------------------------
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
