"""The server's state on `app.state.serving`: settings, the engine loop, the tokenizer
thread, the grammar compile slots, and the count of generation requests in flight (read by
graceful shutdown).

Touched only from the event loop, except `encode_*`, which run on the one tokenizer thread
(tokenizing a long prompt or rendering a chat template must not block the event loop).
Grammar compiles run on their own threads, at most `limits.max_grammar_compiles` at once
(engine/structured/compile_slots.py): a schema that compiles for minutes must not hold the
tokenizer thread that every request needs (control/api/structured.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from prometheus_client.core import GaugeMetricFamily

from control.admin.auth import Token
from control.admin.config_store import ConfigStore
from control.api.delivery import DeliveryProbe
from control.api.errors import APIError
from control.metrics.observer import Observer
from control.metrics.registry import ServingMetrics, counter_family
from control.serve.bootstrap import EngineParts
from control.serve.engine_loop import AsyncEngine
from control.serve.settings import ServeSettings
from control.trace.writer import TraceWriter
from engine.structured.compile_slots import CompileSlots

T = TypeVar("T")


@dataclass
class ServerState:
    settings: ServeSettings
    engine: AsyncEngine
    metrics: ServingMetrics | None = None
    delivery: DeliveryProbe | None = None  # the way from a step to the client, measured
    observer: Observer | None = None
    trace: TraceWriter | None = None  # None: tracing is off
    config_store: ConfigStore | None = None  # None: the control API is off
    control_tokens: tuple[Token, ...] = ()  # none: the API is open, on loopback only
    config_watcher: Any = None  # a ConfigWatcher while the --config file is watched
    started: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0  # generation requests admitted and not yet answered
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="tokenizer"))
    grammar_compiles: CompileSlots = field(init=False)  # response_format / guided_json

    def __post_init__(self) -> None:
        self.grammar_compiles = CompileSlots(self.settings.limits.max_grammar_compiles)
        if self.metrics is not None:
            self.metrics.add_source(lambda: _compile_families(self.grammar_compiles,
                                                              self.metrics.model))

    @property
    def parts(self) -> EngineParts | None:
        return self.engine.parts

    @property
    def model_names(self) -> set[str]:
        return {self.settings.model_name, self.settings.model}

    def finished_one(self) -> None:
        self.inflight -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run_tokenizer(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ---- on the tokenizer thread -------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int], add_special_tokens: bool = True,
                      ) -> tuple[str | None, list[int]]:
        """(text, token ids) of a completions prompt: text (with the tokenizer's special
        tokens, e.g. a BOS, unless `add_special_tokens` is false: vLLM's default and flag),
        or token ids as sent, checked against the vocabulary (an id out of range would
        fail the whole batch's step)."""
        parts = self._parts()
        if isinstance(prompt, str):
            return prompt, parts.frontend_tokenizer.encode(
                prompt, add_special_tokens=add_special_tokens)
        bad = [t for t in prompt if not 0 <= t < parts.vocab_size]
        if bad:
            raise APIError(400, f"prompt token ids must be in 0..{parts.vocab_size - 1};"
                           f" got {bad[:5]}", code="invalid_value", param="prompt")
        return None, list(prompt)

    def encode_chat(self, messages: list[dict[str, str]], add_special_tokens: bool = False,
                    ) -> tuple[str, list[int]]:
        """The conversation through the chat template, then its token ids: the template
        writes its own special tokens, so the tokenizer adds none unless asked (vLLM's)."""
        tokenizer = self._parts().frontend_tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model has no chat template; use /v1/completions",
                           code="no_chat_template", param="messages")
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        except Exception as exc:  # the template rejects this conversation (e.g. roles)
            raise APIError(400, f"the chat template rejected the messages: {exc}",
                           code="invalid_value", param="messages") from None
        return text, tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def _parts(self) -> EngineParts:
        if self.engine.parts is None:
            raise APIError(503, "the model is loading", code="loading")
        return self.engine.parts


def get_state(request: Request) -> ServerState:
    return request.app.state.serving


def _compile_families(slots: CompileSlots, model: str) -> Iterator[Any]:
    counts = slots.counts
    running = GaugeMetricFamily("batchpilot_grammar_compiles_running",
                                "Grammar compiles running, abandoned ones (past their"
                                " timeout, uninterruptible) included.", labels=["model"])
    running.add_metric([model], slots.running)
    yield running
    yield counter_family(
        "batchpilot_grammar_compiles_total", "Grammar compiles by outcome: started, joined"
        " (the same schema already compiling), refused_busy (429), timed_out (400).",
        ["model", "outcome"],
        {(model, name): getattr(counts, name)
         for name in ("started", "joined", "refused_busy", "timed_out")})
