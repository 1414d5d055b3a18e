"""A window of the trace, read once: its requests, what the engine did meanwhile, and the
steps to calibrate on. Plain dataclasses and numpy arrays (picklable: the server reads the
window on a thread, where its DuckDB cursor lives, and predicts in another process).

    window = read_window(con, since, until)   # con: a read-only file or the server's cursor

A request belongs to the window when it arrived in [since, until]; only ended requests
are in the trace (one still in flight has no `requests` row yet). The window's own span
(`Window.since` .. `Window.until`, the replay's start and the denominator of every rate:
goodput, the offered rate of a capacity sweep) is its traffic's: from its first arrival to
its last end, within [since, until]. `--since -1h` over a one-minute load test is a minute
of traffic, not an hour in which a minute was busy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from control.trace.audit_sources import LAW_REFIT_SOURCE, is_config_version
from control.trace.format import clock
from control.trace.queries import checked_window
from control.whatif.calibrate import FEATURES, StepSamples
from engine.calibration.step_law import StepLaw

# how a replayed config turns the law into step sizes (engine/scheduling/goodput.py)
POLICY_NOTE = ("each config under its own step_policy (goodput: grown from the target for the"
               " lanes' SLOs; fixed: held to it)")
CALIBRATION_MAX_STEPS = 200_000  # the latest steps of the window's model and device

_REQUEST_COLUMNS = (
    "run_id, request_id, lane, tenant, priority, outcome, finish_detail, num_prompt_tokens,"
    " num_output_tokens, num_cached_tokens, num_preemptions, arrival_time, finished_time,"
    " deadline, queue_delay_s, ttft_s, tpot_s, e2e_s,"
    " coalesce(map_extract(wait_reasons, 'tokenize')[1], 0)::DOUBLE AS tokenize_s, {resent}")


@dataclass(frozen=True)
class RecordedRequest:
    """One `requests` row (times: epoch s on the engine clock; durations: s)."""

    run_id: str
    request_id: str
    lane: str
    tenant: str
    priority: int
    outcome: str  # finished | cancelled | timeout | rejected | error
    finish_detail: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    arrival_time: float
    finished_time: float | None
    deadline: float | None
    queue_delay_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    tokenize_s: float  # seconds the server spent tokenizing it (its wait_reasons)
    resent: bool = False  # its client's resend after a refusal (replayed as one)


@dataclass(frozen=True)
class EngineFacts:
    """What the steps say about the config in force at the window's first step."""

    run_id: str
    config_version: int
    max_num_batched_tokens: int
    max_num_seqs: int
    num_kv_blocks: int  # kv_blocks_used + kv_blocks_free
    max_prefill_chunk: int  # the largest prompt chunk one request ran in a step
    config_changes: int  # changes made inside the window (the replay keeps the first)
    running_at_start: int  # requests running when the window opened (not replayed)
    kv_peak_blocks: int  # the most KV blocks held after any step of the window
    preempted: int  # preemptions in the window's steps


@dataclass
class Window:
    since: float
    until: float
    model: str
    device: str
    run_settings: dict[str, Any]
    requests: list[RecordedRequest]
    facts: EngineFacts
    itl_s: dict[str, list[float]]  # request_id -> gaps between its tokens (s)
    samples: StepSamples
    notes: list[str] = field(default_factory=list)
    # the law in force at the window's start when the server had refitted it from served
    # steps before then (a step_law_refit audit row: engine/calibration/online_law.py)
    law_refit: dict[str, Any] | None = None
    # the run's config changes up to the version in force at the window's first step, in
    # order, as recorded ({dotted key: [old, new]}): a trace file holds the starting config
    # only as the YAML or defaults it started from, and the rest as these diffs
    changes: list[dict[str, list[Any]]] = field(default_factory=list)

    @property
    def step_law(self) -> StepLaw | None:
        """The step law the server held its steps to at the window's start: its last
        online refit before then, else the one it fitted at start-up (the run's settings);
        None for a server without one, or an older trace."""
        law = self.law_refit or self.run_settings.get("step_law")
        return StepLaw.from_dict(law) if law else None

    @property
    def duration_s(self) -> float:
        return max(self.until - self.since, 1e-9)


def _rows(con, sql: str, params: list[Any]) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def _has_column(con, table: str, column: str) -> bool:
    return bool(_rows(con, "SELECT 1 FROM information_schema.columns WHERE table_name = ?"
                      " AND column_name = ?", [table, column]))


def read_requests(con, since: float | None, until: float | None) -> list[RecordedRequest]:
    lo = -1e300 if since is None else since
    hi = 1e300 if until is None else until
    # a trace written before schema 6 (opened read-only, so not migrated) has no resends
    resent = "coalesce(resent, false)" if _has_column(con, "requests", "resent") else "false"
    columns = _REQUEST_COLUMNS.format(resent=f"{resent} AS resent")
    rows = _rows(con, f"SELECT {columns} FROM requests WHERE arrival_time >= ?"
                 " AND arrival_time <= ? ORDER BY arrival_time, request_id", [lo, hi])
    return [RecordedRequest(*r) for r in rows]  # a day: 170k rows, ~1 s


