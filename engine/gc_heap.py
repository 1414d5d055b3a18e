"""Python's cyclic garbage collector kept off the objects that live as long as the process.

A full (generation 2) collection walks every object the collector tracks, with the GIL
held: after loading SmolLM2 with torch and transformers that is ~360,000 objects, and one
pass took 126 ms on the 2-core Xeon, a stall of whatever step was running (one came
during an offline run of 64 requests that takes ~2.8 s). Almost all of them are the
modules, the model and the tokenizer, which never become garbage. `gc.freeze()` moves
them to the permanent generation, so later collections walk only what serving allocates
(vLLM freezes its heap after start-up for the same reason).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_heap() -> None:
    """For a server, once start-up is done: collect what start-up left behind, then freeze
    everything still tracked for the life of the process."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """For one offline run in someone else's process (LLM.generate): the heap as it is
    frozen for the run and thawed after it, unless the process had frozen objects of its
    own before, which stay as they were (only collections are skipped: refcounting still
    frees what the run drops)."""
    already = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not already:
            gc.unfreeze()
