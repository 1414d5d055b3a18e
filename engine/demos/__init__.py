"""Runnable demos: `python -m engine.demos.chat` (the offline API on the bundled model) and
`python -m engine.demos.replay` (the Azure trace through the scheduler, simulated)."""
