"""The trace writer: engine records -> DuckDB, batched, on its own thread.

    engine thread                         writer thread ("trace-writer")
    -------------                         ------------------------------
    submit(step records)  --bounded-->    rows into per-table buffers (WaitTracker adds the
      full: drop, count,     queue        wait rows); every flush_interval_s or max_batch
      never wait                          rows: one transaction, one Arrow batch per table

A failed flush rolls back, counts its rows as dropped and is logged; serving goes on.
Reads (control/trace/queries.py) use their own cursors on the same database, so the
server answers trace queries while it writes: DuckDB lets no other process open the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from control.serve.bursts import drain
from control.trace import rows
from control.trace.retention import Retention, apply_retention
from control.trace.schema import (
    ADMISSIONS,
    CONFIG_CHANGES,
    KV_SNAPSHOTS,
    REQUEST_IDS,
    REQUESTS,
    RUNS,
    SCHEMA_VERSION,
    STEPS,
    TABLES,
    create_schema,
)
from control.trace.store import check_trace_db
from control.trace.waits import WaitTracker
from engine.records import AdmissionDecision, RequestRecord, StepRecord

log = logging.getLogger("batchpilot.trace")


@dataclass(frozen=True)
class TraceSettings:
    path: str
    max_queue: int = 20_000  # queued items (one per step) before records are dropped
    flush_interval_s: float = 0.5  # a record is committed at most this long after its step
    max_batch_rows: int = 512  # rows converted to Arrow at once (bounds each GIL hold)
    kv_snapshot_every: int = 50  # steps; plus one at every watermark crossing
    retention: Retention = field(default_factory=Retention)


@dataclass(frozen=True)
class WriterStats:
    written: dict[str, int]  # rows committed, by table
    dropped: dict[str, int]  # rows lost, by table: queue full or a failed flush
    errors: int  # failed flushes
    last_error: str
    queue_depth: int
    deleted: int  # rows removed by retention


@dataclass(frozen=True)
class StepItem:
    """One step's records, as the engine thread hands them over (immutable from then on)."""

    record: StepRecord | None
    finished: list[RequestRecord]
    admissions: list[AdmissionDecision]
    kv_row: tuple | None = None


