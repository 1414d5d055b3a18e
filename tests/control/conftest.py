"""Server tests: the tiny random-weight Llama behind the real app, in process (httpx over
ASGI, or uvicorn in a thread) or as a `batchpilot serve` subprocess on 127.0.0.1.

Shared helpers live in `serving_helpers.py`; this file puts that module on the import path
whatever pytest's import mode is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llama_dir):
    """The tiny model loaded once; every in-process engine shares its weights."""
    from engine.models import load_model

    return load_model(tiny_llama_dir)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The engine thread, uvicorn's loop and the test's client share the process: with
    torch's intra-op threads spinning on 2 cores, a step of the tiny model takes 10x longer
    (the server itself leaves a core to its event loop, see control/bootstrap.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
