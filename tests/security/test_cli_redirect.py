"""Issue #29 (9): a server answering 3xx must not get the CLI's bearer token sent on to the
redirect target. Two local servers: `origin` answers every request with a 302 to `target`,
which records the Authorization header of whatever reaches it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.http_stub import QuietHandler, reply, served

from control.checklist.client import ControlClient
from control.checklist.result import ChecklistError
from control.cli.http_json import HTTPFailure, request_json
from control.cli.main import main

TOKEN = "s3cret-admin-token"


@pytest.fixture
def servers() -> Iterator[tuple[str, str, list[str | None]]]:
    """(origin URL, target URL, the Authorization headers the target received)."""
    received: list[str | None] = []

    class Target(QuietHandler):
        def _answer(self) -> None:
            received.append(self.headers.get("Authorization"))
            reply(self, 200, {"version": 1, "config": {}, "admission": "open"})

        do_GET = do_POST = do_PATCH = _answer

    with served(Target) as target:
        class Origin(QuietHandler):
            def _redirect(self) -> None:
                self.send_response(302)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PATCH = _redirect

        with served(Origin) as origin:
            yield origin, target, received


@pytest.mark.parametrize("command", [["get"], ["drain", "--reason", "r"]])
def test_ctl_does_not_follow_a_redirect_with_its_token(servers, command, monkeypatch, capsys):
    origin, target, received = servers
    monkeypatch.setenv("BATCHPILOT_TOKEN", TOKEN)
    code = main(["ctl", "--url", origin, *command])
    err = capsys.readouterr().err
    assert received == []  # nothing, so no token, reached the redirect target
    assert code != 0
    assert f"redirected (302) to {target}/control/" in err, err
    assert "does not follow redirects with a token" in err
    # where to point the CLI instead: the target's base, not the path it was asked for
    assert err.rstrip().endswith(f"use --url {target}"), err


def test_request_json_refuses_a_redirect_of_a_change(servers):
    origin, target, received = servers
    with pytest.raises(HTTPFailure) as failure:
        request_json(origin, "/control/config", method="PATCH", body={"changes": {}},
                     headers={"Authorization": f"Bearer {TOKEN}"})
    assert received == []
    assert failure.value.status == 302
    assert f"to {target}/control/config" in failure.value.message


def test_checklist_metrics_read_does_not_follow_a_redirect(servers, monkeypatch):
    origin, target, received = servers
    monkeypatch.setenv("BATCHPILOT_TOKEN", TOKEN)
    client = ControlClient(origin)
    with pytest.raises(ChecklistError, match="does not follow redirects"):
        client.get_text("/metrics")
    with pytest.raises(ChecklistError, match="does not follow redirects"):
        client.get_json("/control/config")
    assert received == []
