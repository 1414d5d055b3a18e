"""Go-live checklist: every item of playbooks/checklist.yaml decided from evidence (the
live config, /metrics, the Grafana files, load-test results, the trace, the audit log):
pass, fail or needs-evidence, with the evidence shown; exported as Markdown. The same
evaluation as `batchpilot checklist`."""

from __future__ import annotations

import streamlit as st

from control.checklist import (
    DEFAULT_SPEC,
    ChecklistError,
    ControlClient,
    evaluate,
    gather_evidence,
    load_spec,
    to_markdown,
)
from dashboard.app_paths import ROOT
from dashboard.context import context

ICONS = {"pass": ":material/check_circle:", "fail": ":material/cancel:",
         "needs-evidence": ":material/help:"}
COLORS = {"pass": "green", "fail": "red", "needs-evidence": "orange"}

ctx = context()
st.sidebar.caption(f"Reading {ctx.label}")
st.title("Go-live checklist")


@st.cache_data(ttl=5, show_spinner="Gathering evidence...")
def results(_ctx, label: str) -> list:
    spec = load_spec(DEFAULT_SPEC)
    control = ControlClient(_ctx.source.url, _ctx.token_env) if _ctx.live else None
    evidence = gather_evidence(_ctx.source, control, ROOT, spec=spec)
    return evaluate(spec, evidence)


try:
    items = results(ctx, ctx.label)
except ChecklistError as exc:
    st.error(str(exc))
    st.stop()
counts = {s: sum(r.status == s for r in items) for s in COLORS}
cols = st.columns(3)
for col, (status, n) in zip(cols, counts.items(), strict=True):
    col.metric(status, n)
if counts["fail"]:
    st.error(f"{counts['fail']} item(s) fail: not ready to go live.")
elif counts["needs-evidence"]:
    st.warning(f"Nothing fails, but {counts['needs-evidence']} item(s) need evidence.")
else:
    st.success("Every item passes.")

for section in dict.fromkeys(r.section for r in items):
    st.subheader(section)
    for r in (r for r in items if r.section == section):
        with st.expander(f":{COLORS[r.status]}[{r.status}] {r.title}", icon=ICONS[r.status],
                         expanded=r.status != "pass"):
            st.markdown(r.evidence or "-")
st.download_button("Download the report (Markdown)", to_markdown(items),
                   file_name="go-live-checklist.md", mime="text/markdown",
                   key="bp_checklist_md")
