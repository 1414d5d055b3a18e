"""The go-live checklist's facts from a trace (control/trace/facts.py): of the latest run
when the file holds several (a restarted server), on hand-made rows."""

from __future__ import annotations

import duckdb

from control.trace.facts import checklist_facts
from control.trace.schema import create_schema


def test_the_facts_are_of_the_run_that_started_last():
    con = duckdb.connect()
    create_schema(con)
    for run_id, started, seqs in (("new", 2000.0, 64), ("old", 1000.0, 8)):
        con.execute("INSERT INTO runs (run_id, started, model, schema_version, settings)"
                    " VALUES (?, ?, 'm', 6, '{}')", [run_id, started])
        con.execute("INSERT INTO steps (run_id, step_id, start_time, max_num_seqs,"
                    " token_budget, kv_blocks_used, kv_blocks_free, running_by_lane,"
                    " config_version) VALUES (?, 1, ?, ?, 256, 3, 97, MAP {'a': 1}, 1)",
                    [run_id, started + 1.0, seqs])
    facts = checklist_facts(con)
    assert facts["run"]["run_id"] == "new"
    assert facts["last_step"]["max_num_seqs"] == 64
    assert facts["last_step"]["kv_blocks_total"] == 100
    assert facts["cancelled"] == 0 and facts["last_cancel"] is None


def test_a_prompt_of_exactly_the_long_length_counts_as_long():
    from control.loadtest.store import create_tables
    from control.trace.facts import loadtest_stats

    con = duckdb.connect()
    create_tables(con)
    con.execute("INSERT INTO loadtest_runs (run_id, label, started) VALUES ('lt', 'a', 1.0)")
    for i, prompt in enumerate((511, 512, 2000)):
        con.execute("INSERT INTO loadtest_requests (run_id, label, sent_at, prompt_tokens,"
                    " output_tokens, outcome, stream) VALUES ('lt', 'a', ?, ?, 10, 'ok',"
                    " true)", [float(i), prompt])
    [row] = loadtest_stats(con, long_prompt_tokens=512)
    assert row["requests"] == 3 and row["long_prompts"] == 2
