"""batchpilot's engine: requests, lanes, admission, KV blocks, scheduler, model execution.

One folder per owner, each `__init__.py` saying what it owns and may import: config/,
lanes/ (queues, tenants, admission), scheduling/, kv/, calibration/ (the step-cost law),
execution/ (model runner, sampler), output/ (detokenizer, outputs), models/, structured/,
sim/, demos/. The root keeps the engine (`engine.py`), the request (`request.py`), the
records that cross layers (`records.py`, `logprobs.py`, `errors.py`), what a step reports
(`reports.py`), a failed step's containment (`fault_isolation.py`) and the offline API
(`llm.py`). Calls go down only; tests/test_import_graph.py holds the imports to that.

`LLM` and `RequestOutput` are imported lazily: the scheduler core needs no torch.
"""

from __future__ import annotations

from typing import Any

from engine.request import RequestStatus, SamplingParams

__all__ = ["LLM", "RequestOutput", "RequestStatus", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "RequestOutput":
        from engine.output.processor import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
