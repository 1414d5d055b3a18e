"""The dashboard in a real browser (headless Chromium driven by Playwright, as `make
screenshots` runs it): launched the way `batchpilot dashboard` launches it, from a directory
other than the repository's, it shows no Streamlit developer chrome (no Deploy button, no
developer menu); launched with Streamlit's developer toolbar, the same check finds the
Deploy button, so the check can see it. Over a burst deferred by the goodput policy the
Overview shows the Deferred count and its bars (a screenshot in $OVERVIEW_SHOTS, default
/tmp/overview-ui, for a person to look at). `make test` installs Chromium and Playwright; a
machine without them skips (CI fails instead: tests/fixtures/browser.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fixtures.browser import CHROMIUM, NO_CHROMIUM, dashboard
from fixtures.requires import require_module
from fixtures.trace_data import fill_goodput_trace, fill_trace

sync_api = require_module("playwright.sync_api", "pip install -e '.[test]'")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
DEPLOY = "[data-testid=stAppDeployButton]"
MENU = "[data-testid=stMainMenu]"
SHOTS = Path(os.environ.get("OVERVIEW_SHOTS", "/tmp/overview-ui"))


@pytest.fixture(scope="module")
def trace_db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("browser") / "trace.duckdb")
    fill_trace(path).stop()
    return path


@contextmanager
def overview(url: str, width: int, height: int, settle_ms: int) -> Iterator[Any]:
    """Chromium on the dashboard's first page (Overview), once its script has run and
    `settle_ms` more have passed; yields the page."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.wait_for_selector("[data-testid=stMainBlockContainer] h1", timeout=60_000)
            page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')",
                                   timeout=60_000)
            page.wait_for_timeout(settle_ms)
            yield page
        finally:
            browser.close()


def chrome_seen(url: str, screenshot: Path) -> dict[str, bool]:
    """What of Streamlit's chrome the Overview page shows."""
    with overview(url, 1400, 900, 500) as page:  # the toolbar renders with the first run
        page.screenshot(path=str(screenshot))
        return {"deploy": page.locator(DEPLOY).is_visible()
                or page.get_by_text("Deploy", exact=True).count() > 0,
                "menu": page.locator(MENU).is_visible(),
                "title": "batchpilot" in page.title()}


def test_dashboard_shows_no_deploy_button_or_developer_menu(trace_db, tmp_path):
    with dashboard(tmp_path, trace_db=trace_db) as url:
        seen = chrome_seen(url, tmp_path / "overview.png")
    assert seen == {"deploy": False, "menu": False, "title": True}


def test_the_check_sees_the_deploy_button_of_the_developer_toolbar(trace_db, tmp_path):
    with dashboard(tmp_path, trace_db=trace_db, toolbar="developer") as url:
        seen = chrome_seen(url, tmp_path / "developer.png")
    assert seen["deploy"] and seen["menu"], seen


def test_overview_shows_deferred_admissions_as_a_person_sees_them(tmp_path):
    path = str(tmp_path / "defer.duckdb")
    fill_goodput_trace(path, slo_unreachable="defer")
    SHOTS.mkdir(parents=True, exist_ok=True)
    charts = "[data-testid=stVegaLiteChart] canvas, [data-testid=stVegaLiteChart] svg"
    with dashboard(tmp_path, trace_db=path) as url, \
            overview(url, 1500, 1600, 1500) as page:  # (charts draw)
        # the page renders top to bottom; on a busy machine the lower sections come later
        title = page.get_by_text("Refused, deferred, timed out and cancelled, by reason")
        title.first.wait_for(timeout=60_000)
        page.wait_for_function(f"document.querySelectorAll({charts!r}).length >= 6",
                               timeout=60_000)
        page.wait_for_timeout(500)  # the last chart's marks
        page.screenshot(path=str(SHOTS / "overview_deferred.png"), full_page=True)
        deferred = page.locator("[data-testid=stMetric]").filter(has_text="Deferred")
        value = deferred.locator("[data-testid=stMetricValue]").inner_text()
        assert int(value) > 0


def saturated_pixels(png: bytes) -> int:
    """Pixels of a strong colour (a bar's, not text, grid or background grey)."""
    import io

    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 80).sum())


def test_a_requests_time_breakdown_draws_its_bar_and_the_latency_key(trace_db, tmp_path):
    """The Requests page's "Where the time went" bar had no height at all (its title and
    legend took the chart's 70 px); the Overview's quantile legend lost p99 off its foot."""
    with dashboard(tmp_path, trace_db=trace_db) as url, \
            overview(url, 1500, 1100, 500) as page:
        key = page.get_by_text("p50 solid, p95 dashed, p99 dotted")
        key.first.wait_for(timeout=60_000)  # the charts draw after the page's script ends
        for _ in range(240):  # on a busy machine one chart at a time: up to 60 s more
            if key.count() == 4:
                break
            page.wait_for_timeout(250)
        assert key.count() == 4
        page.get_by_role("link", name="Requests").click()
        page.get_by_text("Where the time went").first.wait_for(timeout=60_000)
        chart = page.locator("[data-testid=stVegaLiteChart]").filter(
            has_text="Where the time went").first
        chart.wait_for(timeout=60_000)
        chart.scroll_into_view_if_needed()
        # a bar across most of the width, 28 px tall: thousands of coloured pixels (the
        # legend's three squares alone are ~300); the marks draw after the frame
        for _ in range(60):
            page.wait_for_timeout(500)
            png = chart.screenshot(path=str(SHOTS / "request_breakdown.png"))
            if saturated_pixels(png) > 5_000:
                break
        box = chart.bounding_box()
        assert box is not None and box["height"] >= 80
        assert saturated_pixels(png) > 5_000
