"""The dashboard in a real browser (headless Chromium driven by Playwright, as `make
screenshots` runs it): launched the way `batchpilot dashboard` launches it, from a directory
other than the repository's, it shows no Streamlit developer chrome (no Deploy button, no
developer menu); launched with Streamlit's developer toolbar, the same check finds the
Deploy button, so the check can see it. Skipped without Chromium or Playwright (`make
screenshots` installs both: Debian's chromium, the `screenshots` extra)."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures.trace_data import fill_trace

from control.cli.ctl import TOKEN_ENV
from control.cli.dashboard import streamlit_command

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if os.environ.get("CI") and CHROMIUM is None:  # `make test` installs it: CI must run these
    raise RuntimeError("CI without chromium: `make system-deps` installs it")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (`make system-deps`"
                                " installs Debian's)")
DEPLOY = "[data-testid=stAppDeployButton]"
MENU = "[data-testid=stMainMenu]"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def trace_db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("browser") / "trace.duckdb")
    fill_trace(path).stop()
    return path


@contextmanager
def dashboard(trace_db: str, cwd: Path, toolbar: str | None = None) -> Iterator[str]:
    """`batchpilot dashboard --trace-db` (its exact streamlit command line) run from `cwd`;
    `toolbar` replaces its toolbar mode. Yields the URL once Streamlit answers."""
    port = free_port()
    args = argparse.Namespace(url=None, trace_db=trace_db, host="127.0.0.1", port=port,
                              token_env=TOKEN_ENV)
    cmd = streamlit_command(args)
    if toolbar is not None:
        cmd[cmd.index("--client.toolbarMode") + 1] = toolbar
    log = cwd / f"streamlit-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def chrome_seen(url: str, screenshot: Path) -> dict[str, bool]:
    """Open the Overview page once its script has run; what of Streamlit's chrome shows."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            page.wait_for_selector("[data-testid=stMainBlockContainer] h1", timeout=60_000)
            page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')",
                                   timeout=60_000)
            page.wait_for_timeout(500)  # the toolbar renders with the first script run
            page.screenshot(path=str(screenshot))
            return {"deploy": page.locator(DEPLOY).is_visible()
                    or page.get_by_text("Deploy", exact=True).count() > 0,
                    "menu": page.locator(MENU).is_visible(),
                    "title": "batchpilot" in page.title()}
        finally:
            browser.close()


def test_dashboard_shows_no_deploy_button_or_developer_menu(trace_db, tmp_path):
    with dashboard(trace_db, tmp_path) as url:
        seen = chrome_seen(url, tmp_path / "overview.png")
    assert seen == {"deploy": False, "menu": False, "title": True}


def test_the_check_sees_the_deploy_button_of_the_developer_toolbar(trace_db, tmp_path):
    with dashboard(trace_db, tmp_path, toolbar="developer") as url:
        seen = chrome_seen(url, tmp_path / "developer.png")
    assert seen["deploy"] and seen["menu"], seen
