"""The serving process and its threads.

    server.py       uvicorn under `batchpilot serve`, draining on SIGTERM
    settings.py     what `batchpilot serve` is told at start
    bootstrap.py    model, engine and output processor from the settings
    state.py        the server's state on the app, and the tokenizer thread
    engine_loop.py  the "engine-loop" thread: the only caller of the Engine
    loop_records.py what it publishes (LoopStats) and why it aborts (ABORT_REASONS)
    step_health.py  failed engine steps -> /readyz, and their logging
    streams.py      what crosses between the event loop and the engine thread
    bursts.py       the wake-and-drain pattern of the background threads
    run_all.py      `make run`: the server and the dashboard side by side
"""
