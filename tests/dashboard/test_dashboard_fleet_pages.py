"""The dashboard's Fleet and Canary pages (streamlit's AppTest runs each page's script)
against a fleet ingress over stand-in replicas (tests/fixtures/fleet_fakes.py): what each
replica shows, the replica picker, a canary before, during and after its decision."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest
from apptest_pages import CANARY, FLEET, open_page, problems, texts
from fixtures.fleet_fakes import FakeReplica, fake_fleet_server, good_window


@pytest.fixture(scope="module")
def fleet_url() -> Iterator[str]:
    """A fleet's ingress over three stand-in replicas (tests/fixtures/fleet_fakes.py)."""
    fakes = [FakeReplica(i) for i in range(3)]
    for fake in fakes:
        fake.windows[0] = good_window(20, ttft=0.05)
    with socket.socket() as probe:  # a free port (fixtures.browser's needs chromium)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with fake_fleet_server(fakes, port):
        yield f"http://127.0.0.1:{port}"


def test_one_replicas_answers_are_not_served_for_the_whole_fleet(monkeypatch):
    """Answers are cached by the source's label: a fleet read as one and one replica of it
    are two sources, whichever the sidebar picked first."""
    from control.trace.sources import UrlSource
    from dashboard import context

    monkeypatch.setattr(UrlSource, "ask",
                        lambda self, question, **params: {"replica": self.replica})
    context._ask_live.clear()
    url = "http://127.0.0.1:9"
    whole = context._context(url, None, "BATCHPILOT_TOKEN")
    one = context._context(url, None, "BATCHPILOT_TOKEN", "1")
    assert context.ask(whole, "summary") == {"replica": None}
    assert context.ask(one, "summary") == {"replica": "1"}
    assert "replica 1" in one.label


def test_the_replica_picker_lists_a_fleet_with_no_replica_ready(monkeypatch):
    """/readyz answers 503 while no replica is ready: its body still lists them, so the
    dashboard can still read one replica's trace (what went wrong there)."""
    from control.cli.http_json import HTTPFailure
    from dashboard import context

    def readyz(base, path, **kw):
        if base.endswith(":9"):
            raise HTTPFailure(None, f"cannot reach the server at {base}")
        raise HTTPFailure(503, "no replica is ready", {"ready": False, "replicas": [
            {"replica_id": 0, "healthy": False}, {"replica_id": 1, "healthy": False}]})

    monkeypatch.setattr(context, "request_json", readyz)
    context.replicas.clear()
    assert context.replicas("http://127.0.0.1:8", None) == ["0", "1"]
    assert context.replicas("http://127.0.0.1:9", None) == []


