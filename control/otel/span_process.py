"""The spans' heavy half in a process of its own. Building each kept request's spans and
encoding them for OTLP is Python, and in the server's process the GIL puts all of it on
the engine thread's clock: bench.trace_overhead measured ~0.4 ms a step at ~10 spans a
step (+11% on its GPU-like engine), with the engine thread's own CPU time unchanged.

    server: "otel-spans" thread                      child: python -m control.otel.span_process
    phases from the steps, keep or not  --pipe-->    SpanBuilder.build -> SpanExport
    (a batch of (record, phases) per                 (OTLP over HTTP or gRPC)
     100 ms wake-up, pickled once)      <--pipe--    export counters, after each batch
                                                     and every COUNTS_EVERY_S

The child runs at a lower priority (CHILD_NICE). A child that died or does not read is
never waited on: the batch is counted as dropped (`export_failed`, per request's spans not
yet built: one per request) and the server goes on. `InProcessSpans` is the same interface
in the server's own process, for an exporter object that cannot cross a process boundary
(a test's in-memory exporter).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from control.otel.export import DeliveredTraces, SpanExport, resource_of
from control.otel.settings import OtelSettings
from control.otel.spans import SpanBuilder

log = logging.getLogger("batchpilot.otel")
COUNTS_EVERY_S = 0.5  # the child's counters reach /metrics at least this often
# The child lowers its own priority by this much: on a machine with no core to spare the
# scheduler then gives the server's threads the CPU first, and the child exports in what
# is left (batches it cannot take in time are dropped and counted, as for a dead child).
# bench.trace_overhead (GPU-like engine, every request exported, 12 rounds, 2 cores): +4.2%
# a step at the default priority (one run), +2.2% and +3.8% at 10 (two runs): a gain of a
# point or two, within the run-to-run spread.
CHILD_NICE = 10
STOP_SLACK_S = 2.0  # a stopping child's last counts: its export time plus this
Kept = list[tuple[Any, Any]]  # [(RequestRecord, RequestPhases | None)]


def zero_counts() -> dict[str, int]:
    return {"exported": 0, "queue_full": 0, "export_failed": 0}


class InProcessSpans:
    """Build and export in this process: the child's half, or the server's own when the
    caller gives an exporter object (None: the settings' OTLP exporter)."""

    def __init__(self, settings: OtelSettings, exporter: SpanExporter | None = None,
                 on_delivered: Callable[[list[str]], None] | None = None):
        """`on_delivered`: where the delivered trace ids go (the child: to its report);
        without one they are kept here, in `delivered`."""
        self.builder = SpanBuilder(resource_of(settings), settings.replica)
        self.delivered = DeliveredTraces()
        self.export = SpanExport(settings, exporter, on_delivered or self.delivered.add)

    @property
    def counts(self) -> dict[str, int]:
        return self.export.counts

    def send(self, kept: Kept) -> None:
        for rec, phases in kept:
            for span in self.builder.build(rec, phases):
                self.export.put(span)

    def stop(self, timeout_s: float) -> None:
        self.export.stop(timeout_s)


class SpanProcess:
    """Build and export in a child process (`python -m control.otel.span_process`, two
    pipes), started by `start` or at the first batch. A plain subprocess, not
    multiprocessing: spawn would import the server's main module again in the child
    (a Ray worker's, a user's script), and fork would copy the server's threads' locks."""

    def __init__(self, settings: OtelSettings):
        self.settings = settings
        self._counts = zero_counts()
        self.delivered = DeliveredTraces()  # as the child reports them
        self._lost = 0  # requests whose batch never reached the child
        self._lock = threading.Lock()  # the span thread sends, a scrape reads counters
        self._proc: subprocess.Popen | None = None
        self._out: Connection | None = None  # to the child
        self._in: Connection | None = None  # from it

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            self._read_counts()
            return {**self._counts,
                    "export_failed": self._counts["export_failed"] + self._lost}

    def start(self, wait_s: float = 0.0) -> None:
        """Start the child now; with `wait_s`, until it is ready to export (its first
        counters arrive: ~1 s of imports) or wait_s passed."""
        with self._lock:
            if self._proc is None:
                self._start()
            with contextlib.suppress(OSError, EOFError, ValueError):
                if wait_s and self._in.poll(wait_s):
                    self._take(self._in.recv())

    def send(self, kept: Kept) -> None:
        """From the span thread; never raises, never waits on a child that is gone."""
        with self._lock:
            self._read_counts()
            if not kept:
                return
            if self._proc is None:
                self._start()
            try:
                if self._proc.poll() is not None:
                    raise BrokenPipeError(f"it exited with {self._proc.returncode}")
                self._out.send(kept)
            except (OSError, EOFError, ValueError) as exc:
                if not self._lost:
                    log.warning("the OpenTelemetry span process is gone (%s); spans are"
                                " dropped and counted", exc)
                self._lost += len(kept)

    def stop(self, timeout_s: float) -> None:
        """The child exports what it has (at most timeout_s), reports, and exits."""
        with self._lock:
            if self._proc is None:
                return
            with contextlib.suppress(OSError, EOFError, ValueError):
                self._out.send(float(timeout_s))  # stop: export for at most this long
                # its last counts come once its export ended (or gave up at timeout_s)
                deadline = time.monotonic() + timeout_s + STOP_SLACK_S
                while self._in.poll(max(0.0, deadline - time.monotonic())):
                    self._take(self._in.recv())
            try:
                self._proc.wait(1.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5.0)
            self._out.close()
            self._in.close()
            self._proc = None

    def _start(self) -> None:
        child_reads, parent_writes = os.pipe()  # (read end, write end)
        parent_reads, child_writes = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "control.otel.span_process", str(child_reads),
             str(child_writes)], pass_fds=(child_reads, child_writes), env=env,
            stdin=subprocess.DEVNULL)
        os.close(child_reads)
        os.close(child_writes)
        self._out = Connection(parent_writes, readable=False)
        self._in = Connection(parent_reads, writable=False)
        self._out.send(self.settings)

    def _read_counts(self) -> None:
        """Under the lock: the child's latest counters."""
        if self._in is None:
            return
        with contextlib.suppress(OSError, EOFError, ValueError):
            while self._in.poll():
                self._take(self._in.recv())

    def _take(self, report: dict) -> None:
        """A report of the child: its counters, and the trace ids it delivered since the
        one before"""
        self.delivered.add(report.pop("delivered", ()))
        self._counts = report