def _run(con, run_id: str) -> tuple[str, str, dict[str, Any]]:
    """(model, device, settings) of a run; device "" where the run did not record one."""
    row = _rows(con, "SELECT model, settings FROM runs WHERE run_id = ?", [run_id])
    if not row:
        return "", "", {}
    settings = json.loads(row[0][1] or "{}")
    return row[0][0] or "", str(settings.get("device") or ""), settings


def _facts(con, run_id: str, since: float, until: float) -> EngineFacts:
    first = _rows(con, "SELECT config_version, token_budget, max_num_seqs,"
                  " kv_blocks_used + kv_blocks_free,"
                  " list_sum(map_values(running_by_lane)) - len(admitted) FROM steps"
                  " WHERE run_id = ? AND start_time >= ? ORDER BY step_id LIMIT 1",
                  [run_id, since])
    if not first:
        raise ValueError(f"run {run_id!r} has no step from since={since} on: the trace lost"
                         " them (writer queue full?) or retention removed them")
    version, budget, seqs, blocks, running = first[0]
    agg = _rows(con, "SELECT coalesce(max(list_max(prefill_tokens)), 0),"
                " coalesce(max(kv_blocks_used), 0), coalesce(sum(len(preempted)), 0),"
                " count(DISTINCT config_version) FROM steps"
                " WHERE run_id = ? AND start_time >= ? AND start_time <= ?",
                [run_id, since, until])[0]
    return EngineFacts(run_id, int(version), int(budget), int(seqs), int(blocks), int(agg[0]),
                       max(int(agg[3]) - 1, 0), max(int(running or 0), 0), int(agg[1]),
                       int(agg[2]))


def read_itl(con, run_id: str, since: float, until: float) -> dict[str, list[float]]:
    """Gaps between a request's consecutive tokens: each decode step's end minus the end of
    the step before it that ran the request (its last prompt chunk for the first gap)."""
    rows = _rows(con, """
        WITH sr AS (
            SELECT request_id, phase, end_time, lag(end_time) OVER (
                PARTITION BY request_id ORDER BY step_id) AS prev
            FROM step_requests WHERE run_id = ? AND start_time >= ? AND start_time <= ?)
        SELECT request_id, end_time - prev FROM sr
        WHERE phase = 'decode' AND prev IS NOT NULL""", [run_id, since, until])
    out: dict[str, list[float]] = {}
    for request_id, gap in rows:
        out.setdefault(request_id, []).append(float(gap))
    return out


def read_samples(con, run_ids: list[str], until: float, group: str) -> StepSamples:
    """The latest CALIBRATION_MAX_STEPS steps of `run_ids` up to `until`, as features."""
    marks = ", ".join("?" for _ in run_ids)
    lo = _rows(con, f"SELECT coalesce(min(start_time), 0) FROM (SELECT start_time FROM steps"
               f" WHERE run_id IN ({marks}) AND start_time <= ? ORDER BY start_time DESC"
               f" LIMIT {CALIBRATION_MAX_STEPS})", [*run_ids, until])[0][0]
    # NOTE: read as numpy columns (fetchnumpy), not Python rows: 200k steps in ~0.1 s
    cols = con.execute(f"""
        WITH ran AS (
            SELECT run_id, step_id, request_id, phase, tokens, sum(tokens) OVER (
                PARTITION BY run_id, request_id ORDER BY step_id
                ROWS UNBOUNDED PRECEDING) AS done
            FROM step_requests WHERE run_id IN ({marks}) AND start_time BETWEEN ? AND ?),
        ctx AS (  -- a decode attends all it holds; a chunk of n from `start`: step_law's pairs
            SELECT ran.run_id, step_id,
                   sum(CASE WHEN phase = 'decode'
                       THEN done + coalesce(r.num_cached_tokens, 0) ELSE 0 END) AS decode_ctx,
                   sum(CASE WHEN phase = 'prefill'
                       THEN tokens * (done - tokens + coalesce(r.num_cached_tokens, 0))
                            + tokens * (tokens + 1) / 2 ELSE 0 END) AS pairs
            FROM ran LEFT JOIN requests r USING (run_id, request_id)
            GROUP BY ran.run_id, step_id)
        SELECT s.run_id, s.step_id::DOUBLE AS step_id, s.start_time::DOUBLE AS start,
               s.end_time::DOUBLE AS "end", s.num_prefill_tokens::DOUBLE AS prefill,
               s.num_decode_tokens::DOUBLE AS decode,
               coalesce(ctx.decode_ctx, 0)::DOUBLE AS ctx,
               coalesce(ctx.pairs, 0)::DOUBLE AS pairs,
               (s.num_prefill_seqs + s.num_decode_seqs)::DOUBLE AS seqs,
               (coalesce(list_sum(map_values(s.running_by_lane)), 0)
                 + coalesce(list_sum(map_values(s.waiting_by_lane)), 0))::DOUBLE AS "left"
        FROM steps s LEFT JOIN ctx USING (run_id, step_id)
        WHERE s.run_id IN ({marks}) AND s.start_time BETWEEN ? AND ?
        ORDER BY s.run_id, s.step_id""", [*run_ids, lo, until, *run_ids, lo, until]).fetchnumpy()
    if len(cols["step_id"]) == 0:
        return StepSamples(np.zeros((0, len(FEATURES))), np.zeros(0), group=group)
    runs = np.asarray(cols["run_id"])
    step_id, start, end, prefill, decode, ctx, seqs, pairs, left = (
        np.asarray(cols[k], dtype=np.float64)
        for k in ("step_id", "start", "end", "prefill", "decode", "ctx", "seqs", "pairs",
                  "left"))
    ran = (prefill + decode) > 0
    X = np.column_stack([np.ones(len(step_id)), prefill, decode, ctx, seqs, pairs,
                         prefill > 0])[ran]
    nxt = (runs[1:] == runs[:-1]) & (step_id[1:] == step_id[:-1] + 1) & (left[:-1] > 0)
    gaps = (start[1:] - end[:-1])[nxt & ran[:-1]]
    return StepSamples(X, (end - start)[ran], np.maximum(gaps, 0.0), group)


