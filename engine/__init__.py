"""batchpilot's engine: requests, lanes, admission, KV blocks, scheduler, model execution.

`LLM` (the offline API) is imported lazily: the scheduler core needs no torch.
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
        from engine.output_processor import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