def test_the_fleet_page_renders_a_fleets_replicas(fleet_url):
    at = open_page(FLEET, bp_url=fleet_url)
    assert not problems(at), problems(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Replicas serving"] == "3 of 3" and metrics["Routing"] == "affinity"
    assert list(at.dataframe[0].value.index) == [0, 1, 2]


class HeldInstall(FakeReplica):
    """A stand-in that cannot take a push while `hold` is set (the ingress retries it)."""

    hold = False

    async def install(self, config: dict, version: int, **kw) -> dict:
        if self.hold and not kw["dry_run"]:
            return {"ok": False, "status": 503, "code": "busy", "message": "held by the test"}
        return await super().install(config, version, **kw)


def test_the_fleet_page_shows_a_replica_syncing_its_config_as_not_serving():
    """Not routed until the fleet's config reaches it (control/fleet/ingress.py): the page
    says so instead of "serving"."""
    fakes = [HeldInstall(i) for i in range(2)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with fake_fleet_server(fakes, port):
        url = f"http://127.0.0.1:{port}"
        fakes[1].hold = True
        reply = httpx.patch(f"{url}/control/config", headers={"If-Match": "0"}, timeout=30,
                            json={"changes": {"max_num_seqs": 32}})
        assert reply.status_code == 200 and not reply.json()["converged"], reply.text
        at = open_page(FLEET, bp_url=url)
        states = list(at.dataframe[0].value["state"])
        metrics = {m.label: m.value for m in at.metric}
        fakes[1].hold = False
    assert states == ["serving", "syncing config (not routed)"], states
    assert metrics["Replicas serving"] == "1 of 2"


def test_the_canary_page_renders_a_fleet_before_and_during_a_canary(fleet_url):
    at = open_page(CANARY, bp_url=fleet_url)
    assert not problems(at), problems(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Replicas"] == "3" and metrics["Converged"] == "yes", metrics
    assert "No canary has run on this fleet yet" in texts(at)
    resp = httpx.post(f"{fleet_url}/control/canary", headers={"If-Match": "0"}, json={
        "changes": {"max_num_seqs": 64}, "replicas": 1, "watch_s": 600, "poll_s": 0.3,
        "reason": "dashboard smoke"}, timeout=30)
    assert resp.status_code == 202, resp.text
    at = open_page(CANARY, bp_url=fleet_url)
    assert not problems(at), problems(at)
    assert "canary-1: watching" in texts(at)
    assert len(at.table) >= 2  # the replicas' versions, canary against baseline


def canary_event(n: int, decision: str, ttft_p99_s: float) -> dict:
    side = {"replicas": [0], "requests": 20, "ttft_p50_s": 0.02, "ttft_p99_s": ttft_p99_s,
            "tpot_p99_s": 0.01, "error_rate": 0.0, "goodput_share": 1.0, "goodput_rps": 2.0}
    kind = "canary_promote" if decision == "promoted" else "canary_rollback"
    return {"kind": kind, "canary_id": f"canary-{n}", "decision": decision,
            "time": 1_700_000_000.0 + 600 * n, "why": f"decision {n}", "fleet_version": n,
            "version": n + 1, "window_s": 300.0, "canary": side, "baseline": side,
            "checks": [{"metric": "ttft_p99_s", "canary": ttft_p99_s, "baseline": ttft_p99_s,
                        "limit": 0.5, "regressed": False}], "thresholds": {}}


def test_the_canary_page_shows_the_last_decision_in_milliseconds(monkeypatch):
    """Of two decided canaries the page shows the later one, its latencies in ms."""
    import time

    from control.cli.ctl import Client

    fleet_config = {"version": 3, "converged": True, "replicas": [
        {"replica_id": 0, "fleet_version": 3, "target_version": 3, "healthy": True}]}
    answers = {"/control/config": fleet_config, "/control/canary": {"canary": None},
               "/control/history": {"versions": [], "events": [
                   canary_event(1, "promoted", 0.2), canary_event(2, "rolled_back", 0.4)]}}
    monkeypatch.setattr(Client, "call", lambda self, method, path, *a, **kw: answers[path])
    at = open_page(CANARY, bp_url="http://127.0.0.1:9")
    assert [e.value for e in at.error] == [  # a rollback is shown as an error, by design
        "decision 2. Fleet version now 2 (candidate 3); decided at"
        f" {time.strftime('%H:%M:%S', time.localtime(1_700_001_200.0))} after 300 s of window."]
    assert "Last decision: canary-2 rolled_back" in texts(at)
    table = at.table[1].value
    assert table.loc["TTFT p99", "canary"] == "400.0 ms"
    assert table.loc["TTFT p99", "limit"] == "500.0 ms"


def test_the_fleet_page_shows_kv_usage_as_a_percentage(monkeypatch):
    from control.cli import http_json

    ready = {"ready": True, "routing": "affinity", "decisions": {"affinity": 3},
             "replicas": [{"replica_id": 0, "healthy": True, "kv_usage": 0.42,
                           "fleet_version": 1, "waiting": 0, "running": 1}]}
    monkeypatch.setattr(http_json, "request_json", lambda base, path, **kw: ready)
    at = open_page(FLEET, bp_url="http://127.0.0.1:9")
    assert not problems(at), problems(at)
    assert list(at.dataframe[0].value["KV usage"]) == ["42%"]
