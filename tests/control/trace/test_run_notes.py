"""TraceWriter.note_run: what a run learns after it started (the start-up step law) is
added to its `runs.settings`, keeping what was there."""

from __future__ import annotations

import json

from control.trace.store import open_read_only
from control.trace.writer import TraceSettings, TraceWriter


def test_a_note_is_merged_into_the_runs_settings(tmp_path):
    path = str(tmp_path / "t.duckdb")
    writer = TraceWriter(TraceSettings(path), "run1", "m", {"model": "m", "device": "cpu"})
    writer.start()
    writer.note_run(step_law={"fixed_ms": 40.0}, target_step_ms=250)
    writer.note_run(target_step_ms=100)  # a later note wins
    assert writer.sync(10)
    writer.stop()
    con = open_read_only(path)
    try:
        (settings,), = con.execute("SELECT settings FROM runs WHERE run_id = 'run1'").fetchall()
    finally:
        con.close()
    assert json.loads(settings) == {"model": "m", "device": "cpu",
                                    "step_law": {"fixed_ms": 40.0}, "target_step_ms": 100}
