"""The trace writer and the metrics on the simulated executor (no model, no HTTP): the
tables agree with each other and with the metrics; overload drops and counts; a database
failure is survived; retention; wait reasons."""

from __future__ import annotations

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control.metrics.observer import Observer
from control.metrics.registry import ServingMetrics
from control.trace.retention import Retention, apply_retention
from control.trace.schema import TABLES, create_schema
from control.trace.writer import StepItem, TraceSettings, TraceWriter
from engine.config import EngineConfig, LiveConfig, StaticConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.sim.executor import FakeClock, SimulatedExecutor


def sim_engine(num_kv_blocks: int = 40, **live) -> Engine:
    clock = FakeClock()
    live = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "prefill_chunk_size": 64,
            **live}
    return Engine(EngineConfig(StaticConfig(num_kv_blocks=num_kv_blocks, block_size=16,
                                            max_model_len=1024), LiveConfig(**live)),
                  SimulatedExecutor(clock=clock, step_cost_s=0.01, eos_every=25), clock=clock)


def add_workload(eng: Engine, n: int = 12, max_tokens: int = 30) -> None:
    for i in range(n):
        eng.add_request(f"r{i}", list(range(1, 40 + i * 7)), SamplingParams(
            max_tokens=max_tokens), tenant="acme" if i % 2 else f"t{i}")


def run(eng: Engine, obs: Observer, max_steps: int = 10_000) -> int:
    steps = 0
    while eng.has_unfinished_requests():
        obs.on_step(eng, eng.step())
        steps += 1
        assert steps < max_steps
    return steps


