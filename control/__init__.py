"""batchpilot's serving process and its tools, one subpackage per owner.

A request enters at `api/routes.py` (uvicorn's event loop), is tokenized on the tokenizer
thread (`serve/state.py`), crosses to the engine thread as a `Submission`
(`serve/streams.py`), and its tokens come back as `StreamEvent`s streamed by `api/`.

    edge/       (serve --edge) its own process in front: validates bodies, forwards the rest
                to the server's Unix socket, streams the answers back
    api/        the OpenAI data plane and probes; event loop; never blocks
    serve/      the process: settings, start-up, uvicorn and draining, the "engine-loop"
                thread (the only one that touches the Engine), the tokenizer thread
    admin/      the control API and config store: event loop; changes installed on the
                engine thread between steps; the YAML watcher
    metrics/    Prometheus: fed on the "metrics" thread from the engine's step records
    trace/      DuckDB trace: the "trace-writer" thread, and the read API (event loop)
    cli/        the `batchpilot` command: its own process, talks to a server over HTTP
    loadtest/, checklist/   client-side tools: their own processes
    whatif/     predictions from the trace: the CLI's process, or the server's one
                prediction process (POST /v1/whatif never runs on the event loop)
    fleet/      `batchpilot fleet`: replicas of the serving app on Ray Serve behind one
                ingress that routes by prefix/tenant affinity and load
"""
