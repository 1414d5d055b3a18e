"""`batchpilot fleet` takes SIGTERM and Ctrl+C as a stop (drain, then exit 0) from the moment
it prints its ready line: a supervisor may signal as soon as it reads it. Before, the line
came first, and a SIGTERM in between met Ray's own handler, which exited 15 without a
drain (seen: exit 15, and -6 from Ray's shutdown, in 4 of 4 starts signalled on the line).
Ray is not started here: the fleet's start and stop are stand-ins."""

from __future__ import annotations

import signal
import types

from fixtures.requires import require_module

from control.fleet import app
from control.fleet.app import READY_LINE, FleetSettings
from control.serve.settings import ServeSettings


def test_the_stop_handlers_are_in_place_when_the_ready_line_is_printed(monkeypatch):
    ray = require_module("ray", "pip install -e '.[fleet]'")
    seen: dict[str, object] = {}
    settings = FleetSettings(ServeSettings(), replicas=2, replica_cpus=0.75)

    def fake_print(*args, **kwargs):
        if str(args[0]).startswith(READY_LINE):
            seen["handler at ready"] = signal.getsignal(signal.SIGTERM)

    monkeypatch.setattr(app, "print", fake_print, raising=False)
    monkeypatch.setattr(app, "sized", lambda s: s)
    monkeypatch.setattr(app, "deploy", lambda s: types.SimpleNamespace())
    monkeypatch.setattr(app, "child_processes", lambda: {})
    monkeypatch.setattr(app, "wait_for_stop", lambda stop: seen.setdefault("waited", stop))
    monkeypatch.setattr(app, "stop", lambda ingress, grace_s: 0)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert app.run(settings) == 0
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    handler = seen["handler at ready"]
    assert callable(handler) and handler is not before[signal.SIGTERM], handler
    assert seen["waited"] is not None