class TraceWriter:
    def __init__(self, settings: TraceSettings, run_id: str, model: str,
                 run_settings: dict[str, Any] | None = None):
        self.settings = settings
        self.run_id = run_id
        self.model = model
        self._run_settings = run_settings or {}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._buffers: dict[str, list[tuple]] = {name: [] for name in TABLES}
        self._waits = WaitTracker()
        self._seqs: dict[str, int] = {}  # request id -> its number, until the request ends
        self._next_seq = 0
        self._now = 0.0  # engine clock of the step being added
        self._written: Counter[str] = Counter()
        self._dropped_full: Counter[str] = Counter()  # queue full: the submitting thread
        self._dropped_failed: Counter[str] = Counter()  # failed flushes: the writer thread
        self._errors = 0
        self._last_error = ""
        self._deleted = 0
        self._con: duckdb.DuckDBPyConnection | None = None
        self._read_root: duckdb.DuckDBPyConnection | None = None
        self._read_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # sync and stop wake the writer before its interval

    # ---- life (the server's thread) ---------------------------------------------------
    def open(self) -> TraceWriter:
        """Open (or create) the database; raises ValueError when it cannot be used."""
        path = self.settings.path
        check_trace_db(path)
        try:
            self._con = duckdb.connect(path)
        except duckdb.Error as exc:
            raise ValueError(f"trace DB {path!r} cannot be opened: {exc}") from None
        # The server's cores belong to serving: one DuckDB thread, bounded memory.
        self._con.execute("SET threads = 1")
        self._con.execute("SET memory_limit = '1GB'")
        create_schema(self._con)
        self._buffers[RUNS.name].append((self.run_id, time.time(), self.model, SCHEMA_VERSION,
                                         json.dumps(self._run_settings, default=str)))
        self._flush()
        self._read_root = self._con.cursor()
        return self

    def start(self) -> TraceWriter:
        if self._con is None:
            self.open()
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then close."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(("stop", None))
            self._wake.set()
            self._thread.join(timeout_s)
        if self._con is not None and (self._thread is None or not self._thread.is_alive()):
            self._con.close()
            self._con = None

    # ---- any thread ------------------------------------------------------------------
    def submit(self, item: StepItem) -> bool:
        """Queue one step's records; when the queue is full, drop and count them."""
        if self._queue.qsize() >= self.settings.max_queue:
            self._count_dropped(item)
            return False
        self._queue.put(("step", item))
        return True

    def submit_config_change(self, time_s: float, version: int, source: str, actor: str,
                             change: dict[str, Any], note: str = "") -> bool:
        row = (self.run_id, time_s, version, source, actor, json.dumps(change, default=str),
               note)
        if self._queue.qsize() >= self.settings.max_queue:
            self._dropped_full[CONFIG_CHANGES.name] += 1
            return False
        self._queue.put(("config", row))
        return True

    def note_run(self, **settings: Any) -> None:
        """Add to this run's `runs.settings` (what is known only once the model loaded,
        e.g. the step law fitted at start-up); written with the next flush."""
        self._queue.put(("run", settings))  # never dropped: one small row update
        self._wake.set()

    def sync(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything submitted before this call is committed (or dropped)."""
        if self._thread is None or not self._thread.is_alive():
            return False
        done = threading.Event()
        self._queue.put(("sync", done))  # never dropped: it carries no records
        self._wake.set()
        return done.wait(timeout_s)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for one reader (DuckDB connections are not shared)."""
        if self._read_root is None:
            raise RuntimeError("the trace database is not open")
        with self._read_lock:
            return self._read_root.cursor()

    def stats(self) -> WriterStats:
        dropped = self._dropped_full + self._dropped_failed
        return WriterStats(dict(self._written), dict(dropped), self._errors,
                           self._last_error, self._queue.qsize(), self._deleted)

    # ---- the writer thread -------------------------------------------------------------
    def _run(self) -> None:
        """Wake every flush interval (or when asked), take everything queued, write it.

        Working in bursts, not per step, keeps this thread off the GIL while the engine
        steps: one hand-over per flush instead of one per step."""
        interval = self.settings.flush_interval_s
        next_retention = time.monotonic() + self.settings.retention.check_every_s
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            markers = []
            for kind, payload in drain(self._queue):
                if kind == "step":
                    self._add_step(payload)
                elif kind == "config":
                    self._buffers[CONFIG_CHANGES.name].append(payload)
                elif kind == "run":
                    self._update_run(payload)
                else:
                    markers.append((kind, payload))
                    if kind == "stop":
                        break
                if any(len(b) >= self.settings.max_batch_rows for b in self._buffers.values()):
                    self._flush()
            self._flush()
            for kind, payload in markers:
                if kind == "sync":
                    payload.set()
            if any(kind == "stop" for kind, _ in markers):
                return
            now = time.monotonic()
            if now >= next_retention:
                self._retain()
                next_retention = now + self.settings.retention.check_every_s

    def _add_step(self, item: StepItem) -> None:
        b, run = self._buffers, self.run_id
        for decision in item.admissions:
            b[ADMISSIONS.name].append(rows.admission_row(run, decision))
            self._waits.on_admission(decision)
        if item.record is not None:
            self._now = item.record.start_time
            b[STEPS.name].append(rows.step_row(run, item.record, self._seq))
            for wait in self._waits.on_step(item.record):
                b[ADMISSIONS.name].append(rows.wait_row(run, wait))
        for rec in item.finished:
            wait, preempted_s, reasons = self._waits.on_finished(rec)
            if wait is not None:
                b[ADMISSIONS.name].append(rows.wait_row(run, wait))
            b[REQUESTS.name].append(rows.request_row(run, self.model, rec, preempted_s, reasons))
            self._seqs.pop(rec.request_id, None)  # it will run in no later step
        if item.kv_row is not None:
            b[KV_SNAPSHOTS.name].append(item.kv_row)

    def _update_run(self, settings: dict[str, Any]) -> None:
        self._run_settings = {**self._run_settings, **settings}
        self._con.execute("UPDATE runs SET settings = ? WHERE run_id = ?",
                          [json.dumps(self._run_settings, default=str), self.run_id])

    def _seq(self, request_id: str) -> int:
        seq = self._seqs.get(request_id)
        if seq is None:
            seq = self._seqs[request_id] = self._next_seq
            self._next_seq += 1
            self._buffers[REQUEST_IDS.name].append((self.run_id, seq, request_id, self._now))
        return seq

    def _flush(self) -> None:
        pending = {name: rows_ for name, rows_ in self._buffers.items() if rows_}
        if not pending:
            return
        self._buffers = {name: [] for name in TABLES}
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            for name, table_rows in pending.items():
                table = TABLES[name]
                step = self.settings.max_batch_rows
                for i in range(0, len(table_rows), step):
                    _insert(con, table.name, table.arrow_schema(), table_rows[i:i + step])
            con.execute("COMMIT")
        except Exception as exc:  # disk full, a bad value: lose this batch, keep serving
            with contextlib.suppress(Exception):  # no transaction open, or the DB is gone
                con.execute("ROLLBACK")
            self._errors += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            for name, table_rows in pending.items():
                self._dropped_failed[name] += len(table_rows)
            log.error("trace flush failed (%d rows dropped): %s",
                      sum(map(len, pending.values())), self._last_error)
            return
        for name, table_rows in pending.items():
            self._written[name] += len(table_rows)

    def _retain(self) -> None:
        try:
            self._deleted += apply_retention(self._con, self.settings.path,
                                             self.settings.retention, time.time())
        except Exception as exc:
            self._errors += 1
            self._last_error = f"retention: {type(exc).__name__}: {exc}"
            log.error("trace retention failed: %s", self._last_error)
        self._waits.purge(time.time())

    def _count_dropped(self, item: StepItem) -> None:
        d = self._dropped_full
        d[STEPS.name] += item.record is not None
        d[REQUESTS.name] += len(item.finished)
        d[ADMISSIONS.name] += len(item.admissions)
        d[KV_SNAPSHOTS.name] += item.kv_row is not None


def _insert(con: duckdb.DuckDBPyConnection, table: str, schema: pa.Schema,
            table_rows: list[tuple]) -> None:
    columns = list(zip(*table_rows, strict=True))
    batch = pa.Table.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema)
    con.register("_batch", batch)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM _batch")
    finally:  # after a failed insert the transaction is aborted and this may fail too
        with contextlib.suppress(Exception):
            con.unregister("_batch")
