"""The dashboard's what-if as a person sees it: headless Chromium (Playwright, as `make
screenshots` drives it) on `batchpilot dashboard --url` over a live server whose trace
holds a recent workload. On the Control page a change typed into the form and Predict show
the prediction table (recorded, predicted as-is, proposed, with ratios) and the
extrapolation warning; on the What-if page Compare shows the table and the latency chart
(TTFT, TPOT, E2E panels). Screenshots of both go to $WHATIF_SHOTS (default
/tmp/whatif-ui) for a person to look at. Skipped without Chromium or Playwright, like
tests/dashboard/test_dashboard_browser.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.browser import CHROMIUM, NO_CHROMIUM, dashboard
from fixtures.requires import require_module
from whatif_server import whatif_server

sync_api = require_module("playwright.sync_api", "pip install -e '.[test]'")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
SHOTS = Path(os.environ.get("WHATIF_SHOTS", "/tmp/whatif-ui"))
DONE = ("!document.querySelector('[data-testid=stStatusWidget]')"
        " && !document.querySelector('[data-testid=stSkeleton]')")
TABLE = "[data-testid=stTable]"


@pytest.fixture(scope="module")
def browser_page(tiny_loaded, tmp_path_factory):
    """(dashboard URL, a Chromium page) over the live server."""
    tmp = tmp_path_factory.mktemp("whatif-browser")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with (whatif_server(tiny_loaded, tmp) as server, dashboard(tmp, url=server) as url,
          sync_api.sync_playwright() as p):
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield url, browser.new_page(viewport={"width": 1500, "height": 1100})
        finally:
            browser.close()


def open_page(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("[data-testid=stMainBlockContainer] h1", timeout=60_000)
    page.wait_for_function(DONE, timeout=60_000)


def screenshot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so a tall viewport."""
    height = 0
    for _ in range(4):  # grow until the content fits (it reflows as the viewport grows)
        needed = int(page.evaluate(
            "document.querySelector('[data-testid=stMainBlockContainer]').scrollHeight")) + 200
        if needed <= height:
            break
        height = max(1100, needed)
        page.set_viewport_size({"width": 1500, "height": height})
        page.wait_for_timeout(1000)  # charts redraw at the new size
    page.screenshot(path=str(SHOTS / name), full_page=True)
    page.set_viewport_size({"width": 1500, "height": 1100})


def click_and_wait(page, name: str) -> None:
    page.get_by_role("button", name=name).click()
    page.wait_for_timeout(500)  # the rerun starts
    page.wait_for_function(DONE, timeout=180_000)
    page.wait_for_timeout(1000)  # charts draw


def test_control_page_predicts_the_forms_change(browser_page):
    url, page = browser_page
    open_page(page, f"{url}/control")
    page.get_by_label("max_num_batched_tokens").fill("1024")
    page.get_by_label("prefill_chunk_size").fill("512")
    click_and_wait(page, "Predict")
    screenshot(page, "control_predict.png")
    table = page.locator(TABLE).first
    assert table.is_visible()
    header = table.locator("thead").inner_text()
    for column in ("recorded", "predicted as-is", "proposed", "as-is / recorded",
                   "proposed / as-is"):
        assert column in header, header
    assert "ttft_p99_s" in table.inner_text()
    warning = page.locator("[data-testid=stAlertContentWarning]").first
    assert warning.is_visible() and "larger than any step the fit has seen" in \
        warning.inner_text()
    assert page.locator("[data-testid=stException]").count() == 0


def test_whatif_page_compares_configs_with_charts(browser_page):
    """The configs side by side, and a capacity sweep: goodput and TTFT against rate."""
    url, page = browser_page
    open_page(page, f"{url}/whatif")
    page.get_by_label("capacity sweep", exact=False).fill("0.5, 1, 4")
    click_and_wait(page, "Compare")
    screenshot(page, "whatif.png")
    header = page.locator(TABLE).first.locator("thead").inner_text()
    assert "fewer_seqs / as-is" in header and "smaller_chunk" in header, header
    # TTFT, TPOT, E2E side by side; then the capacity sweep's goodput and TTFT
    charts = page.locator("[data-testid=stVegaLiteChart]")
    assert charts.count() == 2 and all(charts.nth(i).is_visible() for i in range(2))
    assert charts.first.bounding_box()["width"] > 900
    assert charts.nth(1).bounding_box()["width"] > 700
    assert page.get_by_role("heading", name="Capacity").is_visible()
    assert page.get_by_text("the recorded rate with", exact=False).count() >= 1
    assert page.locator("[data-testid=stException]").count() == 0
    assert page.locator("[data-testid=stAlertContentError]").count() == 0


def test_control_page_shows_each_lanes_slo(browser_page):
    """Above the lanes table (whose slo_ttft_s and slo_tpot_s cells edit them), each lane's
    SLO targets in words, and what an empty cell means. The table itself is a canvas: its
    screenshot is for a person to look at."""
    url, page = browser_page
    open_page(page, f"{url}/control")
    caption = page.get_by_text("SLO targets, the table's", exact=False).first
    # the page may still be rendering its lanes after the first run ends (seen beside the
    # bench smokes in make test): wait for the caption, fail if it never shows
    caption.wait_for(state="visible", timeout=30_000)
    assert caption.is_visible()
    text = caption.inner_text()
    for words in ("empty: the default SLO, no targets", "interactive: TTFT 5 s, TPOT 0.5 s",
                  "long_context: TTFT 30 s, TPOT 1 s", "batch: no targets"):
        assert words in text, text
    grid = page.locator("[data-testid=stDataFrame]").first
    grid.scroll_into_view_if_needed()
    assert grid.is_visible() and grid.bounding_box()["width"] > 600
    page.locator("[data-testid=stMainBlockContainer]").screenshot(
        path=str(SHOTS / "control_lanes_slo.png"))
    assert page.locator("[data-testid=stException]").count() == 0

