"""What the engine raises when one of its own invariants breaks: a bug, never an operator's
doing. The scheduler (engine/scheduling) and the lanes (engine/lanes) raise it, so it lives
below both; it raises, never asserts, so `python -O` keeps every check."""

from __future__ import annotations


class SchedulerInvariantError(RuntimeError):
    """The scheduler broke one of its own invariants: a bug, never an operator's doing."""
