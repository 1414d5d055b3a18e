"""The span process (control/otel/span_process.py) as the server uses it: it starts and
says it is ready; a child that died costs its batches as counted drops and never blocks
the caller; a child whose server went away exits by itself; the child yields the CPU to
the server (a lower priority). (Spans reaching a real OTLP receiver through it:
test_otlp_export.py, whose servers all export this way.)"""

from __future__ import annotations

import os
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from fixtures.http_stub import QuietHandler
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from test_span_phases import LINK, finished

from control.otel.export import BATCH_SPANS, SpanExport
from control.otel.settings import OtelSettings
from control.otel.span_process import CHILD_NICE, STOP_SLACK_S, SpanProcess

NOBODY = OtelSettings("http://127.0.0.1:9/v1/traces")  # the discard port: nothing listens


def test_a_dead_span_process_costs_counted_drops_and_never_blocks():
    spans = SpanProcess(NOBODY)
    spans.start(wait_s=30)
    assert spans.counts == {"exported": 0, "queue_full": 0, "export_failed": 0}
    spans._proc.kill()
    spans._proc.wait(10)
    started = time.monotonic()
    spans.send([("record", None), ("record", None)])  # two requests' batch, never built
    spans.send([("record", None)])
    assert time.monotonic() - started < 1.0
    assert spans.counts["export_failed"] == 3
    spans.stop(1.0)  # returns at once: nothing to wait for
    assert time.monotonic() - started < 5.0


def test_a_span_process_whose_server_went_away_exits():
    spans = SpanProcess(NOBODY)
    spans.start(wait_s=30)
    child = spans._proc
    spans._out.close()  # as when the server process dies: the pipe's write end closes
    child.wait(15)  # its export stops within its own 5 s, then it exits
    assert child.returncode == 0
    spans._in.close()


def nice_of(pid: int) -> int:
    """The nice value of a live process (field 19 of /proc/PID/stat, after the comm)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def test_the_span_process_runs_below_the_server_priority():
    spans = SpanProcess(NOBODY)
    assert CHILD_NICE > 0
    spans.start(wait_s=30)  # ready: the child has set its priority before it says so
    try:
        assert nice_of(spans._proc.pid) == min(19, os.nice(0) + CHILD_NICE)
    finally:
        spans.stop(1.0)


class Collector(SpanExporter):
    """Takes batches while `up`, refuses them otherwise."""

    def __init__(self):
        self.up = True

    def export(self, spans):
        return SpanExportResult.SUCCESS if self.up else SpanExportResult.FAILURE

    def shutdown(self):
        """Nothing to release: it holds no connection."""


def test_only_batches_the_collector_took_are_reported_delivered():
    """What exemplars rest on (control/metrics/core.py Histogram.shows): the trace ids of an
    accepted batch reach on_delivered, those of a refused one never do; an export without
    the callback (the fleet ingress's) hands them to nobody and keeps none."""
    collector, delivered = Collector(), []
    export = SpanExport(NOBODY, collector, on_delivered=delivered.extend)
    tracer = TracerProvider().get_tracer("t")

    def send(n: int) -> list[str]:
        spans = [tracer.start_span(f"s{i}") for i in range(n)]
        for span in spans:
            span.end()
            export.put(span)
        return [f"{s.get_span_context().trace_id:032x}" for s in spans]

    taken = send(3)
    deadline = time.monotonic() + 10
    while export.counts["exported"] < 3:
        assert time.monotonic() < deadline, export.counts
        time.sleep(0.05)
    collector.up = False
    send(2)
    while export.counts["export_failed"] < 2:
        assert time.monotonic() < deadline, export.counts
        time.sleep(0.05)
    export.stop(1.0)
    assert delivered == taken


class _Takes(QuietHandler):
    """An OTLP/HTTP collector that takes every batch."""

    def do_POST(self):  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


# a full batch of one request's spans: the child exports it at once, not after a second
FULL_BATCH = [(finished("r", 1.0, (0.5,)), None)] * BATCH_SPANS


def test_the_counters_and_deliveries_reach_the_server_while_the_child_runs():
    """/metrics and the exemplars read what the child reports as it goes, not only what it
    says when the server stops."""
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _Takes)
    threading.Thread(target=collector.serve_forever, args=(0.05,), daemon=True).start()
    spans = SpanProcess(OtelSettings(f"http://127.0.0.1:{collector.server_address[1]}/v1/"
                                     "traces"))
    try:
        spans.start(wait_s=30)
        spans.send(FULL_BATCH)
        deadline = time.monotonic() + 10
        while spans.counts["exported"] < BATCH_SPANS:
            assert time.monotonic() < deadline, spans.counts
            time.sleep(0.05)
        assert LINK.trace_id in spans.delivered
    finally:
        spans.stop(1.0)
        collector.shutdown()
        collector.server_close()


def test_a_stopping_span_process_reports_within_the_stop_timeout():
    """A collector that never answers: the server's stop(t) gives the child t to export and
    returns once the child reports; it does not wait out the child's own 5 s export
    timeout (then the slack, then a kill: the last counts lost)."""
    with socket.socket() as held:  # listens, never accepts: an export hangs on it
        held.bind(("127.0.0.1", 0))
        held.listen(8)
        spans = SpanProcess(OtelSettings(f"http://127.0.0.1:{held.getsockname()[1]}/v1/traces"))
        spans.start(wait_s=30)
        spans.send(FULL_BATCH)
        started = time.monotonic()
        spans.stop(0.5)
        assert time.monotonic() - started < 0.5 + STOP_SLACK_S
