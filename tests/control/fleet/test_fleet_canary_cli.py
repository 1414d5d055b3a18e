"""`batchpilot ctl set ... --canary N --watch DURATION`'s own parts: durations, and
following a canary (a line per poll, then the decision; exit 4 when rolled back)."""

from __future__ import annotations

import io

import pytest
from fixtures.http_stub import QuietHandler, reply

from control.cli.ctl_canary import ROLLED_BACK_EXIT, exit_for, follow, parse_duration
from control.cli.main import main

SIDE = {"replicas": [0], "requests": 12, "ttft_p99_s": 0.4, "tpot_p99_s": 0.02,
        "error_rate": 0.0, "goodput_share": 1.0}


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300.0), ("30s", 30.0), ("1.5h", 5400.0),
                                               ("90", 90.0), ("500ms", 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "-3s", "0s", "m"])
def test_a_bad_duration_names_the_flag(text):
    with pytest.raises(ValueError, match="--watch="):
        parse_duration(text)


def test_follow_prints_each_poll_once_then_the_decision():
    poll = {"time": 1.0, "elapsed_s": 1.0, "canary": SIDE, "baseline": SIDE,
            "decision": "continue", "why": "watching", "checks": []}
    later = {**poll, "time": 2.0, "elapsed_s": 2.0, "decision": "rollback"}
    run = {"canary_id": "canary-3", "version": 3, "watch_s": 8.0, "status": "watching",
           "polls": [poll]}
    done = {**run, "status": "rolled_back", "polls": [poll, later], "decision": {
        "why": "regression: ttft_p99_s", "canary": SIDE, "baseline": SIDE, "fleet_version": 2,
        "checks": [{"metric": "ttft_p99_s", "canary": 0.4, "baseline": 0.03,
                    "limit": 0.08, "regressed": True}]}}
    answers = iter([run, run, done])
    out = io.StringIO()
    final = follow(lambda: next(answers), out=out, sleep=lambda _: None)
    lines = out.getvalue().splitlines()
    assert [ln.split("->")[-1].strip() for ln in lines[:2]] == ["continue", "rollback"]
    assert lines[2] == "canary-3: rolled_back (regression: ttft_p99_s)"
    assert "REGRESSED" in out.getvalue() and "TTFT p99 400 ms" in lines[0]
    assert exit_for(final) == ROLLED_BACK_EXIT


def test_a_poll_after_an_extension_shows_the_extended_window():
    from control.cli.ctl_canary import poll_line

    poll = {"time": 1.0, "elapsed_s": 42.0, "canary": SIDE, "baseline": SIDE,
            "decision": "continue", "why": "watching", "checks": []}
    run = {"watch_s": 30.0, "extensions": 1}
    assert poll_line(run, poll).lstrip().startswith("42.0s/60s")
    assert poll_line({"watch_s": 30.0}, poll).lstrip().startswith("42.0s/30s")


def test_watch_without_canary_is_a_usage_error(capsys):
    assert main(["ctl", "--url", "http://127.0.0.1:9", "set", "max_num_seqs=1",
                 "--watch", "5m"]) == 2
    assert "--watch, --detach and --min-requests go with --canary N" in capsys.readouterr().err


def test_a_canary_on_a_single_server_says_it_needs_a_fleet(capsys):
    import threading
    from http.server import ThreadingHTTPServer

    class OneServer(QuietHandler):  # has /control/config, no /control/canary
        def do_GET(self):  # noqa: N802
            reply(self, 200, {"version": 3, "config": {}})

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            reply(self, 404, {"error": {"message": "Not Found", "type": "invalid_request_error",
                                       "param": None, "code": "not_found"}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), OneServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(["ctl", "--url", f"http://127.0.0.1:{server.server_port}", "set",
                     "max_num_seqs=1", "--canary", "1", "--watch", "30s"])
    finally:
        server.shutdown()
    assert code == 2
    assert "--canary needs a fleet's ingress" in capsys.readouterr().err
