"""Serve's own start failing under load (its HTTP proxy killed before it was ready, seen on
a starved 2-core machine): a fleet on a Ray of its own starts Serve once more; a second
failure, or one on a shared cluster, is a RuntimeError naming it (the CLI prints it), never
a Ray traceback. No Ray runs here: the two Serve calls are replaced."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError

from control.fleet import app
from control.serve.settings import ServeSettings


@pytest.fixture
def serve_calls(monkeypatch):
    """Each deploy attempt's outcome comes from `outcomes` (an exception is raised);
    returns the log of what ran."""
    calls: list[str] = []
    outcomes: list[object] = []

    def deploy_once(settings):
        calls.append("deploy")
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(app, "_deploy_once", deploy_once)
    monkeypatch.setattr("ray.serve.shutdown", lambda: calls.append("shutdown"))
    return calls, outcomes


def settings(address: str | None = None) -> app.FleetSettings:
    return app.FleetSettings(ServeSettings(model="tiny"), address=address)


def test_a_dead_proxy_at_start_is_started_once_more(serve_calls):
    calls, outcomes = serve_calls
    outcomes += [ActorDiedError(), "ingress"]
    assert app.deploy(settings()) == "ingress"
    assert calls == ["deploy", "shutdown", "deploy"]


def test_a_second_failure_is_an_error_naming_serve(serve_calls):
    calls, outcomes = serve_calls
    outcomes += [ActorDiedError(), ActorDiedError()]
    with pytest.raises(RuntimeError, match="Ray Serve failed to start twice"):
        app.deploy(settings())
    assert calls == ["deploy", "shutdown", "deploy"]


def test_a_shared_clusters_serve_is_never_shut_down(serve_calls):
    calls, outcomes = serve_calls
    outcomes += [ActorDiedError()]
    with pytest.raises(RuntimeError, match="Ray Serve failed to start on ray://head:10001"):
        app.deploy(settings(address="ray://head:10001"))
    assert calls == ["deploy"]
