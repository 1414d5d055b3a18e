"""What-if: predict what a live config change would do, from the trace, before it goes live
(docs/whatif.md). The parts, each importable on its own:

    calibrate.calibrate(samples) -> StepTimeModel   # step-time law fitted to the steps
    window.read_window(con, since, until) -> Window # the requests and steps of a window
    configs.recorded_config / propose               # the config it ran under, and patches
    replay.replay(window, config, model) -> Prediction  # lean.ReplayEngine's light step
    compare.compare(window, model, recorded, proposals, slo) -> dict (JSON-ready)
    run.predict(window, base, proposals) -> dict    # all of the above

`cli.py` is `batchpilot whatif`; `routes.py` is `POST /v1/whatif`.
"""
