"""`batchpilot fleet autoscale` against a real ingress on a local port (stand-in replicas,
its board written as Serve's autoscaler would): the phases and events it prints, a live
change and its refusals, a fixed fleet."""

from __future__ import annotations

import time

from fixtures.fleet_fakes import FakeReplica, fake_fleet_server
from fixtures.ports import listen_port

from control.cli.main import main
from control.fleet.autoscale import AutoscaleConfig, SlotState
from control.fleet.autoscale_board import MemoryBoard, publish_slot
from control.fleet.autoscale_cli import EVENTS_SHOWN, show


def test_it_shows_phases_and_events_and_changes_the_rule_live(capsys):
    board, app, port = MemoryBoard(), "cli-fleet", listen_port()
    fakes = [FakeReplica(i) for i in range(2)]
    with fake_fleet_server(fakes, port, app=app, board=board,
                           autoscale=AutoscaleConfig(1, 2)) as fleet:
        url = f"http://127.0.0.1:{port}"
        publish_slot(board, app, 1, SlotState("starting", "waiting", None, time.time(), 5.2))
        deadline = time.monotonic() + 10
        while fleet.scaling.phases[1] != "starting":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert main(["fleet", "autoscale", "--url", url]) == 0
        out = capsys.readouterr().out
        assert "size 1-2" in out and "under way: replica 1 is starting (waiting)" in out, out
        assert "replica 0: on (fixed)  replica 1: starting" in out, out
        assert "replica 1: scale_up (off -> starting; waiting, wanted for 5.2 s)" in out, out

        assert main(["fleet", "autoscale", "--url", url, "--set", "up_waiting=3",
                     "--reason", "fewer starts"]) == 0
        out = capsys.readouterr().out
        assert "changed: up_waiting 2 -> 3" in out and "up_waiting=3" in out, out
        assert main(["fleet", "autoscale", "--url", url, "--set", "up_waiting=3"]) == 0
        assert "nothing changed" in capsys.readouterr().out

        assert main(["fleet", "autoscale", "--url", url, "--set", "up_wait=3"]) == 2
        err = capsys.readouterr().err
        assert "400" in err and "unknown autoscale setting(s) ['up_wait']" in err, err
        assert main(["fleet", "autoscale", "--url", url, "--set", "up_waiting"]) == 2
        assert "must be NAME=NUMBER" in capsys.readouterr().err


def test_a_fixed_fleet_says_so():
    port = listen_port()
    with fake_fleet_server([FakeReplica(0), FakeReplica(1)], port):
        url = f"http://127.0.0.1:{port}"
        assert main(["fleet", "autoscale", "--url", url]) == 0
        assert main(["fleet", "autoscale", "--url", url, "--set", "up_waiting=3"]) == 2


def test_it_shows_the_latest_scale_events_not_the_first():
    """A long-running fleet has many scale events: the last EVENTS_SHOWN are printed."""
    cfg = {**AutoscaleConfig(1, 3).to_dict()}
    events = [{"time": 1_000.0 + i, "replica_id": 1, "event": f"event_{i}", "from": "off",
               "to": "starting", "reason": "waiting", "routed_replicas": 1}
              for i in range(EVENTS_SHOWN + 3)]
    state = {"enabled": True, "config": cfg, "wanted": None, "events": events,
             "slots": [{"replica_id": 0, "phase": "on", "fixed": True}]}
    lines: list[str] = []
    show(state, lines.append)
    shown = [line for line in lines if "replica 1: event_" in line]
    assert len(shown) == EVENTS_SHOWN
    assert f"event_{EVENTS_SHOWN + 2} " in shown[-1] and "event_3 " in shown[0], shown
