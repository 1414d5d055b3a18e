"""The dashboard over a fleet, as a person sees it (headless Chromium, as
`make screenshots` drives it): `batchpilot dashboard --trace-db 'DIR/replica-*.duckdb'`
reads both replicas as one, the sidebar offers All or one replica, and the Requests page's
table leads with the replica column while rows come from both; the Fleet page reads a live
fleet's ingress (replicas, KV index, routing decisions), and one request's page there says
where the ingress sent it and why. Screenshots go to
$FLEET_SHOTS (default /tmp/fleet-ui) for a person to look at."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.browser import CHROMIUM, NO_CHROMIUM, dashboard
from fixtures.fleet_fakes import FakeReplica, fake_fleet_server
from fixtures.local_fleet import LocalFleet
from fixtures.ports import listen_port
from fixtures.requires import require_module
from fixtures.trace_data import fill_trace

from control.fleet.autoscale import AutoscaleConfig, SlotState
from control.fleet.autoscale_board import MemoryBoard, publish_slot

sync_api = require_module("playwright.sync_api", "pip install -e '.[test]'")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
SHOTS = Path(os.environ.get("FLEET_SHOTS", "/tmp/fleet-ui"))
DONE = ("!document.querySelector('[data-testid=stStatusWidget]')"
        " && !document.querySelector('[data-testid=stSkeleton]')")
GRID = "[data-testid=stDataFrame]"


@pytest.fixture(scope="module")
def fleet_glob(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("fleet-browser")
    fill_trace(str(folder / "replica-0.duckdb"), run_id="run-a").stop()
    fill_trace(str(folder / "replica-1.duckdb"), run_id="run-b").stop()
    return str(folder / "replica-*.duckdb")


@contextmanager
def browser_page(height: int) -> Iterator[Any]:
    """A headless Chromium page 1500 px wide, closed afterwards."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1500, "height": height})
        finally:
            browser.close()


def settle(page) -> None:
    page.wait_for_selector("[data-testid=stMainBlockContainer] h1", timeout=60_000)
    page.wait_for_function(DONE, timeout=60_000)
    page.wait_for_timeout(1500)  # the grid and charts draw


def grid_header(page) -> str:
    """The data grid's column headers (its accessible table mirrors the canvas), once it
    has drawn (on a busy machine, seconds after the page's script finished)."""
    page.wait_for_selector(f"{GRID} th", state="attached", timeout=60_000)
    return " ".join(page.locator(f"{GRID} th").all_inner_texts())