def read_window(con, since: float | None, until: float | None) -> Window:
    """Raises ValueError (an empty window, a trace without steps) with what to do."""
    checked_window(since, until)
    requests = read_requests(con, since, until)
    if not requests:
        shown = " .. ".join("open" if t is None else clock(t, date=True) for t in (since, until))
        raise ValueError(f"no request arrived in the window ({shown}) that has ended: widen"
                         " --since/--until (batchpilot trace summary shows the span"
                         " recorded)")
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.run_id] = counts.get(r.run_id, 0) + 1
    run_id = max(counts, key=lambda k: counts[k])
    notes = []
    if len(counts) > 1:
        notes.append(f"the window spans {len(counts)} server runs; replaying the"
                     f" {counts[run_id]} requests of run {run_id} (the most)")
        requests = [r for r in requests if r.run_id == run_id]
    lo = requests[0].arrival_time  # (arrival order; >= since)
    last_end = max(r.finished_time or r.arrival_time for r in requests)
    hi = last_end if until is None else min(until, last_end)
    model, device, settings = _run(con, run_id)
    same = [row[0] for row in _rows(con, "SELECT run_id, settings FROM runs WHERE model = ?",
                                    [model]) if _run(con, row[0])[1] == device] or [run_id]
    group = f"model={model or '?'} device={device or 'unrecorded'}"
    refit = _law_in_force(con, run_id, lo) if settings.get("step_law") else None
    if refit is not None:
        notes.append(f"steps sized from target_step_ms={settings.get('target_step_ms')} by"
                     f" the step law the server had refitted from served steps at"
                     f" {refit[0]:.0f} ({refit[1]}), in every replay (it may refit again),"
                     f" {POLICY_NOTE}")
    elif settings.get("step_law"):
        notes.append(f"steps sized from target_step_ms={settings.get('target_step_ms')} by"
                     f" the server's start-up step law {settings['step_law']}"
                     f" (engine/scheduling/step_time.py), in every replay, {POLICY_NOTE}")
    facts = _facts(con, run_id, lo, last_end)
    return Window(lo, hi, model, device, settings, requests, facts,
                  read_itl(con, run_id, lo, last_end), read_samples(con, same, last_end, group),
                  notes, law_refit=refit[1] if refit is not None else None,
                  changes=_changes_up_to(con, run_id, facts.config_version))


def _changes_up_to(con, run_id: str, version: int) -> list[dict[str, list[Any]]]:
    """The run's config versions' diffs up to `version`, oldest first (audit rows, such as
    a step law refit or a drain, are not versions)."""
    rows = _rows(con, "SELECT source, change FROM config_changes WHERE run_id = ? AND"
                 " version <= ? ORDER BY version, time", [run_id, version])
    return [json.loads(change) for source, change in rows
            if is_config_version(source) and change not in (None, "", "{}")]


def _law_in_force(con, run_id: str, at: float) -> tuple[float, dict[str, Any]] | None:
    """(time, law) of the run's last online refit of its step law before `at`."""
    rows = _rows(con, "SELECT time, change FROM config_changes WHERE run_id = ? AND"
                 " source = ? AND time <= ? ORDER BY time DESC LIMIT 1",
                 [run_id, LAW_REFIT_SOURCE, at])
    if not rows:
        return None
    try:
        return rows[0][0], json.loads(rows[0][1])["step_law"][1]
    except (ValueError, KeyError, IndexError, TypeError):
        return None  # a row this reader cannot read: the start-up law, as before
