"""`make screenshots`: a screenshot of every dashboard page, for the README.

Starts `batchpilot serve` on the default model with a trace (127.0.0.1, a free port),
puts a short load on it (the `mixed` scenario, 40 requests, with a live config change
and its rollback in the middle), starts `batchpilot dashboard --url`, and photographs
each page in headless Chromium (Debian's, driven by Playwright) into docs/screenshots/;
the What-if page after pressing Compare, the viewport grown to its prediction's height.
Everything it starts is stopped at the end.

    python -m dashboard.screenshots [--out docs/screenshots] [--requests 40]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"overview": "", "scheduler": "scheduler", "requests": "requests",
         "control": "control", "whatif": "whatif", "checklist": "checklist"}
VIEWPORT = {"width": 1500, "height": 1100}
CLICK = {"whatif": "Compare"}  # pages photographed after pressing a button (a prediction)
DONE = ("!document.querySelector('[data-testid=stSkeleton]')"
        " && !document.querySelector('[data-testid=stStatusWidget]')")
READY = "batchpilot: ready"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    log = tmp / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control.cli.main", "serve", "--model", "smollm2-135m",
             "--port", "0", "--trace-db", str(tmp / "trace.duckdb"), "--log-level",
             "warning"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(READY):
                return proc, line.rsplit(" at ", 1)[1].strip()
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not get ready:\n{log.read_text()}")


def ctl(url: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "control.cli.main", "ctl", "--url", url, *args],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def load(url: str, requests: int) -> None:
    """The mixed scenario; halfway, a config change, and its rollback near the end."""
    test = subprocess.Popen(
        [sys.executable, "-m", "control.cli.main", "loadtest", "--scenario",
         str(ROOT / "playbooks" / "scenarios" / "mixed.yaml"), "--url", url,
         "--requests", str(requests)], cwd=ROOT, stderr=subprocess.DEVNULL)
    version = json.load(urllib.request.urlopen(url + "/control/config"))["version"]
    time.sleep(requests / 3)
    ctl(url, "set", "max_num_seqs=4", "--reason", "screenshots: a change to roll back")
    time.sleep(requests / 3)
    ctl(url, "rollback", str(version), "--reason", "screenshots: rollback")
    if test.wait() != 0:
        raise SystemExit("the load test failed")


def fit_height(page) -> None:
    """Grow the viewport until the page's content fits (it reflows as it grows)."""
    height = VIEWPORT["height"]
    for _ in range(4):
        needed = 200 + int(page.evaluate(
            "document.querySelector('[data-testid=stMainBlockContainer]').scrollHeight"))
        if needed <= height:
            return
        height = needed
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
        page.wait_for_timeout(1000)


def photograph(dashboard_url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: apt-get install -y chromium")
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)
        for name, path in PAGES.items():
            page.goto(f"{dashboard_url}/{path}")
            page.wait_for_selector("[data-testid=stMainBlockContainer] h1", timeout=60_000)
            # the script has finished and every chart is drawn
            page.wait_for_function(DONE, timeout=60_000)
            if name in CLICK:
                page.get_by_role("button", name=CLICK[name]).click()
                page.wait_for_timeout(500)
                page.wait_for_function(DONE, timeout=300_000)
                fit_height(page)  # Streamlit scrolls inside its main block
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            print(f"  {out / (name + '.png')}", flush=True)
            page.set_viewport_size(VIEWPORT)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server, url = start_server(Path(tmp))
        dashboard = None
        try:
            print(f"server at {url}; load test of {args.requests} requests", flush=True)
            load(url, args.requests)
            port = free_port()
            dashboard = subprocess.Popen(
                [sys.executable, "-m", "control.cli.main", "dashboard", "--url", url, "--port",
                 str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(5)
            photograph(f"http://127.0.0.1:{port}", Path(args.out))
        finally:
            for proc in (dashboard, server):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(60)


if __name__ == "__main__":
    main()
