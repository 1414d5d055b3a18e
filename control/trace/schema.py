"""The trace database's tables, declared once: DuckDB DDL and the Arrow schema of each
batch the writer inserts come from the same column list.

Times are seconds since the epoch (DOUBLE, the engine clock); durations are seconds.
`run_id` names one server process, so one file may hold several runs (restarts).
docs/traces.md documents every column and has example queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# 2: steps.fleet_version, steps.predicted_step_s; 3: target_step_s, step_reason;
# 4: requests.trace_id; 5: requests.routing_reason, routing_matched_blocks;
# 6: requests.resent
SCHEMA_VERSION = 6

# type name -> (DuckDB type, Arrow type)
TYPES: dict[str, tuple[str, pa.DataType]] = {
    "str": ("VARCHAR", pa.string()),
    "int": ("BIGINT", pa.int64()),
    "float": ("DOUBLE", pa.float64()),
    "bool": ("BOOLEAN", pa.bool_()),
    "str[]": ("VARCHAR[]", pa.list_(pa.string())),
    "int[]": ("BIGINT[]", pa.list_(pa.int64())),
    "map<str,int>": ("MAP(VARCHAR, BIGINT)", pa.map_(pa.string(), pa.int64())),
    "map<str,float>": ("MAP(VARCHAR, DOUBLE)", pa.map_(pa.string(), pa.float64())),
    "map<str,str>": ("MAP(VARCHAR, VARCHAR)", pa.map_(pa.string(), pa.string())),
}


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column, type name from TYPES)
    time_column: str  # what retention and time windows filter on

    @property
    def column_names(self) -> list[str]:
        return [name for name, _ in self.columns]

    def ddl(self) -> str:
        cols = ", ".join(f"{name} {TYPES[kind][0]}" for name, kind in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({cols})"

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(name, TYPES[kind][1]) for name, kind in self.columns])


STEPS = Table("steps", (
    ("run_id", "str"), ("step_id", "int"), ("start_time", "float"), ("end_time", "float"),
    ("duration_s", "float"), ("schedule_s", "float"), ("execute_s", "float"),
    ("update_s", "float"),
    ("num_prefill_seqs", "int"), ("num_decode_seqs", "int"),
    ("num_prefill_tokens", "int"), ("num_decode_tokens", "int"),
    ("token_budget", "int"), ("tokens_used", "int"), ("max_num_seqs", "int"),
    ("kv_blocks_used", "int"), ("kv_blocks_free", "int"), ("kv_blocks_cached", "int"),
    ("kv_usage", "float"),
    ("running_by_lane", "map<str,int>"), ("waiting_by_lane", "map<str,int>"),
    ("waiting_by_reason", "map<str,int>"), ("waiting_reason_by_lane", "map<str,str>"),
    ("tokens_by_lane", "map<str,int>"),
    # Which requests ran, as their numbers in `request_ids` (integers cost a tenth of the
    # strings to write): each decode seq computed one token; prefill_tokens parallels
    # prefill_seqs. The step_requests view gives them back as request ids.
    ("decode_seqs", "int[]"),
    ("prefill_seqs", "int[]"), ("prefill_tokens", "int[]"),
    ("admitted", "str[]"),  # first scheduled in this step
    ("preempted", "str[]"), ("finished", "str[]"), ("finish_reasons", "str[]"),
    ("config_version", "int"), ("prefix_query_tokens", "int"), ("prefix_hit_tokens", "int"),
    # NOTE: last, so a file from before it (schema 1) gains it by ALTER TABLE in the same
    # position the writer's positional INSERT expects. NULL on a single server.
    ("fleet_version", "int"),  # the fleet config version a replica ran the step under
    ("predicted_step_s", "float"),  # the start-up step law's time of the step; NULL: none
    # the step's time target and why: target | grow_for_slo | grow_for_throughput | fixed
    # (engine/scheduling/goodput.py); NULL without a step law
    ("target_step_s", "float"), ("step_reason", "str"),
), "start_time")

REQUESTS = Table("requests", (
    ("run_id", "str"), ("request_id", "str"), ("model", "str"), ("lane", "str"),
    ("tenant", "str"), ("priority", "int"),
    ("outcome", "str"),  # finished | cancelled | timeout | rejected | error
    ("finish_reason", "str"), ("finish_detail", "str"),
    ("num_prompt_tokens", "int"), ("num_output_tokens", "int"), ("num_cached_tokens", "int"),
    ("num_preemptions", "int"),
    ("arrival_time", "float"), ("admitted_time", "float"), ("first_scheduled_time", "float"),
    ("first_token_time", "float"), ("finished_time", "float"), ("deadline", "float"),
    ("queue_delay_s", "float"), ("ttft_s", "float"), ("tpot_s", "float"), ("e2e_s", "float"),
    ("prefill_time_s", "float"), ("decode_time_s", "float"),
    ("preempted_s", "float"),  # re-queued after preemption (inside prefill/decode time)
    ("wait_reasons", "map<str,float>"),  # seconds queued, by why it was not started
    ("trace_id", "str"),  # its distributed trace (W3C, 32 hex; control/otel); schema 4
    # a fleet replica's: why its ingress sent the request here (control/api/routed.py), and
    # under precise routing the prompt's leading blocks its KV index said this one held
    ("routing_reason", "str"), ("routing_matched_blocks", "int"),  # schema 5
    # its client's resend after a refusal (X-Stainless-Retry-Count > 0): admitted
    # deferred (engine/lanes/admission.py); the what-if replays it so; schema 6
    ("resent", "bool"),
), "finished_time")

KV_SNAPSHOTS = Table("kv_snapshots", (
    ("run_id", "str"), ("step_id", "int"), ("time", "float"),
    ("trigger", "str"),  # periodic | above_high_watermark | below_high_watermark | ...
    ("total", "int"), ("used", "int"), ("free", "int"), ("cached", "int"),
    ("usage", "float"), ("high_watermark", "float"), ("reject_watermark", "float"),
    ("by_lane", "map<str,int>"), ("by_tenant", "map<str,int>"),
), "time")

ADMISSIONS = Table("admissions", (
    ("run_id", "str"), ("time", "float"), ("request_id", "str"), ("lane", "str"),
    ("tenant", "str"), ("priority", "int"), ("num_prompt_tokens", "int"),
    # admitted | rejected (at arrival); queued | requeued (a wait, written when it ends)
    ("kind", "str"),
    ("reason", "str"),  # rejection reason, or the main reason of a wait
    ("message", "str"), ("retry_after_s", "float"), ("estimated_wait_s", "float"),
    ("wait_s", "float"),  # waits only
    ("wait_reasons", "map<str,float>"),  # waits only: seconds by reason
), "time")

CONFIG_CHANGES = Table("config_changes", (
    ("run_id", "str"), ("time", "float"), ("version", "int"), ("source", "str"),
    ("actor", "str"), ("change", "str"),  # JSON: {field: [old, new]}
    ("note", "str"),
), "time")

REQUEST_IDS = Table("request_ids", (
    ("run_id", "str"), ("seq", "int"),  # numbered in order of first appearance, per run
    ("request_id", "str"), ("time", "float"),
), "time")

RUNS = Table("runs", (
    ("run_id", "str"), ("started", "float"), ("model", "str"), ("schema_version", "int"),
    ("settings", "str"),  # JSON
), "started")

TABLES: dict[str, Table] = {t.name: t for t in (
    STEPS, REQUESTS, KV_SNAPSHOTS, ADMISSIONS, CONFIG_CHANGES, REQUEST_IDS, RUNS)}

# One row per request per step it ran in. A view over `steps`: the writer stores each
# step's requests as lists of their numbers (one row per step instead of one per request
# per step), and `request_ids` turns the numbers back into ids.
STEP_REQUESTS_VIEW = """
CREATE OR REPLACE VIEW step_requests AS
WITH ran AS (
    SELECT run_id, step_id, start_time, end_time, unnest(decode_seqs) AS seq,
           'decode' AS phase, 1::BIGINT AS tokens
    FROM steps
    UNION ALL
    SELECT run_id, step_id, start_time, end_time, unnest(prefill_seqs) AS seq,
           'prefill' AS phase, unnest(prefill_tokens) AS tokens
    FROM steps
)
SELECT ran.run_id, step_id, start_time, end_time, request_id, phase, tokens
FROM ran JOIN request_ids USING (run_id, seq)
"""


def create_schema(con) -> None:
    """Create every table and view (idempotent). `con`: a read-write DuckDB connection.
    A file written by an older batchpilot gains the columns added since (NULL in its rows);
    new columns are only ever appended, so column positions stay as declared."""
    for table in TABLES.values():
        con.execute(table.ddl())
        for name, kind in table.columns:
            con.execute(f"ALTER TABLE {table.name} ADD COLUMN IF NOT EXISTS {name}"
                        f" {TYPES[kind][0]}")
    con.execute(STEP_REQUESTS_VIEW)
