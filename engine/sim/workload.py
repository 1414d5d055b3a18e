"""Workloads from the bundled Azure LLM inference trace (2023, conversation sample).

The trace gives arrival times and prompt/output token counts, not text: a replay builds
prompts of the given lengths and forces the given output lengths (ignore_eos), as the
trace's authors did. Lengths and times are scaled for a small model; every report says
by how much (`TraceScale.describe()`).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from engine.request import SamplingParams

AZURE_CONV_TRACE = Path(__file__).parent / "data" / "azure_llm_2023_conv.csv"


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds after the first request of the trace
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TraceScale:
    prompt_div: float = 1.0  # prompt lengths divided by this
    output_div: float = 1.0  # output lengths divided by this
    time_div: float = 1.0  # inter-arrival times divided by this (> 1 is faster)
    min_tokens: int = 1  # lengths floor after scaling

    def describe(self) -> str:
        return (f"prompt lengths / {self.prompt_div:g}, output lengths / {self.output_div:g}"
                f" (at least {self.min_tokens} each), arrival times / {self.time_div:g}")


def load_trace(path: Path = AZURE_CONV_TRACE, limit: int | None = None,
               scale: TraceScale = TraceScale()) -> list[TraceRequest]:
    """The first `limit` requests of a trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)."""
    out: list[TraceRequest] = []
    with open(path, newline="") as f:
        start = None
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26]).timestamp()
            start = ts if start is None else start
            out.append(TraceRequest(
                arrival_s=(ts - start) / scale.time_div,
                prompt_tokens=max(scale.min_tokens,
                                  round(int(row["ContextTokens"]) / scale.prompt_div)),
                output_tokens=max(scale.min_tokens,
                                  round(int(row["GeneratedTokens"]) / scale.output_div)),
            ))
            if limit is not None and len(out) >= limit:
                break
    return out


def synthetic_prompt(num_tokens: int, rng: random.Random, vocab: range = range(3, 32000),
                     ) -> list[int]:
    return [rng.choice(vocab) for _ in range(num_tokens)]


def forced_params(output_tokens: int) -> SamplingParams:
    """Exactly `output_tokens` tokens: the trace's length, whatever the model samples."""
    return SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)


def iter_due(requests: list[TraceRequest], start_index: int, elapsed_s: float,
             ) -> Iterator[tuple[int, TraceRequest]]:
    """Requests from `start_index` on whose arrival time has come."""
    i = start_index
    while i < len(requests) and requests[i].arrival_s <= elapsed_s + 1e-6:  # float slack
        yield i, requests[i]
        i += 1
