"""What a client sees of the engine's steps: the output processor (`processor.py`) turns
each `StepOutput`'s per-request deltas into `RequestOutput`s (text, finish reason, stop
strings, logprobs, metrics), with an incremental detokenizer per request
(`detokenizer.py`). It owns per-request text state only, on the engine thread, and ends a
request that hit a stop string through `Engine.abort` called by its caller. It may import
`engine.request`, `engine.records` and `engine.logprobs`; never the scheduler.
"""
