"""A prediction the server makes (POST /v1/whatif) is kept in its trace's audit
(`config_changes`, source `whatif`): the diff it predicted, who asked, the headline ratios;
the go-live checklist matches a later change to it. A refused prediction leaves no row."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_whatif_api import LIVE, _app, _post
from whatif_sim_trace import START, record

from control.checklist import Evidence, evaluate, load_spec
from control.trace.format import clock_span
from control.trace.writer import TraceSettings, TraceWriter


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("audit") / "trace.duckdb")
    record(path, LIVE, n=40)
    writer = TraceWriter(TraceSettings(path), "run2", "sim").start()
    yield _app(writer), writer
    writer.stop()


def audit_rows(writer: TraceWriter) -> list[dict]:
    assert writer.sync(10)
    con = writer.cursor()
    try:
        rows = con.execute("SELECT time, version, source, actor, change, note FROM"
                           " config_changes ORDER BY time").fetchall()
    finally:
        con.close()
    return [dict(zip(("time", "version", "source", "actor", "change", "note"), r,
                     strict=True)) for r in rows]


def test_each_proposal_that_changes_something_is_recorded(served):
    app, writer = served
    before = len(audit_rows(writer))
    resp = _post(app, {"since": START, "set": {"max_num_seqs": 2},
                       "compare": {"same": {"max_num_seqs": 8}}})  # 8: the recorded value
    assert resp.status_code == 200, resp.text
    rows = audit_rows(writer)[before:]
    assert len(rows) == 1, rows  # "same" changes nothing: no row
    entry = rows[0]
    assert entry["source"] == "whatif" and entry["actor"] == "local"
    assert entry["version"] == LIVE.version
    assert json.loads(entry["change"]) == {"max_num_seqs": [8, 2]}
    assert "what-if 'proposed' over 40 requests" in entry["note"]
    assert f"({clock_span(*(resp.json()['window'][k] for k in ('since', 'until')))})" \
        in entry["note"]  # its window in clock times, as the trace prints them
    ratio = next(r for r in resp.json()["rows"] if r["metric"] == "ttft_p99_s")
    assert f"ttft_p99_s {ratio['ratios']['proposed']:.2f}x" in entry["note"]

    # the checklist: a change to those values after it was predicted; one to others is not
    spec = load_spec()
    applied = {"time": entry["time"] + 60, "version": 2, "source": "api", "actor": "ops",
               "change": json.dumps({"max_num_seqs": [8, 2]}), "note": ""}
    got = next(r for r in evaluate(spec, Evidence(config_changes=[*rows, applied]))
               if r.id == "change_predicted")
    assert got.status == "pass", got.evidence
    other = {**applied, "change": json.dumps({"max_num_seqs": [8, 3]})}
    got = next(r for r in evaluate(spec, Evidence(config_changes=[*rows, other]))
               if r.id == "change_predicted")
    assert got.status == "fail", got.evidence


def test_a_refused_prediction_records_nothing(served):
    app, writer = served
    before = len(audit_rows(writer))
    assert _post(app, {"set": {"max_num_seqs": 0}}).status_code == 400
    assert len(audit_rows(writer)) == before


def test_a_proposal_of_the_windows_own_values_is_recorded_when_the_live_config_moved(served):
    """docs/checklist.md's recipe after a profile and a rollback: the window began under
    max_num_seqs=8, the server runs 32 now; `whatif --set max_num_seqs=8` changes nothing
    in the replay but would change the live config, and `ctl set max_num_seqs=8` after it
    is a predicted change."""
    app, writer = served
    engine, before = app.state.serving.engine, len(audit_rows(writer))
    app.state.serving.config_store = SimpleNamespace(history=[SimpleNamespace(
        version=LIVE.version, live=LIVE)])  # the window's version, still in the history
    engine.live_config = LIVE.replace(max_num_seqs=32, version=LIVE.version + 2)
    try:
        resp = _post(app, {"since": START, "set": {"max_num_seqs": 8}})
    finally:
        engine.live_config, app.state.serving.config_store = LIVE, None
    assert resp.status_code == 200, resp.text
    assert resp.json()["configs"]["proposed"]["diff"] == {}  # the replay's: no change
    assert any("the config changed since the window began" in n and "max_num_seqs" in n
               for n in resp.json()["notes"]), resp.json()["notes"]
    rows = audit_rows(writer)[before:]
    assert [json.loads(r["change"]) for r in rows] == [{"max_num_seqs": [32, 8]}]
    assert rows[0]["version"] == LIVE.version + 2  # asked under the live version
    applied = {"time": rows[0]["time"] + 60, "version": LIVE.version + 3, "source": "api",
               "actor": "ops", "change": json.dumps({"max_num_seqs": [32, 8]}), "note": ""}
    got = next(r for r in evaluate(load_spec(), Evidence(config_changes=[*rows, applied]))
               if r.id == "change_predicted")
    assert got.status == "pass", got.evidence


def test_each_compared_config_notes_its_own_ratios_and_warnings(served):
    app, writer = served
    before = len(audit_rows(writer))
    resp = _post(app, {"since": START, "set": {"max_num_seqs": 2},
                       "compare": {"wide": {"max_num_seqs": 16}}})
    assert resp.status_code == 200, resp.text
    result = resp.json()
    notes = {r["note"].split("'")[1]: r["note"] for r in audit_rows(writer)[before:]}
    assert set(notes) == {"proposed", "wide"}
    ttft = next(r for r in result["rows"] if r["metric"] == "ttft_p99_s")["ratios"]
    assert f"{ttft['proposed']:.2f}" != f"{ttft['wide']:.2f}"  # else the test proves nothing
    warnings = f"; {len(result['warnings'])} warning(s)"
    assert len(result["warnings"]) != len(result["notes"]), result
    for name, note in notes.items():
        assert f"ttft_p99_s {ttft[name]:.2f}x" in note and note.endswith(warnings), note


def test_a_proposal_for_a_lane_the_live_config_dropped_is_still_recorded(served):
    """The window ran with a "batch" lane, the server runs without it now: a proposal that
    sends a tenant there is replayed on the window's config, and recorded as its own diff
    (it does not apply to the live config), not refused with a 500."""
    app, writer = served
    engine, before = app.state.serving.engine, len(audit_rows(writer))
    app.state.serving.config_store = SimpleNamespace(history=[SimpleNamespace(
        version=LIVE.version, live=LIVE)])
    engine.live_config = LIVE.replace(lanes=LIVE.lanes[:1], version=LIVE.version + 2)
    try:
        resp = _post(app, {"since": START, "set": {"tenant_lanes": {"chat": "batch"}}})
    finally:
        engine.live_config, app.state.serving.config_store = LIVE, None
    assert resp.status_code == 200, resp.text
    rows = audit_rows(writer)[before:]
    assert [json.loads(r["change"]) for r in rows] == [{"tenant_lanes.chat": [None, "batch"]}]
