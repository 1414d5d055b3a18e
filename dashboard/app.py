"""batchpilot's operator dashboard (Streamlit): `batchpilot dashboard --url URL` over a
running server, or `--trace-db FILE` for a postmortem. Pages are the scripts in views/
(not pages/: Streamlit would list that folder on its own as well)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` from a source checkout
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

PAGES = [("views/overview.py", "Overview", ":material/monitoring:"),
         ("views/scheduler.py", "Scheduler", ":material/view_timeline:"),
         ("views/requests.py", "Requests", ":material/search:"),
         ("views/control.py", "Control", ":material/tune:"),
         ("views/canary.py", "Canary", ":material/compare_arrows:"),
         ("views/fleet.py", "Fleet", ":material/hub:"),
         ("views/whatif.py", "What-if", ":material/query_stats:"),
         ("views/checklist.py", "Go-live checklist", ":material/checklist:")]

st.set_page_config(page_title="batchpilot", page_icon=":material/speed:", layout="wide")
here = Path(__file__).parent
page = st.navigation([st.Page(str(here / path), title=title, icon=icon)
                      for path, title, icon in PAGES])
page.run()
