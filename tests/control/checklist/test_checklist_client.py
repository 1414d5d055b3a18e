"""The checklist's reads of a live server (control/checklist/client.py): a server still
loading (503) is an answer the checklist reports as missing evidence, not an error that
ends it; a fleet's /metrics narrowed to one replica keeps that replica's samples only."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

import pytest
from fixtures.http_stub import QuietHandler, reply

from control.checklist.client import ControlClient, Unavailable, only_replica
from control.checklist.result import ChecklistError
from control.trace.sources import REPLICA_HEADER


class _Answers(QuietHandler):
    statuses = {"/metrics": 503, "/control/config": 500, "/control/history": 200}
    replicas: list[str | None] = []  # the replica header of each request

    def do_GET(self):  # noqa: N802  (http.server's name)
        self.replicas.append(self.headers.get(REPLICA_HEADER))
        body = b"[]" if self.path == "/control/history" else b""
        reply(self, self.statuses.get(self.path, 404), body)


@pytest.fixture
def answering_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_loading_server_is_unavailable_evidence_and_a_500_an_error(answering_url):
    client = ControlClient(answering_url, "NO_SUCH_TOKEN_ENV")
    with pytest.raises(Unavailable, match="503"):
        client.get_text("/metrics")
    with pytest.raises(Unavailable, match="404"):
        client.get_text("/nothing")
    with pytest.raises(ChecklistError, match="answered 500"):
        client.get_text("/control/config")


def test_a_checklist_of_one_replica_names_it_in_each_request(answering_url):
    """Through a fleet ingress, --replica's requests go to that replica, not to any."""
    _Answers.replicas.clear()
    assert ControlClient(answering_url, "NO_SUCH_TOKEN_ENV", replica="1"
                         ).get_json("/control/history") == []
    assert ControlClient(answering_url, "NO_SUCH_TOKEN_ENV").get_json("/control/history") == []
    assert _Answers.replicas == ["1", None]


def test_one_replicas_metrics_keep_its_samples_and_the_comments():
    text = ("# TYPE batchpilot_requests_total counter\n"
            'batchpilot_requests_total{replica="0"} 5\n'
            'batchpilot_requests_total{replica="1"} 7\n')
    assert only_replica(text, "1") == ("# TYPE batchpilot_requests_total counter\n"
                                       'batchpilot_requests_total{replica="1"} 7\n')
    with pytest.raises(ChecklistError, match="no such replica"):
        only_replica(text, "2")
