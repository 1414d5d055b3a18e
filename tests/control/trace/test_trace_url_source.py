"""`batchpilot trace --url`: what the CLI asks a server and how it reads the answers. One
replica of a fleet is asked by its X-Batchpilot-Replica header, after the ingress's /readyz
says the replica exists (also while no replica is ready: that is when its trace is wanted);
a 401 says how to send a token; a URL with a trailing slash reads the same. A stand-in
server answers as a fleet ingress or a single server and records what it was asked."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fixtures.http_stub import QuietHandler, reply, served

from control.cli.main import main
from control.trace.sources import REPLICA_HEADER

FLEET = {"status": "ready", "replicas": [{"replica_id": 0}, {"replica_id": 1}]}
TOKEN = "read-secret-1"


class _StandIn(QuietHandler):
    """/readyz answers `readyz`; /v1/trace/summary answers which replica it was asked for
    (all: no header), or 401 without the bearer token when `needs_token`; anything else 404.
    Each request's (path, replica header) goes to `asked`."""

    readyz: tuple[int, dict] = (200, FLEET)
    needs_token = False
    asked: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802  (http.server's name)
        # the path as sent: http.server folds a leading '//' that a server's router does not
        path = self.requestline.split()[1]
        self.asked.append((path, self.headers.get(REPLICA_HEADER)))
        if path == "/readyz":
            self._answer(*self.readyz)
        elif path != "/v1/trace/summary":
            self._answer(404, {"error": {"message": f"no route {path}"}})
        elif self.needs_token and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(401, {"error": {"message": "a read token is required"}})
        else:
            self._answer(200, {"replica": self.headers.get(REPLICA_HEADER, "all")})

    def _answer(self, status: int, body: dict) -> None:
        reply(self, status, body)


@pytest.fixture
def stand_in(monkeypatch) -> Iterator[str]:
    monkeypatch.delenv("BATCHPILOT_TOKEN", raising=False)
    _StandIn.readyz, _StandIn.needs_token = (200, FLEET), False
    _StandIn.asked = []
    with served(_StandIn) as url:
        yield url


def trace(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["trace", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_replica_of_a_fleet_is_asked_by_its_header(stand_in, capsys):
    code, out, err = trace(capsys, "--url", stand_in, "--replica", "1", "summary", "--json")
    assert code == 0, err
    assert json.loads(out) == {"replica": "1"}
    assert _StandIn.asked == [("/readyz", None), ("/v1/trace/summary", "1")]


def test_an_unknown_replica_is_a_usage_error_naming_the_fleets(stand_in, capsys):
    code, out, err = trace(capsys, "--url", stand_in, "--replica", "7", "summary")
    assert code == 2 and not out
    assert "replica='7' must be one of 0, 1" in err
    assert _StandIn.asked == [("/readyz", None)]  # nothing was read for a wrong replica


def test_a_replica_named_at_a_single_server_is_a_usage_error(stand_in, capsys):
    """One server ignores the header: its answer would be the whole server's, shown as the
    replica's."""
    _StandIn.readyz = (200, {"status": "ready"})
    code, out, err = trace(capsys, "--url", stand_in, "--replica", "1", "summary")
    assert code == 2 and not out
    assert "is not a fleet ingress" in err


def test_one_replica_of_a_fleet_with_none_ready_can_still_be_read(stand_in, capsys):
    """The ingress answers /readyz 503 while no replica is ready, listing them all: their
    traces (what went wrong) must still be readable one by one."""
    _StandIn.readyz = (503, {**FLEET, "status": "not_ready"})
    code, out, err = trace(capsys, "--url", stand_in, "--replica", "0", "summary", "--json")
    assert code == 0, err
    assert json.loads(out) == {"replica": "0"}


def test_a_401_without_a_token_says_how_to_send_one(stand_in, capsys, monkeypatch):
    _StandIn.needs_token = True
    code, _, err = trace(capsys, "--url", stand_in, "summary")
    assert code == 1 and "answered 401" in err
    assert "no token was sent: set $BATCHPILOT_TOKEN or --token-env NAME" in err
    monkeypatch.setenv("BATCHPILOT_TOKEN", "a-wrong-token")  # one was sent: no such hint
    code, _, err = trace(capsys, "--url", stand_in, "summary")
    assert code == 1 and "answered 401" in err and "no token was sent" not in err
    monkeypatch.setenv("BATCHPILOT_TOKEN", TOKEN)
    code, out, err = trace(capsys, "--url", stand_in, "summary", "--json")
    assert code == 0 and json.loads(out) == {"replica": "all"}, err


def test_a_url_with_a_trailing_slash_reads_the_same(stand_in, capsys):
    code, out, err = trace(capsys, "--url", stand_in + "/", "summary", "--json")
    assert code == 0, err
    assert json.loads(out) == {"replica": "all"}
    assert _StandIn.asked == [("/v1/trace/summary", None)]
