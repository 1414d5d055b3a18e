"""The goodput policy's step sizes in the trace (engine/scheduling/goodput.py): each step's
target and reason are written to `steps`, shown by `trace steps`, and `trace slow` says
which step sizes a slow request waited through; a shed request is in `admissions`."""

from __future__ import annotations

from fixtures.trace_data import fill_goodput_trace

from control.trace import format as fmt
from control.trace import queries, series
from control.trace.store import open_read_only


def test_steps_carry_their_target_and_reason_and_slow_requests_say_what_they_waited_through(
        tmp_path):
    path = str(tmp_path / "trace.duckdb")
    fill_goodput_trace(path)
    con = open_read_only(path)
    try:
        reasons = dict(con.execute("SELECT step_reason, count(*) FROM steps GROUP BY ALL")
                       .fetchall())
        targets = {r: t for r, t in con.execute(
            "SELECT step_reason, max(target_step_s) FROM steps GROUP BY ALL").fetchall()}
        shed = con.execute("SELECT count(*), min(retry_after_s) FROM admissions WHERE"
                           " reason = 'slo_unreachable'").fetchone()
        steps = queries.steps(con, limit=5000)
        slow = queries.slow(con, limit=3, by="ttft_s")
    finally:
        con.close()
    assert set(reasons) <= {"target", "grow_for_slo", "grow_for_throughput"}
    assert reasons.get("grow_for_slo", 0) + reasons.get("grow_for_throughput", 0) > 0
    assert max(targets.values()) > 0.25 and min(targets.values()) >= 0.25
    assert shed[0] > 0 and shed[1] >= 1.0  # the queue kept some from their TTFT
    grown = next(s for s in steps if s["step_reason"] != "target")
    line = fmt.steps([grown])
    assert grown["step_reason"] in line and "target:" in line
    assert slow and all(r["step_reasons"] for r in slow)
    text = fmt.slow(slow, "ttft_s")
    assert "steps until 1st token" in text
    top = max(slow[0]["step_reasons"], key=slow[0]["step_reasons"].get)
    assert f"{top} {slow[0]['step_reasons'][top]}/" in text


def test_deferred_admissions_are_counted_in_the_summary_the_series_and_its_text(tmp_path):
    """Under slo_unreachable: defer the burst's late requests are admitted deferred, not
    refused: the summary counts them by reason, the outcome series has them by their
    admission's bucket, and `trace summary` prints them; a shed burst has none."""
    deferred_db, shed_db = str(tmp_path / "defer.duckdb"), str(tmp_path / "shed.duckdb")
    fill_goodput_trace(deferred_db, slo_unreachable="defer")
    fill_goodput_trace(shed_db)
    con = open_read_only(deferred_db)
    try:
        admitted = con.execute("SELECT count(*) FROM admissions WHERE kind = 'admitted' AND"
                               " reason = 'slo_deferred'").fetchone()[0]
        summary = queries.summary(con)
        rows = series.outcome_series(con, buckets=20)["rows"]
    finally:
        con.close()
    assert admitted > 0
    assert summary["deferred"] == [{"reason": "slo_deferred", "requests": admitted}]
    assert sum(r["requests"] for r in rows if r["outcome"] == "deferred") == admitted
    assert {r["reason"] for r in rows if r["outcome"] == "deferred"} == {"slo_deferred"}
    section = fmt.summary(summary).split("admitted deferred", 1)[1].splitlines()
    assert any(line.split() == ["slo_deferred", str(admitted)] for line in section)
    con = open_read_only(shed_db)
    try:
        assert queries.summary(con)["deferred"] == []
        assert all(r["outcome"] != "deferred" for r in series.outcome_series(con)["rows"])
    finally:
        con.close()