def child_main(inbox: Connection, outbox: Connection) -> None:
    """The child's loop: its settings, then batches in, spans out, counters back; ends on
    a stop (a float: seconds to finish exporting in) or when the server's end of the
    pipe closes (the server died: nothing more will come)."""
    with contextlib.suppress(OSError):  # a platform that refuses: the default priority
        os.nice(CHILD_NICE)
    delivered: queue.SimpleQueue[list[str]] = queue.SimpleQueue()  # from the export thread
    spans = InProcessSpans(inbox.recv(), on_delivered=delivered.put)
    last = dict(spans.counts)
    with contextlib.suppress(OSError):
        outbox.send(dict(last))  # ready: the server's start(wait_s) returns
    stop_s = 5.0
    while True:
        try:
            batch = inbox.recv() if inbox.poll(COUNTS_EVERY_S) else []
        except (OSError, EOFError):
            break
        if isinstance(batch, float):
            stop_s = batch
            break
        spans.send(batch)
        if spans.counts != last:  # (a delivery moves "exported")
            last = dict(spans.counts)
            try:
                outbox.send({**last, "delivered": _taken(delivered)})
            except OSError:
                break
    spans.stop(stop_s)
    with contextlib.suppress(OSError):
        outbox.send({**spans.counts, "delivered": _taken(delivered)})


def _taken(delivered: queue.SimpleQueue) -> list[str]:
    """Every trace id put on `delivered` so far, in order."""
    ids: list[str] = []
    with contextlib.suppress(queue.Empty):
        while True:
            ids += delivered.get_nowait()
    return ids


if __name__ == "__main__":
    child_main(Connection(int(sys.argv[1]), writable=False),
               Connection(int(sys.argv[2]), readable=False))
