"""The Canary page as a person sees it: headless Chromium on `batchpilot dashboard --url`
over a fleet's ingress (stand-in replicas: tests/fixtures/fleet_fakes.py) where one canary
was rolled back and another is being watched. The page shows the fleet's versions, the
running canary against its baseline with the rule's limits, and the last decision with its
evidence. The screenshot goes to $CANARY_SHOTS (default /tmp/canary-ui) for a person to
look at."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from fixtures.browser import CHROMIUM, NO_CHROMIUM, dashboard, free_port
from fixtures.fleet_fakes import FakeReplica, fake_fleet_server, good_window
from fixtures.requires import require_module

sync_api = require_module("playwright.sync_api", "pip install -e '.[test]'")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
SHOTS = Path(os.environ.get("CANARY_SHOTS", "/tmp/canary-ui"))
DONE = ("!document.querySelector('[data-testid=stStatusWidget]')"
        " && !document.querySelector('[data-testid=stSkeleton]')")


def _canary(url: str, version: int, changes: dict, watch_s: float) -> dict:
    resp = httpx.post(f"{url}/control/canary", headers={"If-Match": str(version)}, json={
        "changes": changes, "replicas": 1, "watch_s": watch_s, "poll_s": 0.3,
        "reason": "browser test"}, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.json()


def _status(url: str) -> dict:
    return httpx.get(f"{url}/control/canary", timeout=30).json()["canary"]


def test_the_canary_page_shows_a_running_canary_and_the_last_decision(tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    fakes = [FakeReplica(i) for i in range(3)]
    fakes[0].windows[1] = good_window(24, ttft=0.42)  # candidate 1: slow -> rolled back
    fakes[0].windows[2] = good_window(18, ttft=0.06)  # candidate 2: fine, still watched
    for f in fakes[1:]:
        f.windows[0] = good_window(30, ttft=0.05)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with fake_fleet_server(fakes, port):
        _canary(url, 0, {"max_num_seqs": 1}, 1.0)
        deadline = time.monotonic() + 30
        while _status(url)["status"] == "watching":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert _status(url)["status"] == "rolled_back"
        _canary(url, 0, {"max_num_seqs": 64}, 600.0)
        time.sleep(1.0)  # a few polls
        with (dashboard(tmp_path, url=url) as dash, sync_api.sync_playwright() as p):
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1700})
                page.goto(f"{dash}/canary")
                page.wait_for_selector("text=canary-2: watching", timeout=60_000)
                page.wait_for_selector("text=Last decision: canary-1 rolled_back",
                                       timeout=60_000)
                page.wait_for_function(DONE, timeout=60_000)
                page.wait_for_timeout(1500)  # charts draw
                page.screenshot(path=str(SHOTS / "canary.png"), full_page=True)
                text = page.locator("[data-testid=stMainBlockContainer]").inner_text()
            finally:
                browser.close()
    assert "Fleet version" in text and "Converged" in text
    assert "max_num_seqs 128 → 64" in text  # the running canary's change
    assert "REGRESSED" in text and "420.0 ms" in text  # the rolled-back one's evidence
    assert "regression: ttft_p99_s" in text