def samples(metrics: ServingMetrics, obs: Observer | None = None,
            ) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from the rendered exposition."""
    if obs is not None:
        assert obs.sync()
    out = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(values: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in values.items() if n == name
               and all(dict(lab).get(k) == want for k, want in labels.items()))


@pytest.fixture
def traced(tmp_path):
    """A simulated engine with the metrics and a started writer; yields (eng, obs, con)."""
    eng = sim_engine()
    metrics = ServingMetrics("sim", tenants=["acme"])
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb"), kv_snapshot_every=5),
                         "run1", "sim").start()
    obs = Observer(metrics, writer, kv_snapshot_every=5)
    yield eng, obs, writer
    writer.stop()


def test_tables_agree_with_each_other_and_with_the_metrics(traced):
    eng, obs, writer = traced
    add_workload(eng)
    eng.add_request("huge", list(range(1, 2000)), SamplingParams(max_tokens=4))  # too_long
    run(eng, obs)
    assert writer.sync()
    con = writer.cursor()
    one = lambda sql: con.execute(sql).fetchone()  # noqa: E731
    # every step within its budget; its counts match its id lists
    assert one("SELECT count(*) FROM steps WHERE tokens_used > token_budget"
               " OR tokens_used <> num_prefill_tokens + num_decode_tokens"
               " OR len(decode_seqs) <> num_decode_seqs"
               " OR len(prefill_seqs) <> num_prefill_seqs")[0] == 0
    # tokens a request ran across step_requests = prompt - cached + output - 1
    bad = con.execute("""
        SELECT r.request_id FROM requests r JOIN step_requests s USING (run_id, request_id)
        WHERE r.outcome = 'finished' AND r.num_preemptions = 0 GROUP BY ALL
        HAVING sum(s.tokens) <> any_value(r.num_prompt_tokens - r.num_cached_tokens
                                          + r.num_output_tokens - 1)""").fetchall()
    assert bad == []
    # each ended request appears once in requests and once in some step's finished list
    assert one("SELECT count(*), count(DISTINCT request_id) FROM requests") == (13, 13)
    assert one("SELECT count(*) FROM (SELECT unnest(finished) FROM steps)")[0] == 13
    assert one("SELECT count(*) FROM admissions WHERE kind = 'rejected'"
               " AND reason = 'too_long'")[0] == 1
    assert one("SELECT count(*) FROM kv_snapshots")[0] >= 1

    values = samples(obs.metrics, obs)
    steps, prefill, decode, preempted = one(
        "SELECT count(*), sum(num_prefill_tokens), sum(num_decode_tokens),"
        " sum(len(preempted)) FROM steps")
    assert total(values, "batchpilot_engine_steps_total") == steps
    assert total(values, "batchpilot_step_duration_seconds_count") == steps
    assert total(values, "batchpilot_scheduled_tokens_total", kind="prefill") == prefill
    assert total(values, "batchpilot_scheduled_tokens_total", kind="decode") == decode
    assert total(values, "batchpilot_preemptions_total") == preempted
    for outcome, n in con.execute("SELECT outcome, count(*) FROM requests GROUP BY 1").fetchall():
        assert total(values, "batchpilot_requests_total", outcome=outcome) == n
    prompt, output = one("SELECT sum(num_prompt_tokens), sum(num_output_tokens) FROM requests")
    assert total(values, "batchpilot_prompt_tokens_total") == prompt
    assert total(values, "batchpilot_generation_tokens_total") == output
    assert total(values, "batchpilot_time_to_first_token_seconds_count") == one(
        "SELECT count(ttft_s) FROM requests")[0]
    gaps = one("SELECT sum(num_output_tokens - 1) FROM requests WHERE num_output_tokens > 1")
    assert total(values, "batchpilot_inter_token_latency_seconds_count") == gaps[0]
    assert total(values, "batchpilot_admission_decisions_total", decision="rejected",
                 reason="too_long") == 1
    # tenants: the configured one keeps its name, the rest are "other"
    tenants = {dict(lab)["tenant"] for (n, lab) in values if n == "batchpilot_requests_total"}
    assert tenants == {"acme", "default", "other"}  # "default" is always its own
    assert total(values, "batchpilot_kv_blocks_total") == 40
    assert total(values, "batchpilot_running_requests") == 0
    assert total(values, "batchpilot_config_max_num_seqs") == 4
    assert total(values, "batchpilot_trace_records_written_total", table="steps") == steps


def test_a_full_queue_drops_and_counts_records_and_the_engine_goes_on(tmp_path):
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb"), max_queue=5), "r", "sim")
    writer.open()  # not started: nothing drains the queue
    metrics = ServingMetrics("sim")
    obs = Observer(metrics, writer, kv_snapshot_every=1000)
    eng = sim_engine()
    add_workload(eng, n=6)
    steps = run(eng, obs)  # would hang here if a full queue made the engine wait
    stats = writer.stats()
    assert stats.queue_depth == 5
    assert stats.dropped["steps"] == steps - 5  # every step after the first five
    assert stats.dropped["requests"] == 6  # they all ended after the fifth step
    values = samples(metrics, obs)
    assert total(values, "batchpilot_trace_records_dropped_total", table="steps") == \
        stats.dropped["steps"]
    assert total(values, "batchpilot_engine_steps_total") == steps  # metrics lose nothing
    writer.start()
    assert writer.sync()
    assert writer.stats().written["steps"] <= 5
    writer.stop()


def test_a_failing_database_is_counted_and_writing_resumes(traced):
    eng, obs, writer = traced
    side = writer.cursor()
    side.execute("DROP VIEW step_requests")
    side.execute("DROP TABLE steps")  # every flush with step rows now fails
    add_workload(eng, n=3)
    run(eng, obs)
    assert writer.sync()
    stats = writer.stats()
    assert stats.errors >= 1 and stats.dropped["steps"] >= 1
    assert "steps" in stats.last_error
    create_schema(side)  # the operator repairs it; the writer thread is still alive
    add_workload(eng, n=2)
    before = writer.stats().written.get("steps", 0)
    run(eng, obs)
    assert writer.sync()
    assert writer.stats().written["steps"] > before


def test_retention_by_age_and_by_size(tmp_path):
    path = str(tmp_path / "t.duckdb")
    con = duckdb.connect(path)
    create_schema(con)
    con.execute("INSERT INTO steps (run_id, step_id, start_time) SELECT 'r', i, i::DOUBLE"
                " FROM range(1000) t(i)")
    con.execute("INSERT INTO requests (run_id, request_id, finished_time) SELECT 'r',"
                " 'q' || i, i::DOUBLE FROM range(1000) t(i)")
    assert apply_retention(con, path, Retention(max_age_s=100), now=1000.0) == 1800
    assert con.execute("SELECT min(start_time) FROM steps").fetchone()[0] == 900
    deleted = apply_retention(con, path, Retention(max_bytes=1 << 20), now=1000.0)
    assert deleted == 0  # the file is small: the size limit does nothing
    con.execute("INSERT INTO steps (run_id, step_id, start_time, finished) SELECT 'r', i,"
                " 1000 + i, (SELECT list('request-' || x) FROM range(200) u(x)) FROM range(3000)"
                " t(i)")
    con.execute("CHECKPOINT")
    assert apply_retention(con, path, Retention(max_bytes=1 << 20), now=5000.0) > 0
    assert con.execute("SELECT min(start_time) FROM steps").fetchone()[0] > 900
    with pytest.raises(ValueError, match="at least 1 MiB"):
        Retention(max_bytes=10).validate()


def test_wait_reasons_explain_queue_and_preemption_time(traced):
    _, obs, writer = traced
    eng = sim_engine(num_kv_blocks=20)  # 320 tokens for 4 running of up to 150: preemption
    add_workload(eng, n=8, max_tokens=60)
    run(eng, obs)
    assert writer.sync()
    con = writer.cursor()
    rows = con.execute("SELECT request_id, queue_delay_s, preempted_s, wait_reasons,"
                       " num_preemptions, prefill_time_s + decode_time_s FROM requests"
                       " WHERE outcome = 'finished'").fetchall()
    assert any(r[4] > 0 for r in rows), "the workload should preempt"
    for rid, queue_s, preempted_s, reasons, preemptions, ran_s in rows:
        waited = sum(reasons.values())
        assert waited == pytest.approx(queue_s + preempted_s, abs=1e-6), rid
        assert (preempted_s > 0) == (preemptions > 0), rid
        assert preempted_s <= ran_s + 1e-9
    reasons = {r for (r,) in con.execute(
        "SELECT DISTINCT reason FROM admissions WHERE kind = 'queued' AND wait_s > 0"
    ).fetchall()}
    assert "max_num_seqs" in reasons
    assert con.execute("SELECT count(*) FROM admissions WHERE kind = 'requeued'"
                       ).fetchone()[0] == sum(r[4] for r in rows)


def test_time_before_admission_is_tokenize_and_engine_busy(traced):
    # Reached the server 2 s before the engine thread took it, 0.5 s of that tokenizing.
    _, obs, writer = traced
    eng = sim_engine()
    now = eng.clock()
    eng.add_request("late", [1, 2, 3], SamplingParams(max_tokens=2),
                    arrival_time=now - 2.0, tokenize_s=0.5)
    eng.add_request("direct", [1, 2, 3], SamplingParams(max_tokens=2))  # engine API: no gap
    run(eng, obs)
    assert writer.sync()
    rows = dict(writer.cursor().execute(
        "SELECT request_id, wait_reasons FROM requests").fetchall())
    queue_s = writer.cursor().execute(
        "SELECT queue_delay_s FROM requests WHERE request_id = 'late'").fetchone()[0]
    assert queue_s >= 2.0
    assert rows["late"]["tokenize"] == pytest.approx(0.5)
    assert rows["late"]["engine_busy"] == pytest.approx(1.5)
    assert sum(rows["late"].values()) == pytest.approx(queue_s, abs=1e-6)
    assert not {"tokenize", "engine_busy"} & set(rows["direct"])


def test_a_request_preempted_twice_counts_both_requeue_waits(traced):
    """preempted_s is every re-queued wait of the request added up, not the last one."""
    _, obs, writer = traced
    eng = sim_engine(num_kv_blocks=20)
    add_workload(eng, n=6, max_tokens=250)
    run(eng, obs)
    assert writer.sync()
    rows = writer.cursor().execute("""
        SELECT r.request_id, r.num_preemptions, r.preempted_s, sum(a.wait_s)
        FROM requests r JOIN admissions a USING (run_id, request_id)
        WHERE a.kind = 'requeued' GROUP BY ALL""").fetchall()
    assert any(preemptions >= 2 for _, preemptions, _, _ in rows), rows
    for rid, _, preempted_s, requeued_s in rows:
        assert preempted_s == pytest.approx(requeued_s, abs=1e-9), rid


def test_a_wait_row_is_written_at_the_time_the_wait_ended(traced):
    """A queued wait's admissions row is at its end (arrival + wait), where `trace request`
    shows 'queue wait ended', not at the arrival it started from."""
    _, obs, writer = traced
    eng = sim_engine()
    add_workload(eng, n=8)
    run(eng, obs)
    assert writer.sync()
    rows = writer.cursor().execute("""
        SELECT a.request_id, a.time, a.wait_s, r.arrival_time FROM admissions a
        JOIN requests r USING (run_id, request_id) WHERE a.kind = 'queued'""").fetchall()
    assert any(wait_s > 0 for _, _, wait_s, _ in rows), rows
    for rid, time, wait_s, arrival in rows:
        assert time == pytest.approx(arrival + wait_s, abs=1e-9), rid


def test_tokenizing_longer_than_the_gap_is_all_of_it_and_no_more():
    """A tokenize time measured past the engine's arrival-to-admission gap (two clocks) is
    the whole gap: the reasons still add up to the queue delay."""
    from control.trace.waits import before_admission

    assert before_admission(0.25, 0.75) == {"tokenize": 0.25}
    assert before_admission(0.25, -1.0) == {"engine_busy": 0.25}
    assert before_admission(0.0, 0.5) is None


def test_sync_and_stop_commit_everything_submitted(tmp_path):
    writer = TraceWriter(TraceSettings(str(tmp_path / "t.duckdb"), flush_interval_s=60),
                         "r", "sim").start()
    eng = sim_engine()
    add_workload(eng, n=2)
    obs = Observer(None, writer)
    run(eng, obs)
    assert writer.sync(10)  # long before the 60 s flush interval
    assert writer.stats().written["requests"] == 2
    eng.add_request("last", [5, 6, 7], SamplingParams(max_tokens=3))
    run(eng, obs)
    writer.stop()  # commits what is still queued
    con = duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 3
    assert set(TABLES) <= {r[0] for r in con.execute("SHOW TABLES").fetchall()}


def test_an_observer_failure_is_counted_and_never_raises(tmp_path):
    metrics = ServingMetrics("sim")
    obs = Observer(metrics, None)
    eng = sim_engine()
    add_workload(eng, n=1)
    obs.on_step(eng, None)  # a broken input: logged and counted, not raised
    assert total(samples(metrics, obs),
                 "batchpilot_observer_errors_engine_thread_total") == 1
    item = StepItem(None, [], [])
    assert item.kv_row is None


def test_after_a_restart_each_request_keeps_its_own_steps(tmp_path):
    """Two runs in one file (a restart): request numbers start again at 0 in each run, so
    `step_requests` must match a step's numbers within its own run: one row per request
    per step it ran in, never also the other run's request of the same number."""
    path = str(tmp_path / "t.duckdb")
    for run_id in ("before", "after"):
        writer = TraceWriter(TraceSettings(path), run_id, "sim").start()
        eng = sim_engine()
        add_workload(eng, n=3, max_tokens=5)
        run(eng, Observer(None, writer))
        writer.stop()
    con = duckdb.connect(path, read_only=True)
    ran = dict(con.execute("SELECT run_id, sum(len(decode_seqs) + len(prefill_seqs))"
                           " FROM steps GROUP BY run_id").fetchall())
    rows = dict(con.execute("SELECT run_id, count(*) FROM step_requests GROUP BY run_id")
                .fetchall())
    assert rows == ran and set(ran) == {"before", "after"}
