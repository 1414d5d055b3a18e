"""Streamlit AppTest helpers for the dashboard's page tests: the app's pages (read from
dashboard/app.py's source), opening one, and reading what it shows."""

from __future__ import annotations

import ast
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
TIMEOUT_S = 60


def app_pages() -> list[str]:
    """dashboard/app.py's PAGES, read from its source (importing it would run the app), so
    a page added there is smoke-tested here without anyone remembering to list it."""
    tree = ast.parse(Path(APP).read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PAGES"])
    return [path for path, _title, _icon in ast.literal_eval(value)]


PAGES = app_pages()  # PAGES[0] is the page the app opens on
OVERVIEW, SCHEDULER, REQUESTS, CONTROL = (f"views/{name}.py" for name in (
    "overview", "scheduler", "requests", "control"))
CHECKLIST, CANARY, FLEET = "views/checklist.py", "views/canary.py", "views/fleet.py"
NO_CHARTS = {CONTROL, CHECKLIST, "views/whatif.py", CANARY, FLEET}  # over a trace file


def open_page(page: str, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page != PAGES[0]:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("title", "subheader", "caption", "markdown", "info",
                                  "error", "success", "warning")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def problems(at: AppTest) -> list[str]:
    """Errors on the page, except the checklist's verdict (an error by design)."""
    return [e.value for e in at.error if "not ready to go live" not in e.value]


def charts_of(at: AppTest) -> int:
    return len(at.get("vega_lite_chart"))