def test_requests_of_both_replicas_then_one(fleet_glob, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with dashboard(tmp_path, trace_db=fleet_glob) as url, browser_page(1100) as page:
        page.goto(f"{url}/requests")
        settle(page)
        assert page.locator("[data-testid=stException]").count() == 0
        sidebar = page.locator("[data-testid=stSidebar]")
        assert "trace files" in sidebar.inner_text()
        header = grid_header(page)
        assert header.split()[:2] == ["replica", "request_id"], header
        page.screenshot(path=str(SHOTS / "requests_all_replicas.png"), full_page=True)

        sidebar.locator("[data-testid=stSelectbox]").filter(has_text="Replica").locator(
            "input").click()
        page.get_by_role("option", name="1", exact=True).click()
        page.wait_for_timeout(500)
        settle(page)
        assert "replica 1" in sidebar.inner_text()
        header = grid_header(page)
        assert header.split()[0] == "request_id", header  # one replica: no column
        assert page.locator("[data-testid=stException]").count() == 0
        page.screenshot(path=str(SHOTS / "requests_replica_1.png"), full_page=True)

        page.goto(f"{url}/")
        settle(page)
        assert page.locator("[data-testid=stException]").count() == 0
        page.screenshot(path=str(SHOTS / "overview_fleet.png"), full_page=True)


def test_the_fleet_page_shows_replicas_and_routing(tiny_llama_dir, fleet_glob, tmp_path):
    """A live fleet (precise routing, no Ray: tests/fixtures/local_fleet.py) read through
    its ingress: both replicas serving, the KV index's blocks, the decisions by reason;
    over trace files the page says it needs a fleet's ingress."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    shared = "You are the router's test agent; answer in one word. " * 5
    with LocalFleet(tiny_llama_dir, tmp_path, routing="precise") as fleet, \
            httpx.Client(base_url=fleet.url, timeout=60) as client:
        for i in range(6):
            reply = client.post("/v1/completions", headers={"X-Tenant": "acme"}, json={
                "prompt": shared + f"Q{i}?", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            time.sleep(0.15)  # the KV index reads events every 100 ms
        last = reply.json()["id"]  # followed its prefix's blocks: a precise decision
        with dashboard(tmp_path, url=fleet.url) as url, browser_page(1100) as page:
            page.goto(f"{url}/fleet")
            settle(page)
            assert page.locator("[data-testid=stException]").count() == 0
            main = page.locator("[data-testid=stMainBlockContainer]")
            text = main.inner_text()
            assert "2 of 2" in text and "precise" in text, text
            header = grid_header(page)
            for column in ("replica", "state", "KV usage", "cached blocks (index)"):
                assert column in header, header
            assert page.locator("[data-testid=stVegaLiteChart]").count() == 1
            page.screenshot(path=str(SHOTS / "fleet_page.png"), full_page=True)

            # the Requests page, one request: where the ingress sent it and why
            page.goto(f"{url}/requests")
            settle(page)
            box = page.get_by_label("Request id (or pick one of the slowest below)")
            box.fill(last)
            box.press("Enter")
            page.wait_for_selector("text=routed to replica", timeout=60_000)
            settle(page)
            said = page.locator("[data-testid=stCaptionContainer]").filter(
                has_text="Routed to replica").inner_text()
            assert "by the fleet ingress" in said and "(precise)" in said, said
            assert "leading blocks of the prompt" in said, said
            assert page.locator("[data-testid=stException]").count() == 0
            page.screenshot(path=str(SHOTS / "request_routed.png"), full_page=True)
    with dashboard(tmp_path, trace_db=fleet_glob) as url, browser_page(700) as page:
        page.goto(f"{url}/fleet")
        settle(page)
        assert "is not a fleet" in page.locator(
            "[data-testid=stMainBlockContainer]").inner_text()


def test_an_autoscaled_fleets_page_shows_phases_and_scale_events(tmp_path):
    """Stand-in replicas behind a real ingress whose board plays Serve's autoscaler: slots
    1 and 2 start, 2 drains and stops, 1 begins to drain. The page shows the phases in the
    replica table, the scale event under way, the events as a step chart and a table."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    board, app = MemoryBoard(), "browser-fleet"
    fakes, port = [FakeReplica(i) for i in range(3)], listen_port()
    with fake_fleet_server(fakes, port, app=app, board=board,
                           autoscale=AutoscaleConfig(1, 3)) as fleet:
        url = f"http://127.0.0.1:{port}"
        for slot, phase in [(1, "starting"), (1, "on"), (2, "starting"), (2, "on"),
                            (2, "retiring"), (2, "off"), (1, "retiring")]:
            reason = "idle" if phase in ("retiring", "off") else "waiting"
            publish_slot(board, app, slot, SlotState(phase, reason, None, time.time()))
            deadline = time.monotonic() + 10
            while fleet.scaling.phases[slot] != phase:
                assert time.monotonic() < deadline, (slot, phase, fleet.scaling.phases)
                time.sleep(0.05)
        with dashboard(tmp_path, url=url) as dash, browser_page(1400) as page:
            page.goto(f"{dash}/fleet")
            settle(page)
            assert page.locator("[data-testid=stException]").count() == 0
            text = page.locator("[data-testid=stMainBlockContainer]").inner_text()
            assert "Autoscaling" in text and "1–3" in text, text
            assert "Under way: replica 1 is retiring (idle)" in text, text
            page.wait_for_selector(f"{GRID} th", state="attached", timeout=60_000)
            tables = " ".join(page.locator(f"{GRID} th").all_inner_texts())
            assert "replicas routed after" in tables, tables
            # the phase chart and the decisions chart (none routed yet: only the first)
            assert page.locator("[data-testid=stVegaLiteChart]").count() >= 1
            page.screenshot(path=str(SHOTS / "fleet_autoscale.png"), full_page=True)
