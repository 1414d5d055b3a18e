"""OpenTelemetry: a trace per request that continues the caller's, built from the same step
records as the DuckDB trace (docs/opentelemetry.md).

    context.py   W3C traceparent at the edge: the request's TraceLink (engine/request.py)
    phases.py    each request's phases from the step records (the span thread)
    spans.py     a finished request -> its SDK spans (GenAI attributes, batchpilot.*)
    feed.py      the span and export threads: sampling, bounded queues, OTLP, counters
    settings.py  OtelSettings (--otlp-* flags; cli_args.py adds them to serve and fleet)
"""
