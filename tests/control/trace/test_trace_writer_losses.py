"""What the trace writer counts and keeps when records are lost or requests end in a queue
(control/trace/writer.py): every dropped row is counted by its table, a failed flush
counts all its rows, and a request cancelled while queued keeps its queue wait row."""

from __future__ import annotations

from test_trace_writer import run, sim_engine

from control.metrics.observer import Observer
from control.metrics.registry import ServingMetrics
from control.trace.writer import StepItem, TraceSettings, TraceWriter
from engine.records import AdmissionDecision
from engine.request import SamplingParams


def _decisions(n: int) -> list[AdmissionDecision]:
    return [AdmissionDecision(True, f"r{i}", lane="default", tenant="t", time=1.0 + i)
            for i in range(n)]


def test_a_full_queue_counts_each_dropped_admission(tmp_path):
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb"), max_queue=0), "r", "sim")
    writer.open()
    assert not writer.submit(StepItem(None, [], _decisions(3)))
    dropped = writer.stats().dropped
    assert dropped.get("admissions") == 3
    assert not dropped.get("steps") and not dropped.get("requests")
    writer.stop()


def test_a_failed_flush_counts_every_row_it_lost(tmp_path):
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb")), "r", "sim").start()
    try:
        writer.cursor().execute("DROP TABLE admissions")  # every flush with admissions fails
        assert writer.submit(StepItem(None, [], _decisions(4)))
        assert writer.sync()
        stats = writer.stats()
        assert stats.errors == 1
        assert stats.dropped["admissions"] == 4  # rows, not flushes
        assert not stats.written.get("admissions")
    finally:
        writer.stop()


def test_a_request_cancelled_in_the_queue_keeps_its_queue_wait(tmp_path):
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb")), "run1", "sim").start()
    try:
        obs = Observer(ServingMetrics("sim"), writer, kv_snapshot_every=1000)
        eng = sim_engine(max_num_seqs=1)
        eng.add_request("long", list(range(1, 30)), SamplingParams(max_tokens=20,
                                                                    ignore_eos=True))
        eng.add_request("queued", list(range(1, 30)), SamplingParams(max_tokens=5))
        for _ in range(3):
            obs.on_step(eng, eng.step())
        assert eng.abort("queued")  # still waiting behind max_num_seqs=1
        run(eng, obs)
        assert writer.sync()
        rows = writer.cursor().execute(
            "SELECT kind, reason, wait_s FROM admissions WHERE request_id = 'queued'"
            " AND kind IN ('queued', 'requeued')").fetchall()
        assert len(rows) == 1, rows
        kind, reason, wait_s = rows[0]
        assert kind == "queued" and reason == "max_num_seqs" and wait_s > 0
    finally:
        writer.stop()
